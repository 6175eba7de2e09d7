"""The second fault, through the real CLI on the local provider and real sshd: a node preempted
seconds after its notice is recorded as preempted, with its event, not as vanished; every node
lost right after a save costs at most one checkpoint interval; and a save still being written
on a node never travels home."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import access
from cloudtrain.executors.base import Executor
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.executors.ssh import SshExecutor
from cloudtrain.jobs.checkpoints import Kept
from cloudtrain.node import notices, procs
from cloudtrain.state import State
from tests.integration.conftest import REPO, Shell, wait_for
from tests.integration.test_managed_jobs import kill_node, read_until
from tests.sshd import SshHost, cluster_hosts

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"
#: digits_ddp's steps per epoch on each of 2 ranks (719 samples, batches of 32): its
#: checkpoint interval, one save per epoch.
INTERVAL = 23


def events(home: Path, kind: str) -> list[str]:
    """The events of `kind`, read from the state as they are (`cloudtrain status` would
    refresh the jobs, and record what it sees itself)."""
    with State.open(home) as state:
        return [e.message for e in state.events(limit=None) if e.kind == kind]


def test_a_node_gone_seconds_after_its_notice_is_recorded_as_preempted(sh: Shell) -> None:
    assert sh("up", "--name", "p", "--nodes", "2").returncode == 0
    train = sh.popen("train", "-c", "p", "--managed", str(EXAMPLE), "--",
                     "--epochs", "8", "--pause", "1")  # fmt: skip
    out = read_until(train, r"epoch 2/8")
    root = sh.home / "local" / "p" / "node-1"
    # What the node's agent does on its cloud's notice: record it, tell the job.
    procs.tell_job(root, notices.Notice(notices.IMDSV2, "terminate", "2026-12-02T10:00:00Z"))
    noticed = time.monotonic()
    wait_for(lambda: events(sh.home, "preemption"), timeout=30, what="the notice's event")
    print(f"the watcher recorded the notice {time.monotonic() - noticed:.1f} s after it")
    kill_node(sh.home, "p", 1)  # the cloud takes the node, its folder and notice with it
    rest, _ = train.communicate(timeout=300)
    out += rest
    assert train.returncode == 0, out
    assert "recovery 1/3: node 1" in out, out
    assert "epoch 8/8" in out
    job = sh.job("p-1")
    assert [(r["cause"], r["node"]) for r in job["detail"]["recoveries"]] == [("preempted", 1)]
    remembered = job["detail"]["preemptions"]["1"]
    assert (remembered["source"], remembered["attempt"], remembered["zone"]) == (
        notices.IMDSV2, 0, "local",
    )  # fmt: skip
    said = events(sh.home, "preemption")
    assert said == [
        "job p-1: node 1's cloud will terminate it at 2026-12-02T10:00:00Z (imdsv2 notice); "
        "the job was told to checkpoint"
    ], "once, though the beats after it saw it too"
    assert sh("down", "p").returncode == 0


def test_every_node_lost_right_after_a_save_costs_at_most_one_interval(sh: Shell) -> None:
    """A save comes home when it completes: the copy on a timer is put off (600 s) so that
    only the save's own marker can have brought it."""
    sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "600"
    assert sh("up", "--name", "a", "--nodes", "2").returncode == 0
    train = sh.popen("train", "-c", "a", "--managed", str(EXAMPLE), "--",
                     "--epochs", "6", "--pause", "3")  # fmt: skip
    out = read_until(train, r"epoch 3/6")  # printed once epoch 3's checkpoint is saved
    for index in (0, 1):
        kill_node(sh.home, "a", index)
    rest, _ = train.communicate(timeout=300)
    out += rest
    assert train.returncode == 0, out
    assert "replacing node(s) 0, 1 of a" in out, out
    resumed = re.search(r"resumed from epoch (\d+)", out)
    assert resumed, out
    redone = (3 - int(resumed.group(1))) * INTERVAL  # the steps of the epochs trained again
    assert 0 <= redone <= INTERVAL, out
    recovery = sh.job("a-1")["detail"]["recoveries"][0]
    assert recovery["resumed_at_step"] == int(resumed.group(1)) * INTERVAL
    assert recovery["steps_redone"] <= INTERVAL, recovery
    assert "epoch 6/6" in out
    assert sh("down", "a").returncode == 0


# -- a save in progress stays on the node ---------------------------------------------------

WRITER = """
import os, sys, time
folder = sys.argv[1]
# as runtime.save_checkpoint and save_sharded write: a temp file, a temp folder
parts = [open(os.path.join(folder, ".model.pt.k2j4x9.tmp"), "wb")]
os.makedirs(os.path.join(folder, ".ckpt-000002.tmp"))
parts.append(open(os.path.join(folder, ".ckpt-000002.tmp", "__0_0.distcp"), "wb"))
for i in range(400):
    for f in parts:
        f.write(b"x" * (1 << 16))
        f.flush()
    if i == 2:
        print("writing", flush=True)
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def ssh_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, SshHost]]:
    with cluster_hosts(tmp_path_factory.mktemp("ssh"), "127.0.0.2") as (home, (host,)):
        yield home, host


@pytest.fixture(params=["local", "ssh"])
def node_executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    if request.param == "local":
        yield LocalExecutor()
        return
    home, host = request.getfixturevalue("ssh_node")
    ex = SshExecutor(host.host, user="root", port=host.port, options=access.ssh_options(home, "c1"))
    yield ex
    ex.close()


def test_a_save_being_written_during_the_copy_never_travels(
    node_executor: Executor, tmp_path: Path
) -> None:
    folder = tmp_path / "node" / "checkpoints" / "j-1"
    (folder / "ckpt-000001").mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"whole")
    (folder / "ckpt-000001" / "__0_0.distcp").write_bytes(b"shard")
    kept = Kept(tmp_path / "home", "j-1")
    stale = kept.folder / ".incoming" / ".model.pt.old.tmp"  # copied by an earlier version
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "writing\n"
        snapshot = kept.pull(node_executor, str(folder))
        assert writer.poll() is None, "the copy ran while the temp files grew"
    finally:
        writer.kill()
        writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    assert snapshot is not None
    on_node = {p.name for p in folder.iterdir()}
    assert {".model.pt.k2j4x9.tmp", ".ckpt-000002.tmp"} <= on_node, "the node keeps its own"
    for tree in (snapshot, kept.folder / ".incoming"):
        found = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*"))
        assert found == ["ckpt-000001", "ckpt-000001/__0_0.distcp", "model.pt"], tree
    assert sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file()) == 10
