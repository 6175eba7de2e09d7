"""A managed job's watcher through the real CLI: killed, it is started again by its supervisor
with no command of the user's, and the job goes on; a failed recovery's half-made node record
(an ssh host that did not answer) is read by the watcher and by `status`, never crashed on."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cloudtrain.jobs import supervisor, watched
from cloudtrain.node import procs
from cloudtrain.state import State
from tests.integration.conftest import Shell, wait_for

pytestmark = pytest.mark.integration

TICKS = """import os, sys, time
ticks = int(sys.argv[1])
for i in range(ticks):
    print(f"rank {os.environ['RANK']} tick {i}", flush=True)
    time.sleep(0.5)
print(f"rank {os.environ['RANK']} done", flush=True)
"""


def ticks_script(tmp_path: Path) -> Path:
    """A job of its own folder (what `train` copies to every node) that ticks, then ends 0."""
    folder = tmp_path / "work"
    folder.mkdir()
    script = folder / "ticks.py"
    script.write_text(TICKS)
    return script


def job_status(home: Path, job_id: str) -> str:
    """As recorded, read without a command (`status` would start a dead watcher itself)."""
    with State.open(home) as state:
        rec = state.job(job_id)
    return rec.status if rec is not None else "none"


def live_watcher(home: Path, job_id: str) -> int | None:
    pid = watched.watcher_pid(home, job_id)
    return pid if pid is not None and pid > 0 and procs.alive(pid) else None


def no_crash(home: Path, job_id: str) -> None:
    log = (home / "logs" / job_id / watched.WATCH_LOG).read_text()
    assert "unexpected" not in log, log
    assert not list((home / "crashes").glob("*.txt")), log


def test_a_killed_watcher_comes_back_by_itself_and_the_job_goes_on(
    sh: Shell, tmp_path: Path
) -> None:
    assert sh("up", "--name", "sv", "--nodes", "2").returncode == 0
    start = sh("train", "-c", "sv", "--managed", "--detach", str(ticks_script(tmp_path)), "--",
               "16")  # fmt: skip
    assert start.returncode == 0, start.stderr
    wait_for(lambda: live_watcher(sh.home, "sv-1") and job_status(sh.home, "sv-1") == "running",
             timeout=60, what="the job to run, watched")  # fmt: skip
    first = live_watcher(sh.home, "sv-1")
    assert first is not None
    keeper = supervisor.supervisor_pid(sh.home, "sv-1")
    assert keeper is not None
    assert keeper != first
    os.kill(first, signal.SIGKILL)
    killed = time.monotonic()
    # no command runs meanwhile: only the supervisor can bring it back
    wait_for(lambda: live_watcher(sh.home, "sv-1") not in (None, first), timeout=30,
             what="a new watcher")  # fmt: skip
    back = time.monotonic() - killed
    wait_for(lambda: job_status(sh.home, "sv-1") == "succeeded", timeout=90,
             what="the job to succeed, recorded by the new watcher")  # fmt: skip
    wait_for(lambda: supervisor.supervisor_pid(sh.home, "sv-1") is None, timeout=30,
             what="the supervisor to end with the job")  # fmt: skip
    log = (sh.home / "logs" / "sv-1" / watched.WATCH_LOG).read_text()
    assert "the watcher of sv-1 was killed by signal 9 after" in log, log
    assert "job sv-1 succeeded" in log, log
    print(f"watcher back {back:.1f} s after its SIGKILL")
    assert sh("down", "sv").returncode == 0


def test_a_failed_recovery_s_half_made_ssh_record_is_read_and_the_job_goes_on(
    sh: Shell, tmp_path: Path
) -> None:
    """Host 1 goes away mid-job: the watcher's recovery fails (`up` cannot reach it) and
    records node 1 ``unreachable``; the watcher reads that record at its next try, `status`
    reads it too (exit 0), and once the host is back the job runs there again and ends."""
    from tests.sshd import Lab

    lab = Lab(tmp_path / "lab", addresses=(21, 22))
    name = "half-made"
    job = f"{name}-1"
    sh.env.update({"CLOUDTRAIN_HEARTBEAT_TIMEOUT_S": "3"})
    try:
        assert sh(*lab.up_args(name)).returncode == 0
        start = sh("train", "-c", name, "--managed", "--max-recoveries", "8", "--detach",
                   str(ticks_script(tmp_path)), "--", "10")  # fmt: skip
        assert start.returncode == 0, start.stderr
        # 120 s: once, in CI beside the training chain, the job and its watcher took over 60
        wait_for(lambda: job_status(sh.home, job) == "running" and live_watcher(sh.home, job),
                 timeout=120, what="the job, watched")  # fmt: skip
        lab.hosts[1].cut()  # the host goes away: its sshd, then what it ran
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(lab.home / ".cloudtrain" / name /
                                                          "node-1")}, grace_s=0)  # fmt: skip

        def failed_tries() -> int:
            with State.open(sh.home) as state:
                return sum(" failed: " in e.message for e in state.events(job_id=job, limit=None))

        wait_for(lambda: failed_tries() >= 1, timeout=60, what="a recovery that failed")
        with State.open(sh.home) as state:
            recorded = {n.index: n for n in state.nodes(name)}
        assert recorded[1].state == "unreachable", recorded
        status = sh("status")
        assert status.returncode == 0, status.stderr
        assert "unexpected" not in status.stderr
        assert job in status.stdout
        wait_for(lambda: failed_tries() >= 2, timeout=60, what="a try from that record")
        lab.hosts[1].start()
        wait_for(lambda: job_status(sh.home, job) == "succeeded", timeout=120,
                 what="the job to end on both hosts")  # fmt: skip
        wait_for(lambda: supervisor.supervisor_pid(sh.home, job) is None, timeout=30,
                 what="the watcher and its supervisor to end")  # fmt: skip
        no_crash(sh.home, job)
        said = (sh.home / "logs" / job / watched.WATCH_LOG).read_text()
        assert f"the watcher of {job}" not in said, "one watcher all along: none died"
        log = (sh.home / "logs" / job / "node-1.log").read_text()
        assert "rank 1 done" in log, log
        assert sh("down", name).returncode == 0
    finally:
        lab.stop()
        procs.kill_matching({"CLOUDTRAIN_CLUSTER": name}, grace_s=2)
