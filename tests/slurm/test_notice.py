"""Slurm's signal before a job's time limit (``--signal=B:USR1@N``, asked by `up --notice N`)
is a notice on every node, as a cloud's preemption notice is: recorded, and a job that asked
for it with `runtime.on_preemption` is told (and saves) while its nodes run, before the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import Shell
from tests.slurmlab import SlurmLab

pytestmark = pytest.mark.integration

#: A job written as the preemption guide says: save when told, here by ending cleanly.
JOB = """
import time
from cloudtrain.runtime import on_preemption, preempting
told = []
on_preemption(lambda: told.append(time.time()))
started = time.time()
while not told and time.time() - started < 100:
    time.sleep(0.1)
print(f"saved: told={bool(told)} preempting={preempting()}", flush=True)
"""


def test_the_signal_before_the_time_limit_tells_the_job_on_every_node(
    slurm: SlurmLab, slurm_sh: Shell, tmp_path: Path
) -> None:
    shared, work = tmp_path / "shared", tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    where = ["--provider", "slurm", "--shared-dir", str(shared)]
    # a time limit of 2 minutes, the notice asked 110 s before it: Slurm sends it once it
    # next looks, 10 to 40 s after the start
    up = slurm_sh("up", *where, "--nodes", "2", "--name", "ends", "--time", "2", "--notice", "110")
    assert up.returncode == 0, up.stderr
    train = slurm_sh("train", "-c", "ends", str(work / "job.py"), timeout=150)
    assert train.returncode == 0, train.stdout + train.stderr
    assert train.stdout.count("saved: told=True preempting=True") == 2, train.stdout
    for node in (0, 1):
        notice = json.loads((shared / "ends" / f"node-{node}" / "preemption.json").read_text())
        assert (notice["source"], notice["action"]) == ("slurm", "end")
    assert len(slurm.queue()) == 1, "told before the end: the allocation still runs"
    down = slurm_sh("down", "ends", *where)
    assert down.returncode == 0, down.stderr
    assert slurm.queue() == []
    assert slurm.job_processes() == []
