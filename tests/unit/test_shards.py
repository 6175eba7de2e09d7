"""cloudtrain.jobs.shards: which sharded checkpoints are whole, from their markers alone (what
the user's machine reads to choose the snapshot a resumed fsdp job gets), and the same markers
as `runtime.save_sharded` writes them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from cloudtrain import runtime
from cloudtrain.jobs import shards
from cloudtrain.runtime import progress
from tests.unit.runtime.ranks import TORCHRUN_ENV


@pytest.fixture(autouse=True)
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "_step", 0)
    monkeypatch.setattr(progress, "_resumed_from", None)
    yield
    runtime.shutdown()


def node_part(ckpt: Path, rank: int, *, writers: list[int], save: str, size: int = 8) -> None:
    """What one node of a two-node save leaves in `ckpt`: its shard, its marker (and on rank
    0's node the metadata), as `runtime.save_sharded` writes them."""
    ckpt.mkdir(parents=True, exist_ok=True)
    files = {f"__{rank}_0.distcp": size}
    if rank == 0:
        files[".metadata"] = 5
    for name, n in files.items():
        (ckpt / name).write_bytes(b"x" * n)
    marker = {"checkpoint": ckpt.name, "writers": writers, "save": save, "files": files}
    (ckpt / f"complete-{rank}.json").write_text(json.dumps(marker))


def test_the_markers_runtime_writes_say_the_save_and_its_files(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    path = runtime.save_sharded(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1))
    marker = json.loads((path / "complete-0.json").read_text())
    assert len(marker["save"]) == 16
    on_disk = {p.name: p.stat().st_size for p in path.iterdir() if p.name != "complete-0.json"}
    assert marker["files"] == on_disk
    assert set(on_disk) == {".metadata", "__0_0.distcp"}
    assert shards.missing(path) is None
    (path / "__0_0.distcp").write_bytes(b"cut")
    assert shards.missing(path) == "ckpt-000000 lacks shard file(s) __0_0.distcp"


def test_both_nodes_of_one_save_are_whole(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt-000003"
    node_part(ckpt, 0, writers=[0, 1], save="a")
    assert (
        shards.missing(ckpt)
        == "ckpt-000003 lacks the marker and shards of the node(s) of rank(s) 1"
    )
    node_part(ckpt, 1, writers=[0, 1], save="a")
    assert shards.missing(ckpt) is None
    (ckpt / ".metadata").unlink()
    assert shards.missing(ckpt) == "ckpt-000003 lacks .metadata (written on global rank 0's node)"


def test_shards_of_two_saves_of_one_number_are_not_a_checkpoint(tmp_path: Path) -> None:
    # node 1's ckpt-000003 from before a recovery, node 0's from after it
    ckpt = tmp_path / "ckpt-000003"
    node_part(ckpt, 0, writers=[0, 1], save="after")
    node_part(ckpt, 1, writers=[0, 1], save="before")
    assert shards.missing(ckpt) == "ckpt-000003 mixes the shards of 2 different saves"


def test_a_link_or_a_path_elsewhere_is_no_shard(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt-000000"
    node_part(ckpt, 0, writers=[0], save="a")
    outside = tmp_path / "elsewhere"
    (ckpt / "__0_0.distcp").rename(outside)
    os.symlink(outside, ckpt / "__0_0.distcp")
    assert shards.missing(ckpt) == "ckpt-000000 lacks shard file(s) __0_0.distcp"
    marker = json.loads((ckpt / "complete-0.json").read_text())
    marker["files"] = {"../elsewhere": 8, ".metadata": 5}
    (ckpt / "complete-0.json").write_text(json.dumps(marker))
    assert shards.missing(ckpt) == "ckpt-000000 lacks shard file(s) ../elsewhere"
    (ckpt / "complete-0.json").write_text("[not a marker")
    assert (
        shards.missing(ckpt)
        == "ckpt-000000 lacks a complete-*.json marker (its save did not finish)"
    )


def test_the_newest_snapshot_holding_a_whole_checkpoint_is_chosen(tmp_path: Path) -> None:
    # S1: both nodes' epoch 3 and 4. S2, made when node 1 was lost: node 0's epochs 5 and 6
    # (it pruned 3 and 4), and node 1's last copy (3 and 4): no checkpoint whole in it.
    s1, s2 = tmp_path / "1000", tmp_path / "2000"
    for seq in (3, 4):
        for rank in (0, 1):
            node_part(s1 / "run" / f"ckpt-{seq:06d}", rank, writers=[0, 1], save=f"s{seq}")
        node_part(s2 / "run" / f"ckpt-{seq:06d}", 1, writers=[0, 1], save=f"s{seq}")
    for seq in (5, 6):
        node_part(s2 / "run" / f"ckpt-{seq:06d}", 0, writers=[0, 1], save=f"s{seq}")
    assert shards.usable(s1)
    assert not shards.usable(s2)
    assert shards.newest_usable([s1, s2]) == s1
    assert shards.newest_usable([s2]) is None
    # one whole checkpoint is enough (the nodes load the newest whole one); nothing sharded
    # at all is nothing incomplete
    node_part(s2 / "run" / "ckpt-000004", 0, writers=[0, 1], save="s4")
    assert shards.newest_usable([s1, s2]) == s2
    (tmp_path / "3000" / "plain").mkdir(parents=True)
    assert shards.newest_usable([s1, s2, tmp_path / "3000"]) == tmp_path / "3000"


def test_snapshots_missing_a_lost_nodes_shards_never_push_out_the_last_whole_one(
    tmp_path: Path,
) -> None:
    """Two copies after a node was lost (keep 2) hold only the survivor's newer shards: the
    last snapshot whole on every rank is kept, for the recovery to resume from."""
    from cloudtrain.executors.local import LocalExecutor
    from cloudtrain.jobs.checkpoints import Kept

    n0, n1 = tmp_path / "n0", tmp_path / "n1"
    node_part(n0 / "ckpt-000001", 0, writers=[0, 1], save="a")
    node_part(n1 / "ckpt-000001", 1, writers=[0, 1], save="a")
    kept = Kept(tmp_path / "home", "j-1", keep=2)
    whole = kept.pull_sharded([(0, LocalExecutor(), str(n0)), (1, LocalExecutor(), str(n1))], _fail)
    assert whole is not None
    assert shards.usable(whole)
    for number in (2, 3):  # node 1 is gone; node 0 saves on, alone
        node_part(n0 / f"ckpt-00000{number}", 0, writers=[0, 1], save=f"s{number}")
        for old in n0.glob("ckpt-*"):
            if old.name != f"ckpt-00000{number}":
                for f in old.iterdir():
                    f.unlink()
                old.rmdir()
        kept.pull_sharded([(0, LocalExecutor(), str(n0))], _fail)
    assert len(kept.snapshots()) == 3
    assert shards.newest_usable(kept.snapshots()) == whole


def _fail(index: int, exc: Exception) -> None:
    pytest.fail(f"node {index}: {exc}")
