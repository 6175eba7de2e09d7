"""The Slurm lab is a real two-node Slurm, what a Slurm provider will be tested against: a job
spreads its tasks over both nodes and ends COMPLETED, GPUs are counted per node and a request
for more than a node has is refused at submission, a step runs inside an allocation held by a
batch job from outside it, and scancel ends the job and every process of it; what escapes a job
anyway does not outlive its lab, whose closing reports it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from tests.integration.conftest import wait_for
from tests.slurmlab import ENDED, SlurmLab

pytestmark = pytest.mark.integration


def test_a_job_runs_one_task_on_each_node(slurm: SlurmLab) -> None:
    out = slurm.folder / "tasks.out"
    job = slurm.submit(
        "--nodes=2",
        f"--output={out}",
        "--wrap",
        "srun sh -c 'echo task $SLURM_NODEID on $SLURMD_NODENAME'",
    )
    assert slurm.wait_state(job, *ENDED) == "COMPLETED"
    assert sorted(out.read_text().splitlines()) == ["task 0 on n1", "task 1 on n2"]
    assert slurm.queue() == []


def test_a_node_has_eight_gpus_and_nine_are_refused(slurm: SlurmLab) -> None:
    out = slurm.folder / "gpus.out"
    job = slurm.submit(
        "--nodes=2",
        "--gres=gpu:a100:8",
        f"--output={out}",
        "--wrap",
        "srun sh -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'",
    )
    assert slurm.wait_state(job, *ENDED) == "COMPLETED"
    assert sorted(out.read_text().splitlines()) == ["n1 0,1,2,3,4,5,6,7", "n2 0,1,2,3,4,5,6,7"]

    refused = slurm.run("sbatch", "--nodes=2", "--gres=gpu:a100:9", "--wrap", "true", check=False)
    assert refused.returncode == 1
    assert refused.stderr == (
        "sbatch: error: Batch job submission failed: "
        "Requested node configuration is not available\n"
    )
    assert slurm.queue() == []


def test_a_step_runs_in_a_held_allocation_until_scancel_ends_it(slurm: SlurmLab) -> None:
    seconds = f"300.{secrets.randbelow(10**6):06d}"  # sleep's argument, this test's own
    job = slurm.submit("--nodes=2", "--output=/dev/null", "--wrap", f"srun sleep {seconds}")
    assert slurm.wait_state(job, "RUNNING", *ENDED) == "RUNNING"
    wait_for(lambda: len(sleeping(seconds)) == 2, timeout=10, what="a sleep on each node")

    step = slurm.run(
        "srun",
        "--overlap",
        f"--jobid={job}",
        "--nodes=2",
        "sh",
        "-c",
        "echo $SLURMD_NODENAME $SLURM_JOB_ID",
    )
    assert sorted(step.stdout.splitlines()) == [f"n1 {job}", f"n2 {job}"]
    assert len(sleeping(seconds)) == 2  # the step ran beside them

    slurm.run("scancel", job)
    assert slurm.wait_state(job, *ENDED) == "CANCELLED"
    assert slurm.queue() == []
    assert sleeping(seconds) == []


def test_closing_kills_and_reports_what_escaped_its_job(tmp_path: Path) -> None:
    seconds = f"300.{secrets.randbelow(10**6):06d}"
    running = SlurmLab(tmp_path / "slurm")
    try:
        running.start()
        # an orphan: no longer below the job's slurmstepd, where proctrack/linuxproc looks
        job = running.submit("--output=/dev/null", "--wrap", f"setsid sleep {seconds} &")
        assert running.wait_state(job, *ENDED) == "COMPLETED"
        wait_for(lambda: len(sleeping(seconds)) == 1, timeout=10, what="the orphan")
    finally:
        with pytest.raises(RuntimeError, match=rf"processes left \(killed\): .*sleep {seconds}"):
            running.close()
    assert sleeping(seconds) == []


def sleeping(seconds: str) -> list[int]:
    """The PIDs of the live ``sleep <seconds>`` processes, from /proc."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if os.path.basename(argv[0]) == b"sleep" and argv[1:2] == [seconds.encode()]:
            found.append(int(cmdline.parent.name))
    return found
