"""A job's agent forked by the node's warm server (`cloudtrain.jobs.warm`) is the agent a cold
start makes: the same script gives the same facts and exit codes through a real server and two
real ranks; the node finds the job's processes by their environment (and not the client); a
request the server must not serve (other import-time variables, an environment too large for
its room) starts cold; and a local cluster's first job is warm (`up` started its servers),
its servers gone at `down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.jobs import warm
from cloudtrain.node import procs
from tests.integration.test_fork_start import SCRIPT, facts

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

FIND = """
import json, os, sys
from cloudtrain.node import procs
if __name__ == "__main__":
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()  # both ranks live while each looks
    found = procs.find_processes({"CLOUDTRAIN_JOB_ID": os.environ["CLOUDTRAIN_JOB_ID"]})
    lines = [open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
             for p in found]
    mine = open("/proc/self/environ", "rb").read()
    sys.stdout.write("FOUND " + json.dumps({"cmdlines": lines, "pid": os.getpid(),
                     "pids": found, "own": b"CLOUDTRAIN_JOB_ID=job-w" in mine}) + chr(10))
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node's folder deeper than a Unix socket's address holds (107 bytes), as under a long
    home or a shared file system: its server must serve all the same."""
    root = tmp_path / ("deep" * 25) / "node"
    root.mkdir(parents=True)
    assert len(os.fsencode(warm.folder(root) / "sock")) > 107
    return root


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    (work / "sibling.py").write_text("VALUE = 'next to the script'\n")
    (work / "find.py").write_text(FIND)
    return work


def job_env(root: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
            "CLOUDTRAIN_NODE_ROOT": str(root), "CLOUDTRAIN_JOB_ID": "job-w", **extra}  # fmt: skip


@pytest.fixture
def server(node: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The node's warm server, started as a cold job's end starts it, serving."""
    env = {**job_env(node), warm.PAD_VAR: "." * warm.PAD_BYTES}
    del env["CLOUDTRAIN_JOB_ID"]
    warm.folder(node).mkdir(mode=0o700)
    argv = [sys.executable, "-m", "cloudtrain.jobs.warmserver", str(node)]
    with subprocess.Popen(argv, env=env, cwd=node, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert b"serving on" in proc.stdout.readline()
        yield proc
        proc.terminate()


def run(workdir: Path, module: str, env: dict[str, str], *target: str) -> tuple[int, str]:
    flags = ["--standalone", "--nproc-per-node", "2", "--start-method", "fork"]
    done = subprocess.run([sys.executable, "-m", module, *flags, *target], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def served(server: subprocess.Popen[bytes]) -> str:
    """What the server said since (it prints a line a request)."""
    assert server.stdout is not None
    os.set_blocking(server.stdout.fileno(), False)
    time.sleep(0.2)
    return (server.stdout.read() or b"").decode()


def test_a_warm_agent_runs_the_job_as_a_cold_one(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    env = {**job_env(node), "CLOUDTRAIN_WARM": "0"}
    code, cold = run(workdir, "cloudtrain.jobs.warm", env, "train.py", "--lr", "0.1")
    assert code == 0, cold
    code, hot = run(workdir, "cloudtrain.jobs.warm", job_env(node), "train.py", "--lr", "0.1")
    assert code == 0, hot
    said = served(server)
    assert said.count("forked agent") == 1, said  # the cold one never asked
    assert facts(hot) == facts(cold)
    assert hot.count("atexit ran in rank") == 2
    first = facts(hot)[0]
    assert first["file"] == str(workdir / "train.py")
    assert first["path0"] == str(workdir)
    assert first["sigterm_default"] is True


def test_exit_codes_are_the_cold_agents(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    code, hot = run(workdir, "cloudtrain.jobs.warm", {**job_env(node), "END": "raise"},
                    "train.py")  # fmt: skip
    assert code == 1
    assert "ValueError: boom from the script" in hot
    code, hot = run(workdir, "cloudtrain.jobs.warm", {**job_env(node), "END": "exit"},
                    "train.py")  # fmt: skip
    assert code == 1
    assert "exitcode  : 3" in hot
    code, hot = run(workdir, "cloudtrain.jobs.warm", {**job_env(node), "END": "kill-agent"},
                    "train.py")  # fmt: skip
    assert code == -signal.SIGKILL, hot  # as a cold agent killed so: no handler to reset
    assert "jobs/warm.py" not in hot, hot  # no traceback of the client's (the ranks' are theirs)
    assert served(server).count("forked agent") == 3


def test_the_node_finds_the_jobs_processes_and_not_the_client(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    code, hot = run(workdir, "cloudtrain.jobs.warm", job_env(node), "find.py")
    assert code == 0, hot
    assert "forked agent" in served(server)

    seen = [json.loads(line.split("FOUND ", 1)[1]) for line in hot.splitlines()
            if "FOUND " in line]  # fmt: skip
    assert len(seen) == 2
    assert all(s["own"] for s in seen)
    pids = {s["pid"] for s in seen}
    for s in seen:  # each rank finds the other (itself and its agent are its own line)
        assert pids - {s["pid"]} <= set(s["pids"])
        assert not [c for c in s["cmdlines"] if "--standalone" in c], s  # never the client


def test_a_request_the_server_must_not_serve_starts_cold(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    big = {**job_env(node), "BIG": "x" * (warm.PAD_BYTES + 1)}
    code, out = run(workdir, "cloudtrain.jobs.warm", big, "train.py")
    assert code == 0, out
    assert "larger than this server's room" in served(server)
    assert server.poll() is None  # still serving others
    other = {**job_env(node), "TORCH_SHOW_CPP_STACKTRACES": "1"}
    code, out = run(workdir, "cloudtrain.jobs.warm", other, "train.py")
    assert code == 0, out
    assert len(facts(out)) == 2
    assert "import-time variables or confinement" in served(server)
    assert server.wait(timeout=30) == 0  # stale: it leaves, and the cold job started another
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (warm.folder(node) / "sock").exists():
        time.sleep(0.2)
    assert (warm.folder(node) / "sock").exists()
    procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node)}, grace_s=5)


def test_a_local_clusters_first_job_is_warm_and_down_leaves_no_server(tmp_path: Path) -> None:
    """`up` starts each node's server (`Coordinator.prewarm_cluster`): the first job's agents
    are forked from it, and the next job's from the same server."""
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home")}
    env.pop(warm.SWITCH, None)
    cli = [sys.executable, "-m", "cloudtrain.cli"]
    script = REPO / "examples" / "digits_ddp.py"
    subprocess.run([*cli, "up", "--name", "w", "--nodes", "2"], env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    logs = sorted((tmp_path / "home").glob("local/w/node-*/warm/server.log"))
    try:
        assert len(logs) == 2  # started by `up`, before any job
        for i in range(2):
            done = subprocess.run(
                [*cli, "train", "-c", "w", str(script), "--", "--epochs", "1",
                 "--checkpoint-dir", str(tmp_path / f"ckpt{i}")],
                env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            said = [log.read_text() for log in logs]
            # node 0's server forked its bootstrap's check too (node 1's machine is node 0's)
            assert [s.count("forked agent") for s in said] == [i + 2, i + 1], said
            assert [s.count("serving on") for s in said] == [1, 1], said  # one server each
        roots = [str(p.parents[1]) for p in logs]
    finally:
        subprocess.run([*cli, "down", "w"], env=env, check=True, capture_output=True,
                       timeout=300)  # fmt: skip
    for root in roots:
        assert procs.find_processes({"CLOUDTRAIN_NODE_ROOT": root}) == []


SLOW = """
import os, sys, time
if __name__ == "__main__":
    sys.stdout.write(f"TICK {os.environ['RANK']}\\n")
    sys.stdout.flush()
    time.sleep(120)
"""


def stopped(workdir: Path, env: dict[str, str]) -> tuple[int, str]:
    """The exit status of a job stopped as the node stops one: every process found by its
    ``CLOUDTRAIN_JOB_ID`` TERMed (then KILLed), once both ranks run; its folder
    (``CLOUDTRAIN_RUN_DIR``, when it has one) marked first, as `node kill --job-dir` does."""
    argv = [sys.executable, "-m", "cloudtrain.jobs.warm", "--standalone", "--nproc-per-node",
            "2", "--start-method", "fork", "slow.py"]  # fmt: skip
    with subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:  # fmt: skip
        assert proc.stdout is not None
        ticks = 0
        for line in proc.stdout:
            ticks += "TICK " in line
            if ticks == 2:
                break
        if "CLOUDTRAIN_RUN_DIR" in env:
            (Path(env["CLOUDTRAIN_RUN_DIR"]) / procs.STOPPED).write_text("now\n")
        counts = procs.kill_matching({"CLOUDTRAIN_JOB_ID": env["CLOUDTRAIN_JOB_ID"]}, grace_s=20)
        rest = proc.stdout.read()
        code = proc.wait(timeout=60)
    assert counts["killed"] == 0, rest  # each process ended on the one TERM
    assert procs.find_processes({"CLOUDTRAIN_JOB_ID": env["CLOUDTRAIN_JOB_ID"]}) == []
    return code, rest


def test_a_stopped_warm_job_ends_as_a_cold_one(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    (workdir / "slow.py").write_text(SLOW)
    cold_code, _ = stopped(workdir, {**job_env(node), "CLOUDTRAIN_WARM": "0"})
    warm_code, out = stopped(workdir, job_env(node))
    assert "forked agent" in served(server)
    assert warm_code == cold_code, out
    assert warm_code != 0


def test_two_jobs_at_once_are_both_served(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    envs = [job_env(node, CLOUDTRAIN_JOB_ID=f"job-{i}") for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda e: run(workdir, "cloudtrain.jobs.warm", e, "train.py"), envs))
    for code, out in done:
        assert code == 0, out
        assert len(facts(out)) == 2
    assert served(server).count("forked agent") == 2


def test_a_job_whose_server_dies_under_it_still_ends_with_its_own_status(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    (workdir / "orphan.py").write_text(
        "import os, signal, sys\n"
        "if os.environ['RANK'] == '0':\n"
        "    stat = open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1].split()\n"
        "    sys.stdout.write(f'AGENT OF {stat[1]}\\n')\n"  # the agent's parent
        "    sys.stdout.flush()\n"
        "    os.kill(int(os.environ['SERVER']), signal.SIGKILL)\n"
        "sys.exit(int(os.environ['CODE']))\n"
    )
    for code in (0, 3):
        env = job_env(node, SERVER=str(server.pid), CODE=str(code))
        if code:  # the first run killed it: a new one, started by hand as the fixture does
            (warm.folder(node) / "sock").unlink()
            server = subprocess.Popen(
                [sys.executable, "-m", "cloudtrain.jobs.warmserver", str(node)],
                env={**job_env(node), warm.PAD_VAR: "." * warm.PAD_BYTES}, cwd=node,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            while not (warm.folder(node) / "sock").exists():
                time.sleep(0.1)
            env["SERVER"] = str(server.pid)
        got, out = run(workdir, "cloudtrain.jobs.warm", env, "orphan.py")
        assert server.wait(timeout=30) == -9
        assert f"AGENT OF {server.pid}" in out  # warm: the server forked the agent
        assert got == (1 if code else 0), out  # torchrun's agent: 1 when a worker failed
        assert "went away" not in out


def test_a_cold_job_stopped_by_a_signal_starts_no_server(node: Path, workdir: Path) -> None:
    """A teardown's stop (no mark on the job's folder) must not leave a server behind that it
    did not find."""
    (workdir / "slow.py").write_text(SLOW)
    code, out = stopped(workdir, job_env(node))
    assert code != 0, out
    assert not (warm.folder(node) / "sock").exists()
    assert procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(node)}) == []
    # a job that ends on its own does start one, for the next job
    code, out = run(workdir, "cloudtrain.jobs.warm", job_env(node), "train.py")
    assert code == 0, out
    servers = procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(node)})
    assert len(servers) == 1
    procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node)}, grace_s=5)


def test_a_cold_job_stopped_as_a_job_starts_a_server_for_its_next_attempt(
    node: Path, workdir: Path, tmp_path: Path
) -> None:
    """A recovery (or a cancel) stops a job and leaves the node: its next attempt starts warm."""
    (workdir / "slow.py").write_text(SLOW)
    run_dir = tmp_path / "attempt"
    run_dir.mkdir()
    code, out = stopped(workdir, job_env(node, CLOUDTRAIN_RUN_DIR=str(run_dir)))
    assert code != 0, out
    deadline = time.monotonic() + 60
    while not (warm.folder(node) / "sock").exists():
        assert time.monotonic() < deadline, (warm.folder(node) / "server.log").read_text()
        time.sleep(0.1)
    code, out = run(workdir, "cloudtrain.jobs.warm", job_env(node), "train.py")
    assert code == 0, out
    assert "forked agent" in (warm.folder(node) / "server.log").read_text()
    assert procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node)}, grace_s=5)["terminated"] == 1


def test_a_job_waits_for_a_server_that_is_starting_and_not_for_one_that_stopped_listening(
    node: Path, workdir: Path
) -> None:
    """`--start` (a recovery readying a replacement) starts the server; a job that comes while
    it still imports torch is served by it. A lock held by a server that no longer listens (a
    stale one, its last job running) is no reason to wait."""
    import fcntl

    warm.folder(node).mkdir(mode=0o700)
    with open(warm.folder(node) / "lock", "w") as held:  # a server that stopped listening
        fcntl.flock(held, fcntl.LOCK_EX)
        began = time.monotonic()
        code, out = run(workdir, "cloudtrain.jobs.warm", job_env(node), "train.py")
        assert code == 0, out
        assert time.monotonic() - began < warm.STARTING_S
        assert not (warm.folder(node) / "sock").exists()
    started = subprocess.run([sys.executable, "-m", "cloudtrain.jobs.warm", "--start"],
                             env=job_env(node), cwd=node, timeout=60, check=True)  # fmt: skip
    assert started.returncode == 0
    assert not (warm.folder(node) / "sock").exists(), "it should still import torch"
    # From the moment `--start` returns, the server is seen as starting: a job that comes
    # before its interpreter even ran waits for it (the first job after `up` did not).
    assert (warm.folder(node) / warm.STARTING).exists()
    with open(warm.folder(node) / "lock") as lock, pytest.raises(BlockingIOError):
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    code, out = run(workdir, "cloudtrain.jobs.warm", job_env(node), "train.py")
    assert code == 0, out
    assert len(facts(out)) == 2
    assert "forked agent" in (warm.folder(node) / "server.log").read_text()
    assert procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node)}, grace_s=5)["terminated"] == 1
    assert not (warm.folder(node) / warm.STARTING).exists()


GATE = """
import os, sys, time
if __name__ == "__main__":
    sys.stdout.write("WAITING\\n")
    sys.stdout.flush()
    while not os.path.exists(os.environ["GATE"]):
        time.sleep(0.05)
"""


def start_for(env: dict[str, str]) -> None:
    """``warm --start`` as `up` runs it on a node, for jobs of `env`."""
    subprocess.run([sys.executable, "-m", "cloudtrain.jobs.warm", "--start"], env=env,
                   check=True, timeout=60)  # fmt: skip


def test_a_start_keeps_a_server_for_its_jobs_and_replaces_one_for_others(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    """A node's bootstrap starts its server for its own check of torch (`cloudtrain.node.
    bootstrap`); `up`'s start then keeps it where it serves the jobs, and replaces it where
    its jobs' import-time variables (or cgroup…) are not the bootstrap's."""
    start_for(job_env(node))
    assert server.poll() is None
    assert "refused" not in served(server)
    other = job_env(node, TORCH_SHOW_CPP_STACKTRACES="1")
    start_for(other)
    assert server.wait(timeout=30) == 0  # retired, once it answered
    assert "import-time variables or confinement" in served(server)
    log = warm.folder(node) / "server.log"
    deadline = time.monotonic() + 60
    while "serving on" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "no new server"
        time.sleep(0.1)
    try:
        assert (warm.folder(node) / warm.KEY).exists()
        (workdir / "noop.py").write_text("")
        code, out = run(workdir, "cloudtrain.jobs.warm", other, "noop.py")
        assert code == 0, out
        assert "forked agent" in log.read_text()  # the new server serves the other jobs
    finally:
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node)}, grace_s=5)


def test_a_start_for_other_jobs_leaves_a_busy_server_to_its_job(
    node: Path, workdir: Path, server: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """A server that runs a job's agent is not stopped for a start: it stops listening (the
    next job starts cold, and starts the next server) and ends when its agent has."""
    (workdir / "gate.py").write_text(GATE)
    gate = tmp_path / "gate"
    argv = [sys.executable, "-m", "cloudtrain.jobs.warm", "--standalone", "--nproc-per-node",
            "1", "--start-method", "fork", "gate.py"]  # fmt: skip
    with subprocess.Popen(argv, cwd=workdir, env=job_env(node, GATE=str(gate)),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as job:  # fmt: skip
        assert job.stdout is not None
        for line in job.stdout:
            if b"WAITING" in line:
                break
        start_for(job_env(node, TORCH_SHOW_CPP_STACKTRACES="1"))
        assert not (warm.folder(node) / "sock").exists()  # no longer listening
        assert not (warm.folder(node) / "server.log").exists()  # and no second server
        assert server.poll() is None
        assert job.poll() is None
        gate.touch()
        assert job.wait(timeout=60) == 0
    assert server.wait(timeout=30) == 0
    assert procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(node)}) == []


def test_a_client_that_keeps_the_server_asks_it_only_for_its_own_jobs(
    node: Path, workdir: Path, server: subprocess.Popen[bytes]
) -> None:
    """``--keep`` (the bootstrap's check): a server of other jobs is neither asked (which would
    make it stop serving them) nor retired; a server of its own is asked."""
    (workdir / "noop.py").write_text("")
    argv = [sys.executable, "-m", "cloudtrain.jobs.warm", "--keep", "--standalone",
            "--nproc-per-node", "1", "--start-method", "fork", "noop.py"]  # fmt: skip
    other = job_env(node, TORCH_SHOW_CPP_STACKTRACES="1")
    subprocess.run([*argv[:4], "--start"], env=other, check=True, timeout=60)
    done = subprocess.run(argv, cwd=workdir, env=other, timeout=120, check=False)
    assert done.returncode == 0
    assert served(server) == ""  # cold, and no request made
    assert server.poll() is None
    done = subprocess.run(argv, cwd=workdir, env=job_env(node), timeout=120, check=False)
    assert done.returncode == 0
    assert served(server).count("forked agent") == 1
