"""Workers forked from torchrun's agent (`cloudtrain.jobs.elastic`) see what torchrun's own
spawned workers see: the same script, run both ways on two real ranks with the c10d rendezvous,
prints the same facts — ``__name__``, ``sys.argv``, ``__file__``, a sibling module imported, a
relative import inside a package run with ``-m``, the env contract, the signal handlers — and
ends with the same exit codes and the script's own traceback and ``atexit`` handlers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
import atexit, json, os, signal, sys
import sibling
atexit.register(lambda: print("atexit ran in rank", os.environ["RANK"], flush=True))

def facts():
    return {
        "name": __name__, "argv": sys.argv, "file": __file__, "sibling": sibling.VALUE,
        "path0": sys.path[0],
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
                "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "TORCHELASTIC_RUN_ID")},
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    }

if __name__ == "__main__":
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    sys.stdout.write("FACTS " + json.dumps(facts()) + chr(10))  # one write: ranks share a pipe
    sys.stdout.flush()
    dist.destroy_process_group()
    how = os.environ.get("END")
    if how == "raise" and os.environ["RANK"] == "1":
        raise ValueError("boom from the script")
    if how == "exit":
        sys.exit(3)
    if how == "kill-agent" and os.environ["RANK"] == "0":
        os.kill(os.getppid(), signal.SIGKILL)  # the agent: as the OOM killer may
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "sibling.py").write_text("VALUE = 'next to the script'\n")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("WHO = 'a relative import'\n")
    (package / "main.py").write_text(  # one write per line: the ranks' output interleaves
        "import sys\nfrom .helpers import WHO\nif __name__ == '__main__':\n"
        "    sys.stdout.write(f'MODULE {__name__} {__package__} {WHO} {sys.argv[1:]}\\n')\n"
    )
    return tmp_path


def run(workdir: Path, start_method: str, *target: str, end: str = "") -> tuple[int, str]:
    launcher = "cloudtrain.jobs.elastic" if start_method == "fork" else "torch.distributed.run"
    flags = ["--standalone", "--nproc-per-node", "2", "--start-method", start_method]
    done = subprocess.run(
        [sys.executable, "-m", launcher, *flags, *target],
        cwd=workdir,
        env={"PATH": "/usr/bin:/bin", "END": end, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done.returncode, done.stdout + done.stderr


def facts(output: str) -> list[dict[str, object]]:
    found = [json.loads(line.split("FACTS ", 1)[1]) for line in output.splitlines()
             if "FACTS " in line]  # fmt: skip
    for fact in found:
        env = fact["env"]
        assert isinstance(env, dict)
        env.pop("TORCHELASTIC_RUN_ID")  # standalone: a new id each run
        env.pop("MASTER_ADDR")  # standalone: the host's name
    return sorted(found, key=lambda f: str(f["env"]))


def test_a_forked_worker_sees_what_a_spawned_one_sees(workdir: Path) -> None:
    code, forked = run(workdir, "fork", "train.py", "--lr", "0.1")
    assert code == 0, forked
    code, spawned = run(workdir, "spawn", "train.py", "--lr", "0.1")
    assert code == 0, spawned
    assert facts(forked) == facts(spawned)
    first = facts(forked)[0]
    assert first["name"] == "__main__"
    assert first["file"] == str(workdir / "train.py")
    assert first["argv"] == ["train.py", "--lr", "0.1"]
    assert first["sibling"] == "next to the script"
    assert first["path0"] == str(workdir)
    assert first["sigterm_default"] is True
    assert first["sigint_default"] is True
    assert [f["env"]["RANK"] for f in facts(forked)] == ["0", "1"]  # type: ignore[index]
    assert forked.count("atexit ran in rank") == 2


def test_a_module_with_relative_imports_runs_as_under_python_m(workdir: Path) -> None:
    code, forked = run(workdir, "fork", "-m", "pkg.main", "x")
    assert code == 0, forked
    assert forked.count("MODULE __main__ pkg a relative import ['x']") == 2


def test_exit_codes_and_tracebacks_are_the_scripts(workdir: Path) -> None:
    code, forked = run(workdir, "fork", "train.py", end="raise")
    assert code == 1
    assert 'raise ValueError("boom from the script")' in forked  # the script's traceback
    assert "ValueError: boom from the script" in forked
    assert "start_method: fork" in forked  # torch elastic's report names how it started them
    code, forked = run(workdir, "fork", "train.py", end="exit")
    assert code == 1  # torchrun's agent exits 1 when a worker failed, whatever its code
    assert "exitcode  : 3" in forked
    _, spawned = run(workdir, "spawn", "train.py", end="exit")
    assert "exitcode  : 3" in spawned


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_launcher_stopped_by_sigterm_says_so_in_one_line_and_exits_143(
    workdir: Path, start_method: str
) -> None:
    """A cancel, or a recovery stopping the nodes left, sends the launcher SIGTERM: its
    workers stop, its log gets one line (torch elastic raises through thirty lines of its own
    frames), and it exits as a shell records a process the signal ended."""
    (workdir / "wait.py").write_text(
        "import os, sys, time\nopen(f'pid-{os.environ[\"RANK\"]}', 'w').write(str(os.getpid()))\n"
        "sys.stdout.write('WAITING\\n')\nsys.stdout.flush()\ntime.sleep(120)\n"
    )
    flags = ["--standalone", "--nproc-per-node", "2", "--start-method", start_method]
    with subprocess.Popen(
        [sys.executable, "-m", "cloudtrain.jobs.elastic", *flags, "wait.py"],
        cwd=workdir,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as launcher:
        assert launcher.stdout is not None
        said: list[str] = []
        while sum("WAITING" in line for line in said) < 2:
            line = launcher.stdout.readline()
            assert line, "".join(said)
            said.append(line)
        launcher.send_signal(signal.SIGTERM)
        said += launcher.stdout.readlines()
        code = launcher.wait(timeout=60)
    out = "".join(said)
    assert code == 128 + signal.SIGTERM, out
    assert "cloudtrain: the launcher got SIGTERM; its workers are stopped" in out
    assert "Traceback" not in out, out
    for rank in (0, 1):
        with pytest.raises(ProcessLookupError):
            os.kill(int((workdir / f"pid-{rank}").read_text()), 0)


def test_a_forked_worker_inherits_the_agents_preload(workdir: Path) -> None:
    """DDP's constructor imports ``torch._dynamo``: a forked worker finds it imported, whole,
    by its agent (`elastic.PRELOAD`); a spawned one starts without it."""
    (workdir / "preloaded.py").write_text(
        "import sys\nm = sys.modules.get('torch._dynamo')\n"
        "ok = m is not None and hasattr(m, 'optimize')\n"
        "sys.stdout.write(f'PRELOADED {ok}\\n')\n"  # one write: the ranks share a pipe
    )
    code, forked = run(workdir, "fork", "preloaded.py")
    assert code == 0, forked
    assert forked.count("PRELOADED True") == 2
    code, spawned = run(workdir, "spawn", "preloaded.py")
    assert code == 0, spawned
    assert spawned.count("PRELOADED False") == 2


def test_each_forked_worker_draws_its_own_random_numbers(workdir: Path) -> None:
    """The agent's preload imports ``numpy.random``: a fork would share its global state, where
    a new interpreter (spawn) draws from the OS. Each forked rank draws its own numbers."""
    (workdir / "draw.py").write_text(
        "import random, sys\nimport numpy as np\n"
        "sys.stdout.write(f'DRAW {np.random.rand()} {random.random()}\\n')\n"
    )
    code, forked = run(workdir, "fork", "draw.py")
    assert code == 0, forked
    draws = [line.split("DRAW ", 1)[1] for line in forked.splitlines() if "DRAW " in line]
    assert len(draws) == 2
    numpy_draws = {d.split()[0] for d in draws}
    python_draws = {d.split()[1] for d in draws}
    assert len(numpy_draws) == 2, draws
    assert len(python_draws) == 2, draws


def test_two_standalone_fork_jobs_at_once_each_rendezvous_on_their_own(workdir: Path) -> None:
    """``--standalone`` is a c10d rendezvous on a free port, as torchrun's `run` makes it;
    a fork job builds its config itself and must not fall back to the static port 29500."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda _: run(workdir, "fork", "train.py"), range(2)))
    for code, out in done:
        assert code == 0, out
        assert len(facts(out)) == 2


def test_a_spawned_worker_run_through_the_import_guard_sees_what_a_plain_one_sees(
    workdir: Path,
) -> None:
    """``--start-method spawn`` jobs run their script through `cloudtrain.jobs.spawned` (the
    guard against ``import horovod.torch``): the script cannot tell."""
    code, plain = run(workdir, "spawn", "train.py", "--lr", "0.1")
    assert code == 0, plain
    code, guarded = run(
        workdir, "spawn", "-m", "cloudtrain.jobs.spawned", "train.py", "--lr", "0.1"
    )
    assert code == 0, guarded
    assert facts(guarded) == facts(plain)
    assert len(facts(plain)) == 2
    code, module = run(
        workdir, "spawn", "-m", "cloudtrain.jobs.spawned", "--module", "pkg.main", "x"
    )
    assert code == 0, module
    assert module.count("MODULE __main__ pkg a relative import ['x']") == 2
