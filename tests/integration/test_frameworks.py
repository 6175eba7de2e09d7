"""The runtimes and strategies of issue 13 end to end on two local nodes, through the CLI:
TensorFlow's MultiWorkerMirroredStrategy, Horovod (the same script as under torchrun, the same
losses), FSDP with sharded checkpoints resumed on a different number of ranks, and a bad runtime
refused up front.

TensorFlow and Horovod are not the project's dependencies: `.ci/run` installs both (Horovod
built once against this torch) and sets ``CLOUDTRAIN_TEST_TOOLS=required``, which turns
their tests' skip on a machine without them into a failure."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.integration.conftest import REPO, TWO, Shell, require

pytestmark = pytest.mark.integration
EXAMPLES = REPO / "examples"
FSDP = EXAMPLES / "digits_fsdp.py"
PEER_FAILS = REPO / "tests" / "integration" / "scripts" / "tf_peer_fails.py"


@pytest.fixture
def sh(two_nodes: Shell) -> Shell:
    """Every test here trains on one cluster of 2 nodes, `TWO`."""
    return two_nodes


def needs(module: str, install: str) -> None:
    require(importlib.util.find_spec(module) is not None, f"{module} is not installed: {install}")


def epochs(out: str) -> list[str]:
    """What rank 0 printed of each epoch, on whichever node it ran: torchrun's rendezvous ranks
    the agents by address and pid, so under torchrun it may be node 1."""
    return re.findall(r"^\[node \d+\] (epoch \d+/\d+ loss [\d.]+)$", out, re.MULTILINE)


def accuracy(out: str) -> float:
    found = re.search(r"final test accuracy: (\d\.\d+)", out)
    assert found, out
    return float(found.group(1))


def test_tensorflow_trains_on_two_nodes_and_a_worker_that_fails_stops_the_other(
    sh: Shell,
) -> None:
    """Each node's worker gets its TF_CONFIG; the example reaches the torch example's accuracy.
    A worker that fails while its peer waits in MultiWorkerMirroredStrategy (which ignores
    TERM there) fails the job at once, blamed on the right node, with nothing left running."""
    needs("tf_keras", "pip install tensorflow==2.21.0 tf-keras==2.21.0")
    done = sh("train", "-c", TWO, "--runtime", "tensorflow", str(EXAMPLES / "digits_tf.py"),
              "--", "--epochs", "3")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[node 0] worker-0 of 2: global batch 64" in done.stdout
    assert "[node 1] worker-1 of 2: global batch 64" in done.stdout
    assert accuracy(done.stdout) >= 0.9
    failed = sh("train", "-c", TWO, "--runtime", "tensorflow", str(PEER_FAILS))
    assert failed.returncode == 1
    assert "failed: node 1 exited 3 (rank 1 exited 3)" in failed.stderr, failed.stderr
    assert "[node 0] /job:worker/replica:0/task:1" in failed.stdout  # it was waiting for it


def test_horovod_trains_on_two_nodes_as_the_same_script_does_under_torchrun(sh: Shell) -> None:
    """Horovod's own workers (its rendezvous served by the head's spawner) and the same script
    on cloudtrain's Horovod-style API under torchrun take the same steps: the same loss every
    epoch, the same accuracy."""
    needs("horovod", "python -m cloudtrain.node horovod build --cache DIR --install")
    script = str(EXAMPLES / "digits_hvd.py")
    hvd = sh("train", "-c", TWO, "--runtime", "horovod", script, "--", "--epochs", "3")
    assert hvd.returncode == 0, hvd.stdout + hvd.stderr
    torch = sh("train", "-c", TWO, script, "--", "--epochs", "3")
    assert torch.returncode == 0, torch.stdout + torch.stderr
    assert len(epochs(hvd.stdout)) == 3, hvd.stdout
    assert epochs(hvd.stdout) == epochs(torch.stdout)
    assert accuracy(hvd.stdout) == accuracy(torch.stdout) >= 0.9


def test_fsdp_trains_where_ddp_does_not_fit_and_resumes_on_fewer_ranks(sh: Shell) -> None:
    """The model does not fit a rank's budget as a replica: refused under ddp, trained under
    fsdp over two nodes; its shards come home from both nodes and a job on one node of the
    same cluster resumes from them (DCP reshards)."""
    ddp = sh("train", "-c", TWO, str(FSDP), "--strategy", "ddp", "--", "--epochs", "1")
    assert ddp.returncode != 0
    assert "per rank under ddp" in ddp.stdout + ddp.stderr
    assert "use --strategy fsdp" in ddp.stdout + ddp.stderr
    fsdp = sh("train", "-c", TWO, str(FSDP), "--strategy", "fsdp", "--", "--epochs", "2")
    assert fsdp.returncode == 0, fsdp.stdout + fsdp.stderr
    assert accuracy(fsdp.stdout) >= 0.9
    job = re.search(rf"job ({TWO}-\d+) succeeded", fsdp.stderr)
    assert job, fsdp.stderr
    resumed = sh("train", "-c", TWO, "--nodes", "1", str(FSDP), "--strategy", "fsdp",
                 "--resume-from", job.group(1), "--", "--epochs", "3",
                 "--budget-mb", "80")  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from epoch 2 (saved by 2 ranks, now 1)" in resumed.stdout
    assert "[node 1]" not in resumed.stdout  # a job of one node is judged by that node alone


def test_a_bad_runtime_or_strategy_is_one_line_and_starts_nothing(sh: Shell) -> None:
    before = [j["id"] for j in sh.status()["jobs"]]
    for flags, expected in [
        (["--runtime", "jax"], "error: --runtime 'jax' is not one of torch, tensorflow, horovod"),
        (["--runtime", "horovod", "--strategy", "fsdp"], "error: --strategy 'fsdp' is for the "
         "torch runtime"),
        (["--runtime", "tensorflow", "--max-restarts", "2"], "error: --max-restarts is "
         "torchrun's and needs runtime torch"),
    ]:  # fmt: skip
        done = sh("train", "-c", TWO, *flags, str(FSDP))
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(expected), done.stderr
        assert "Traceback" not in done.stderr
    assert [j["id"] for j in sh.status()["jobs"]] == before
