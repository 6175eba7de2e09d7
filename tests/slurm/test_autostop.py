"""An idle Slurm cluster releases its allocation by itself (`up --idle-minutes`): each node's
agent removes its node, its host then ends, and with the last host the batch job, so Slurm ends
the allocation as completed (nothing cancels it from here); the next command says what happened
`up` brings it back as a new allocation, and `down` clears what is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Shell, wait_for
from tests.slurmlab import SlurmLab, _command

pytestmark = pytest.mark.integration


def test_an_idle_allocation_releases_itself_and_the_next_command_says_so(
    slurm: SlurmLab, slurm_sh: Shell, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    where = ["--provider", "slurm", "--shared-dir", str(shared)]
    where += ["--nodes", "2", "--name", "idle"]
    up = slurm_sh("up", *where, "--idle-minutes", "0.05", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "idle stops itself after 0.05 idle minute(s)" in up.stderr
    [job] = slurm.queue()
    wait_for(lambda: slurm.queue() == [], timeout=90, what="the allocation to release itself")
    assert slurm.job_state(job) == "COMPLETED", "it ended by itself, not by a cancel"
    assert [_command(p) for p in slurm.job_processes()] == []

    refreshed = slurm_sh("status", "idle", "--refresh")
    assert refreshed.returncode == 0, refreshed.stderr
    said = "idle stopped itself (it was idle); `cloudtrain up` brings it back"
    assert said in refreshed.stderr, refreshed.stderr
    assert slurm_sh.status()["clusters"][0]["status"] == "stopped"
    again = slurm_sh("up", *where, "--idle-minutes", "60", timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    [second] = slurm.queue()
    assert second != job, "a new allocation"
    down = slurm_sh("down", "idle", "--provider", "slurm", "--shared-dir", str(shared))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not (shared / "idle").exists()
    assert slurm_sh.status()["clusters"] == []
