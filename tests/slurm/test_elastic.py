"""An elastic job on the real Slurm lab through the CLI: it goes on without a node Slurm sets
down and starts again on all nodes once that node is made again, which needs the rendezvous
to give a node that joins a later round that round's store (`cloudtrain.jobs.rendezvous`).
Here, not in the serial chain of tests/integration: it runs beside the jobs that train there,
the load under which that restart failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import REPO, Shell, came_back_on_all
from tests.slurmlab import SlurmLab

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"


def test_a_managed_elastic_job_goes_on_without_a_node_slurm_sets_down_and_gets_it_back(
    slurm: SlurmLab, slurm_sh: Shell, tmp_path: Path
) -> None:
    """`--managed --nodes 1:2`: node 1's Slurm node is set down; node 0 goes on alone in the
    cluster's job (``--no-kill``) while the watcher makes node 1 again as a job of one node,
    then the job starts again on both from the newest checkpoint and ends there."""
    slurm_sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    where = ["--provider", "slurm", "--shared-dir", str(tmp_path / "shared")]
    up = slurm_sh("up", *where, "--nodes", "2", "--name", "e", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    train = slurm_sh.popen("train", "-c", "e", "--managed", "--nodes", "1:2", str(EXAMPLE), "--",
                           "--epochs", "12", "--pause", "1")  # fmt: skip
    out = slurm.lose_node_under(train, once="epoch 3/12")
    assert train.returncode == 0, out
    assert "recovery 1/3: node 1 was lost; the others go on (elastic) while it is made" in out
    came_back_on_all(out)
    assert slurm_sh("down", "e", *where).returncode == 0
    assert slurm.queue() == []
