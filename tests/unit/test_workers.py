"""TensorFlow's and Horovod's workers: their variables per node (exact), each runtime's
checks and commands (`cloudtrain.jobs.runtimes`), and the node's spawner running real
processes (`cloudtrain.node.spawn`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.jobs import runtimes, workers
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.runtimes import horovod
from cloudtrain.jobs.runtimes.tensorflow import tensorflow_envs
from cloudtrain.jobs.torchrun import entrypoint_args, read_failure
from cloudtrain.model import NodeInfo
from cloudtrain.node import spawn


def _node(index: int, ip: str) -> NodeInfo:
    return NodeInfo(cluster="c", index=index, node_id=f"n{index}", private_ip=ip, public_ip=None,
                    state="running", ifname="eth0", python="/py", root=f"/r{index}")  # fmt: skip


NODES = [_node(0, "10.0.0.5"), _node(1, "10.0.0.6")]


def test_tf_config_names_every_worker_and_each_its_own_index() -> None:
    envs = tensorflow_envs(NODES, [[2001, 2002], [3001, 3002]])
    everyone = ["10.0.0.5:2001", "10.0.0.5:2002", "10.0.0.6:3001", "10.0.0.6:3002"]
    configs = [[json.loads(e["TF_CONFIG"]) for e in node] for node in envs]
    assert configs == [
        [{"cluster": {"worker": everyone}, "task": {"type": "worker", "index": i}} for i in (0, 1)],
        [{"cluster": {"worker": everyone}, "task": {"type": "worker", "index": i}} for i in (2, 3)],
    ]
    assert [[e["RANK"] for e in node] for node in envs] == [["0", "1"], ["2", "3"]]


def test_horovod_variables_per_slot_two_nodes_two_each() -> None:
    envs = horovod.horovod_envs(NODES, 2, "10.0.0.5", 4567)
    got = [
        [(e["HOROVOD_RANK"], e["HOROVOD_LOCAL_RANK"], e["HOROVOD_CROSS_RANK"],
          e["HOROVOD_HOSTNAME"]) for e in node]
        for node in envs
    ]  # fmt: skip
    assert got == [
        [("0", "0", "0", "node0"), ("1", "1", "0", "node0")],
        [("2", "0", "1", "node1"), ("3", "1", "1", "node1")],
    ]
    for e in (e for node in envs for e in node):
        assert e["HOROVOD_SIZE"] == "4"
        assert e["HOROVOD_LOCAL_SIZE"] == "2"
        assert e["HOROVOD_CROSS_SIZE"] == "2"
        assert e["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.5"
        assert e["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4567"
        assert e["HOROVOD_CONTROLLER"] == "gloo"
        assert e["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert e["HOROVOD_GLOO_IFACE"] == "eth0"
        assert e["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(horovod.HOROVOD_TIMEOUT_S)


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        (["train.py", "--epochs", "3"], ["/py", "train.py", "--epochs", "3"]),
        (["python3", "train.py"], ["/py", "train.py"]),
        (["-m", "pkg.train", "x"], ["/py", "-m", "pkg.train", "x"]),
        (["bash", "run.sh"], ["bash", "run.sh"]),
    ],
)
def test_a_workers_command_from_the_jobs_entrypoint(
    entrypoint: list[str], expected: list[str]
) -> None:
    assert workers.command(entrypoint_args(entrypoint), "/py") == expected


def test_only_the_heads_spawner_serves_the_rendezvous() -> None:
    start = runtimes.Start(attempt_id="j", job=JobSpec(entrypoint=("t.py",)), args=["t.py"],
                           nodes=NODES, nproc=2, port=9, free_ports=lambda n: [])  # fmt: skip
    head, other = runtimes.get("horovod").argvs(start)
    assert head[:4] == ["/py", "-m", "cloudtrain.node", "spawn"]
    assert head[head.index("--rendezvous") + 1] == "10.0.0.5:9"
    assert head[head.index("--hosts") + 1] == "node0:2,node1:2"
    assert "--rendezvous" not in other
    assert other[-3:] == ["--", "/py", "t.py"]
    assert [e["HOROVOD_RANK"] for e in json.loads(other[other.index("--envs") + 1])] == ["2", "3"]
    assert other[other.index("--timeout") + 1] == str(horovod.HOROVOD_TIMEOUT_S)


# -- the spawner, for real ------------------------------------------------------------------


def _run(envs: list[dict[str, str]], code: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cloudtrain.node", "spawn", "--envs", json.dumps(envs),
            *extra, "--", sys.executable, "-c", code]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_every_worker_gets_its_own_variables_and_all_succeeding_is_zero() -> None:
    done = _run([{"RANK": "0", "X": "a"}, {"RANK": "1", "X": "b"}],
                "import os; print(os.environ['RANK'], os.environ['X'])")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:2]) == ["0 a", "1 b"]


def test_the_first_failure_stops_the_others_and_its_code_and_rank_are_reported(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "slow-ended"
    code = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1': sys.exit(3)\n"
        f"time.sleep(60); open({str(marker)!r}, 'w')\n"
    )
    started = time.monotonic()
    done = _run([{"RANK": "0"}, {"RANK": "1"}], code)
    assert done.returncode == 3
    assert time.monotonic() - started < 40  # rank 0 was stopped, not waited for
    assert not marker.exists()
    failure = read_failure(done.stdout)
    assert (failure.rank, failure.worker_exit) == (1, 3)
    assert failure.reason(done.returncode) == "exited 3 (rank 1 exited 3)"


def test_a_horovod_worker_aborted_is_explained() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"
    done = _run([{"HOROVOD_RANK": "0"}], code, "--timeout", "120")
    assert done.returncode == 128 + signal.SIGABRT
    assert "worker rank 0 exited -6 (SIGABRT): Horovod's gloo rendezvous gives up after 120 s" in (
        done.stdout
    )


def test_term_reaches_every_worker(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (open("
        f"{str(tmp_path)!r} + '/t' + os.environ['RANK'], 'w'), sys.exit(143)))\n"
        "print('up', flush=True); time.sleep(60)\n"
    )
    envs = json.dumps([{"RANK": "0"}, {"RANK": "1"}])
    argv = [sys.executable, "-m", "cloudtrain.node", "spawn", "--envs", envs,
            "--", sys.executable, "-c", code]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert [proc.stdout.readline(), proc.stdout.readline()] == ["up\n", "up\n"]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t0", "t1"]


def test_a_worker_that_ignores_term_is_killed_in_the_stop_grace_and_reported() -> None:
    """TensorFlow's multi-worker runtime ignores TERM while it waits for a peer: the spawner
    KILLs it after `STOP_GRACE_S`, before the coordinator's own KILL would take the spawner
    too (and with it the node's exit code)."""
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True); time.sleep(60)\n"
    )
    envs = json.dumps([{"RANK": "0"}])
    argv = [sys.executable, "-m", "cloudtrain.node", "spawn", "--envs", envs,
            "--", sys.executable, "-c", code]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "up\n"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL
        out = proc.stdout.read()
    assert read_failure(out).worker_exit == -signal.SIGKILL, out


def test_a_report_names_the_signal() -> None:
    assert spawn.report(2, -9).splitlines() == [
        "cloudtrain: worker rank 2 exited -9 (SIGKILL)",
        "  rank: 2",
        "  exitcode: -9",
    ]


def test_the_jobs_horovod_timeout_wins_and_what_wires_the_job_is_refused() -> None:
    from cloudtrain.errors import ConfigError

    assert horovod.horovod_timeout_s({}) == horovod.HOROVOD_TIMEOUT_S
    timeout = horovod.horovod_timeout_s({"HOROVOD_GLOO_TIMEOUT_SECONDS": "600"})
    envs = horovod.horovod_envs(NODES, 2, "10.0.0.5", 4567, timeout)
    assert {e["HOROVOD_GLOO_TIMEOUT_SECONDS"] for node in envs for e in node} == {"600"}
    for value in ("0", "-5", "1.5", "soon", "", "٣", "86401"):
        with pytest.raises(ConfigError, match=r"HOROVOD_GLOO_TIMEOUT_SECONDS=.*whole seconds"):
            check("horovod", {"HOROVOD_GLOO_TIMEOUT_SECONDS": value})
    wired = [("horovod", "HOROVOD_RANK"), ("tensorflow", "TF_CONFIG"), ("torch", "MASTER_PORT")]
    for runtime, name in wired:
        with pytest.raises(ConfigError, match=rf"^envs: {name}='1': cloudtrain sets {name}"):
            check(runtime, {name: "1"})
    check("torch", {"HOROVOD_RANK": "1", "OMP_NUM_THREADS": "2"})  # not torch's


def check(
    runtime: str, envs: dict[str, str], max_restarts: int = 0, min_nodes: int | None = None
) -> None:
    spec = JobSpec(entrypoint=("t.py",), envs=envs, runtime=runtime, max_restarts=max_restarts,
                   min_nodes=min_nodes)  # fmt: skip
    runtimes.get(runtime).check(spec, ["t.py"])


def test_torchruns_flags_are_refused_for_the_runtimes_without_it() -> None:
    from cloudtrain.errors import ConfigError

    for runtime in ("tensorflow", "horovod"):
        with pytest.raises(ConfigError, match=rf"^--max-restarts is torchrun's .* not '{runtime}'"):
            check(runtime, {}, max_restarts=2)
        with pytest.raises(ConfigError, match=r"^--nodes MIN:MAX \(elastic\) is torchrun's"):
            check(runtime, {}, min_nodes=1)
    check("torch", {}, max_restarts=2, min_nodes=1)
    assert [runtimes.get(r).workers_per_node(8) for r in ("torch", "tensorflow", "horovod")] == [
        8,
        0,
        8,
    ]


@pytest.mark.parametrize(
    ("runtime", "entrypoint", "start_method", "readies"),
    [
        ("torch", ["train.py"], "fork", True),
        ("torch", ["python", "-m", "pkg.train"], "fork", True),
        ("torch", ["train.py"], "spawn", False),  # torchrun's own agent: nothing to warm
        ("torch", ["bash", "run.sh"], "fork", False),  # not Python: torchrun's agent
        ("tensorflow", ["train.py"], "fork", False),
        ("horovod", ["train.py"], "fork", False),
    ],
)
def test_only_a_forked_torch_job_readies_a_node_with_its_warm_server(
    runtime: str, entrypoint: list[str], start_method: str, readies: bool
) -> None:
    job = JobSpec(entrypoint=tuple(entrypoint), runtime=runtime, start_method=start_method)
    got = runtimes.get(runtime).prewarm(job)
    assert got == (["-m", "cloudtrain.jobs.warm", "--start"] if readies else None)


def test_a_node_just_up_is_readied_for_the_default_runtime_s_jobs_to_come() -> None:
    """No job yet (`up`): the default runtime's defaults, a script forked from a warm agent."""
    assert runtimes.get(JobSpec.runtime).prewarm(None) == ["-m", "cloudtrain.jobs.warm", "--start"]
    assert [runtimes.get(name).prewarm(None) for name in ("tensorflow", "horovod")] == [None, None]
