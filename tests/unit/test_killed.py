"""A rank or launcher killed by a signal, told from the script's own exit: `judge` over the
node's real files (the detach wrapper run by /bin/sh, `cloudtrain.node.job_status`) and
torchrun's report. The whole path through a managed job: tests/integration/test_killed.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.executors.base import DETACH_SCRIPT
from cloudtrain.jobs.attempts import Verdict, judge
from cloudtrain.jobs.torchrun import read_failure
from cloudtrain.model import NodeInfo
from cloudtrain.node import job_status, oom
from cloudtrain.state import JobRecord


def torchrun_report(rank: int, exitcode: int) -> str:
    """The end of a failed torchrun agent's log, in torch 2.x's shape."""
    cause = f"Signal {-exitcode} ({signal.Signals(-exitcode).name}) received by PID 42" if (
        exitcode < 0) else "<N/A>"  # fmt: skip
    return (
        "Traceback (most recent call last):\n"
        '  File "torch/distributed/run.py", line 900, in main\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n  <NO_OTHER_FAILURES>\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-12-01_10:00:00\n  host      : node\n"
        f"  rank      : {rank} (local_rank: 0)\n"
        f"  exitcode  : {exitcode} (pid: 42)\n"
        "  error_file: <N/A>\n"
        f"  traceback : {cause}\n"
        "============================================================\n"
    )


def ran(job_dir: Path, *command: str) -> dict[str, Any]:
    """Run `command` as a job's launcher under the real detach wrapper; its node status."""
    job_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["/bin/sh", "-c", DETACH_SCRIPT, "detach", str(job_dir), *command],
                   check=True, capture_output=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (job_dir / "exit_code").exists():
        assert time.monotonic() < deadline, "the wrapper wrote no exit code"
        time.sleep(0.02)
    return job_status(job_dir)


def judged(statuses: list[Mapping[str, Any]], logs: list[str]) -> Verdict:
    nodes = [NodeInfo("c", i, f"n{i}", "10.0.0.1", None, "running") for i in range(2)]
    rec = JobRecord("c-1", 1, "c", "j", "running", 0.0, 0.0, None, None, 2, 1, ("t.py",),
                    {"managed": {"max_recoveries": 3}})  # fmt: skip
    verdict = judge(rec, nodes, statuses, {}, lambda node: read_failure(logs[node.index]))
    assert verdict is not None
    return verdict


def ended(code: int, at: float, **more: Any) -> dict[str, Any]:
    return {"exit_code": code, "alive": False, "cancelled": False, "ended": at, **more}


def test_a_rank_killed_by_sigkill_is_recovered_and_the_oom_killer_named() -> None:
    log = torchrun_report(1, -signal.SIGKILL)
    other = torchrun_report(0, -signal.SIGTERM)  # stopped after it: not the cause
    verdict = judged([ended(1, 20.0), ended(1, 10.0, oom_kills=1)], [other, log])
    assert (verdict.status, verdict.cause, verdict.node, verdict.exit_code) == (
        "failed", "killed", 1, 1)  # fmt: skip
    assert verdict.recoverable
    assert not verdict.lost_node
    assert verdict.reason == (
        "exited 1: rank 1 was killed by SIGKILL (out of memory: the kernel's OOM killer)"
    )
    no_oom = judged([ended(0, 5.0), ended(1, 10.0, oom_kills=0)], ["", log])
    assert no_oom.cause == "killed"
    assert no_oom.reason.endswith("(not by the OOM killer, which counted no kill in the "
                                  "node's memory cgroup)")  # fmt: skip
    for unknown in (None, -1, True, "1", 1.5):  # not readable there, or nonsense: not known
        told = judged([ended(0, 5.0), ended(1, 10.0, oom_kills=unknown)], ["", log])
        assert told.reason.endswith("(out of memory, or another process: the node's memory "
                                    "cgroup does not say)")  # fmt: skip


@pytest.mark.parametrize(
    ("exitcode", "said"),
    [(3, "exited 1 (rank 1 exited 3)"), (137, "exited 1 (rank 1 exited 137)"),
     (-signal.SIGSEGV, "exited 1: rank 1 was killed by SIGSEGV"),
     (-signal.SIGABRT, "exited 1: rank 1 was killed by SIGABRT")],
)  # fmt: skip
def test_the_scripts_own_exit_or_crash_is_not_recovered_by_default(
    exitcode: int, said: str
) -> None:
    verdict = judged([ended(0, 5.0), ended(1, 10.0, oom_kills=0)],
                     ["", torchrun_report(1, exitcode)])  # fmt: skip
    assert (verdict.cause, verdict.reason) == ("exit", said)
    assert not verdict.recoverable


def test_a_launcher_killed_by_sigkill_is_told_by_the_shells_code(tmp_path: Path) -> None:
    killed = ran(tmp_path / "killed", "sh", "-c", "echo training; kill -KILL $$")
    assert killed["exit_code"] == 128 + signal.SIGKILL
    assert killed["oom_kills"] in (0, None), "nothing ran out of memory here"
    verdict = judged([ended(0, 5.0), killed], ["", "training\n"])
    assert (verdict.cause, verdict.node) == ("killed", 1)
    assert verdict.reason.startswith("exited 137: its launcher was killed by SIGKILL (")
    own = ran(tmp_path / "own", "sh", "-c", "exit 3")
    assert judged([ended(0, 5.0), own], ["", ""]).cause == "exit"


def test_the_wrapper_counts_the_oom_killers_kills_around_the_job(tmp_path: Path) -> None:
    (tmp_path / oom.START).write_text("oom_kill 2\n")
    assert oom.kills(tmp_path) is None, "not ended: not known"
    (tmp_path / oom.END).write_text("oom_kill 3\n")
    assert oom.kills(tmp_path) == 1
    (tmp_path / oom.START).write_text("")  # no memory cgroup to read
    assert oom.kills(tmp_path) is None
    (tmp_path / oom.START).write_text("oom_kill 1\noom_kill 0\n")  # v1 and v2 both
    assert oom.kills(tmp_path) == 2


def test_a_node_that_cloudtrains_own_stop_killed_is_not_the_cause(tmp_path: Path) -> None:
    """After rank 1 was SIGKILLed, the stop of the others may KILL node 0's wrapper too (its
    launcher outlived the grace): node 0 then has no exit code, but `kill --job-dir` marked it
    stopped, so the cause is still node 1's kill, not a node 0 that "vanished"."""
    job_dir = tmp_path / "jobs" / "c-1"
    job_dir.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "cloudtrain.node", "kill", "--match",
                    f"CLOUDTRAIN_JOB_ID=none-{tmp_path.name}", "--grace", "0", "--job-dir",
                    str(job_dir)], check=True, capture_output=True)  # fmt: skip
    stopped = job_status(job_dir)
    assert (stopped["exit_code"], stopped["alive"], stopped["stopped"]) == (None, False, True)
    verdict = judged([stopped, ended(1, 10.0, oom_kills=0)],
                     ["", torchrun_report(1, -signal.SIGKILL)])  # fmt: skip
    assert (verdict.cause, verdict.node, verdict.recoverable) == ("killed", 1, True)
    unmarked = judged([{**stopped, "stopped": False}, ended(1, 10.0)], ["", ""])
    assert (unmarked.cause, unmarked.node) == ("vanished", 0)  # killed under it: the cause
