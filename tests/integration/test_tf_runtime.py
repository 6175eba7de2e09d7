"""The tensorflow runtime as its users meet it, through the CLI on two local nodes: its
workers' servers listen on the nodes' private addresses only (loopback here), never on every
interface; a script written as TensorFlow's multi-worker Keras tutorial writes it trains
unchanged; the TensorFlow example's numbers reach `cloudtrain metrics`.

TensorFlow is not a dependency of the project: `.ci/run` installs it and sets
``CLOUDTRAIN_TEST_TOOLS=required``, which turns these tests' skip into a failure."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, SCRIPTS, TWO, Shell, wait_for
from tests.integration.test_frameworks import needs
from tests.integration.test_local_flow import listeners

pytestmark = pytest.mark.integration
TF_INSTALL = "pip install tensorflow==2.21.0 tf-keras==2.21.0"


@pytest.fixture
def sh(two_nodes: Shell) -> Shell:
    """Every test here trains on the cluster of 2 nodes `TWO`."""
    return two_nodes


def test_tensorflow_workers_listen_on_the_private_address_only(sh: Shell, tmp_path: Path) -> None:
    """TensorFlow's own server listens on ``*:PORT`` whatever TF_CONFIG says: cloudtrain's
    workers listen on their node's private address (127.0.0.1 for local nodes), and nothing
    of the job listens anywhere else. A command under the runtime, whose servers cloudtrain
    could not bind, is refused before anything runs."""
    needs("tf_keras", TF_INSTALL)
    start = sh(
        "train", "-c", TWO, "--runtime", "tensorflow", "--detach", str(SCRIPTS / "tf_listens.py")
    )
    assert start.returncode == 0, start.stderr
    jid = re.search(rf"job ({TWO}-\d+) running", start.stderr)
    assert jid, start.stderr
    wait_for(
        lambda: sh("logs", jid.group(1)).stdout.count("joined 2") == 2,
        what="both workers joined",
        timeout=300,
    )
    found = listeners(sh.processes())
    workers = {
        w for env in worker_envs(sh) for w in json.loads(env["TF_CONFIG"])["cluster"]["worker"]
    }
    assert len(workers) == 2, workers
    assert [a for a, _ in found if not a.startswith("127.0.0.1:")] == [], found
    assert workers <= {a for a, _ in found}, (found, workers)  # each worker's server, there
    assert sh("cancel", jid.group(1)).returncode == 0

    task = tmp_path / "task.yaml"
    task.write_text(f"name: {TWO}\nruntime: tensorflow\nworkdir: {SCRIPTS}\nrun: bash go.sh\n")
    jobs = len(sh.status()["jobs"])
    refused = sh("train", str(task))
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: runtime tensorflow runs a Python script or module, not the command 'bash'"
    ), refused.stderr
    assert len(sh.status()["jobs"]) == jobs  # the refused one made no job


def worker_envs(sh: Shell) -> list[dict[str, str]]:
    """Each worker's variables, as the job's spawners on the nodes were given them."""
    envs = []
    for pid in sh.processes():
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[1:4] == [b"-m", b"cloudtrain.node", b"spawn"]:
            envs += json.loads(argv[argv.index(b"--envs") + 1])
    return envs


def test_a_script_written_as_tensorflows_keras_tutorial_trains_on_two_nodes(sh: Shell) -> None:
    """Plain ``tf.keras`` under MultiWorkerMirroredStrategy fails with Keras 3 (PerReplica
    batches in ``fit``); the workers get ``TF_USE_LEGACY_KERAS=1``, so it trains. The TF
    example reports its numbers: `cloudtrain metrics` prints them, as the chief printed them."""
    needs("tf_keras", TF_INSTALL)
    done = sh(
        "train",
        "-c",
        TWO,
        "--runtime",
        "tensorflow",
        str(SCRIPTS / "tf_keras_tutorial.py"),
        timeout=400,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PerReplica" not in done.stdout
    assert re.search(r"^\[node 0\] Epoch 3/3$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^\[node 1\] Epoch 3/3$", done.stdout, re.MULTILINE), done.stdout

    example = str(REPO / "examples" / "digits_tf.py")
    train = sh(
        "train", "-c", TWO, "--runtime", "tensorflow", example, "--", "--epochs", "3", timeout=400
    )
    assert train.returncode == 0, train.stdout + train.stderr
    jid = re.search(rf"job ({TWO}-\d+) succeeded", train.stderr)
    assert jid, train.stderr
    printed = re.findall(
        r"epoch (\d)/3 loss ([\d.]+) train_acc ([\d.]+) test_acc ([\d.]+)", train.stdout
    )
    assert len(printed) == 3, train.stdout
    reported = sh("metrics", jid.group(1), "--json")
    assert reported.returncode == 0, reported.stderr
    lines = json.loads(reported.stdout)
    per_epoch = [m for m in lines if "loss" in m]
    assert [
        (str(m["epoch"]), f"{m['loss']:.4f}", f"{m['train_acc']:.4f}", f"{m['test_acc']:.4f}")
        for m in per_epoch
    ] == printed
    assert all(m["rank"] == 0 and m["samples_s"] > 0 for m in per_epoch)
    steps = -(-1437 // 64)  # the digits' training split, in global batches of 64
    assert [m["step"] for m in per_epoch] == [steps, 2 * steps, 3 * steps]
    assert any(m.get("total_steps") == 3 * steps for m in lines)
    table = sh("metrics", jid.group(1))
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == [
        "attempt",
        "step",
        "at",
        "epoch",
        "loss",
        "train_acc",
        "test_acc",
        "samples_s",
    ]
