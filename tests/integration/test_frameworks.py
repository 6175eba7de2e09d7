"""The runtimes and strategies of issue 13 end to end on two local nodes: FSDP with sharded
checkpoints resumed on a different number of ranks, and a bad runtime refused up front."""

from __future__ import annotations

import re

import pytest

from tests.integration.conftest import REPO, Shell

pytestmark = pytest.mark.integration
FSDP = REPO / "examples" / "digits_fsdp.py"


def test_fsdp_trains_where_ddp_does_not_fit_and_resumes_on_fewer_ranks(sh: Shell) -> None:
    """The model does not fit a rank's budget as a replica: refused under ddp, trained under
    fsdp over two nodes; its shards come home from both nodes and a job on one node resumes
    from them (DCP reshards)."""
    assert sh("up", "--nodes", "2", "--name", "shard").returncode == 0
    ddp = sh("train", "-c", "shard", str(FSDP), "--strategy", "ddp", "--", "--epochs", "1")
    assert ddp.returncode != 0
    assert "per rank under ddp" in ddp.stdout + ddp.stderr
    assert "use --strategy fsdp" in ddp.stdout + ddp.stderr
    fsdp = sh("train", "-c", "shard", str(FSDP), "--strategy", "fsdp", "--", "--epochs", "2")
    assert fsdp.returncode == 0, fsdp.stdout + fsdp.stderr
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", fsdp.stdout)
    assert accuracy, fsdp.stdout
    assert float(accuracy.group(1)) >= 0.9, fsdp.stdout
    job = re.search(r"job (shard-\d+) succeeded", fsdp.stderr)
    assert job, fsdp.stderr
    assert sh("down", "shard").returncode == 0
    assert sh("up", "--nodes", "1", "--name", "one").returncode == 0
    resumed = sh("train", "-c", "one", str(FSDP), "--strategy", "fsdp",
                 "--resume-from", job.group(1), "--", "--epochs", "3",
                 "--budget-mb", "80")  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from epoch 2 (saved by 2 ranks, now 1)" in resumed.stdout
    assert sh("down", "one").returncode == 0


def test_a_bad_runtime_or_strategy_is_one_line_and_starts_nothing(sh: Shell) -> None:
    assert sh("up", "--name", "bad").returncode == 0
    for flags, expected in [
        (["--runtime", "jax"], "error: --runtime 'jax' is not one of torch, tensorflow, horovod"),
        (["--runtime", "horovod", "--strategy", "fsdp"], "error: --strategy 'fsdp' is for the "
         "torch runtime"),
        (["--runtime", "tensorflow", "--max-restarts", "2"], "error: --max-restarts is "
         "torchrun's and needs runtime torch"),
    ]:  # fmt: skip
        done = sh("train", "-c", "bad", *flags, str(FSDP))
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(expected), done.stderr
        assert "Traceback" not in done.stderr
    assert sh.status()["jobs"] == []
    assert sh("down", "bad").returncode == 0
