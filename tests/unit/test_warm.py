"""The warm server's parts that need no server: the environment memory a scan reads, the exit
status a forked agent gives, and what makes a request one the server must not serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.jobs import warm, warmserver

PROBE = """
import os, sys, time
from cloudtrain.jobs import warm, warmserver
warm._set_first_letter(warm.MARKERS, "C", "_")
print(os.environ["CLOUDTRAIN_JOB_ID"], os.getenv("CLOUDTRAIN_JOB_ID"), flush=True)
sys.stdin.readline()
warm._set_first_letter(warm.MARKERS, "_", "C")
print("back", flush=True)
sys.stdin.readline()
"""


def environ_of(pid: int) -> dict[bytes, bytes]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.split(b"=", 1) for p in pairs if b"=" in p)


def test_the_client_hides_its_markers_from_a_scan_and_puts_them_back() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.getcwd(), "CLOUDTRAIN_JOB_ID": "job-1",
           "CLOUDTRAIN_NODE_ROOT": "/tmp/n", "AFTER": "kept"}  # fmt: skip
    with subprocess.Popen([sys.executable, "-c", PROBE], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as proc:  # fmt: skip
        assert proc.stdin is not None
        assert proc.stdout is not None
        # the process's own view is untouched (Python's copy, and the C library's pointers)
        assert proc.stdout.readline().split() == ["job-1", "job-1"]
        seen = environ_of(proc.pid)
        assert b"CLOUDTRAIN_JOB_ID" not in seen
        assert b"CLOUDTRAIN_NODE_ROOT" not in seen
        assert seen[b"_LOUDTRAIN_JOB_ID"] == b"job-1"
        assert seen[b"AFTER"] == b"kept"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "back"
        assert environ_of(proc.pid)[b"CLOUDTRAIN_JOB_ID"] == b"job-1"
        proc.stdin.write("\n")
        proc.stdin.flush()


def _exit(code: object) -> None:
    raise SystemExit(code)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (lambda: None, 0),
        (lambda: _exit(None), 0),
        (lambda: _exit(3), 3),
        (lambda: _exit("a message"), 1),
        (lambda: 1 / 0, 1),
        (lambda: _exit(256 + 7), 7),
    ],
)
def test_a_forked_agent_exits_as_the_interpreter_would(
    body: object, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert callable(body)
    assert warmserver._status(body) == status
    err = capsys.readouterr().err
    if status == 1:
        assert "a message" in err or "ZeroDivisionError" in err


def test_an_interrupt_is_the_status_of_a_sigint() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    assert warmserver._status(interrupted) == 128 + signal.SIGINT


def test_what_torch_reads_at_import_is_in_the_fingerprint(tmp_path: Path) -> None:
    base = {"PATH": "/usr/bin", "CLOUDTRAIN_JOB_ID": "a", "OMP_NUM_THREADS": "1"}
    key = warm.fingerprint(base)
    assert warm.fingerprint({**base, "CLOUDTRAIN_JOB_ID": "b", "HOME": "/x"}) == key
    for name in ("TORCH_LOGS", "PYTHONPATH", "LD_PRELOAD", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert warm.fingerprint({**base, name: "2"}) != key, name


def test_a_package_installed_changes_the_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    key = warm.fingerprint({})
    os.utime(site, ns=(0, 0))
    assert warm.fingerprint({}) != key  # what pip's new folder does to site-packages


KEY = "from cloudtrain.jobs import warm; print(warm.fingerprint({}))"


@pytest.mark.parametrize(
    "confined",
    [
        "ulimit -n 64; exec",  # a resource limit
        "exec taskset -c 0",  # the CPUs it may run on
        "exec nice -n 5",
    ],
)
def test_where_a_process_runs_is_in_the_fingerprint(confined: str) -> None:
    """A forked agent inherits the server's confinement, not the job launcher's: a job
    confined otherwise must not be served (the memory cgroup is `test_killed`'s OOM test)."""
    if "taskset" in confined and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no other set of CPUs to run on")

    def key(how: str) -> str:
        done = subprocess.run(["sh", "-c", f'{how} "$0" -c "$1"', sys.executable, KEY],
                              capture_output=True, text=True, check=True, cwd="/")  # fmt: skip
        return done.stdout.strip()

    assert key("exec") == key("exec")
    assert key(confined) != key("exec")


def test_a_client_without_a_server_is_not_served(tmp_path: Path) -> None:
    assert warm.ask(tmp_path, ["x.py"]) is None
    warm.folder(tmp_path).mkdir()
    (warm.folder(tmp_path) / "sock").write_text("")  # a leftover file, no server
    assert warm.ask(tmp_path, ["x.py"]) is None
    assert os.environ.get("CLOUDTRAIN_WARM") is None  # nothing of this process changed
