"""A cluster that stops itself under a detached job (its lifetime ends): the next command
brings the job's log and checkpoint home from where the node kept them, ends the job's record
truthfully, and `status`, `logs` and `cancel` all answer (issue 28, item 9)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import SCRIPTS, Shell, wait_for

pytestmark = pytest.mark.integration


def test_a_lifetime_under_a_detached_job_keeps_its_log_and_checkpoint(sh: Shell) -> None:
    up = sh("up", "--name", "ends", "--nodes", "1", "--max-hours", "0.02")  # 72 s
    assert up.returncode == 0, up.stderr
    job = sh("train", "-c", "ends", "--detach", str(SCRIPTS / "saves_then_waits.py"))
    assert job.returncode == 0, job.stderr
    log = sh.home / "local" / "ends" / "node-0" / "jobs" / "ends-1" / "node.log"
    wait_for(
        lambda: log.exists() and "saved step-1" in log.read_text(),
        timeout=120,
        what="the job to save",
    )
    shown = sh("status")  # before the end: the job runs, the table shows it
    assert shown.returncode == 0, shown.stderr
    assert "ends-1" in shown.stdout
    folder = sh.home / "local" / "ends"
    wait_for(
        lambda: not list(folder.glob("node-*/node.json")),
        timeout=150,
        what="the lifetime to end the node",
    )
    assert (folder / "node-0.kept" / "jobs" / "ends-1" / "node.log").exists(), "kept on the node"

    after = sh("status")
    assert after.returncode == 0, after.stderr
    assert "ends stopped itself (its lifetime ended)" in after.stderr
    record = sh.job("ends-1")
    assert record["status"] == "cancelled"
    assert record["detail"]["reason"] == "stopped: the cluster stopped itself (its lifetime ended)"
    events = [e["message"] for e in sh.status()["events"]]
    assert "job ends-1 stopped: the cluster stopped itself (its lifetime ended)" in events
    assert sh("status").returncode == 0, "every later status answers too"

    logs = sh("logs", "ends-1")
    assert logs.returncode == 0, logs.stderr
    assert "saved step-1" in logs.stdout
    kept = list((sh.home / "checkpoints" / "ends-1").rglob("model.txt"))
    assert [p.read_text() for p in kept][-1:] == ["weights at step 1\n"], "the checkpoint came home"
    cancel = sh("cancel", "ends-1")
    assert cancel.returncode == 0, cancel.stderr
    assert not folder.exists(), "the ended cluster's folder went, after what it kept came home"
