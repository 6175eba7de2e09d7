"""Checkpoints kept on the user's machine: whole snapshots only, the newest few, each left as
it was when a later copy changes a file (the local executor's copy, as rsync's, writes new
files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudtrain.errors import NotFoundError
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.jobs import checkpoints


def test_a_snapshot_per_change_the_newest_kept_and_each_left_as_it_was(tmp_path: Path) -> None:
    node = tmp_path / "node" / "checkpoints"
    kept = checkpoints.Kept(tmp_path / "home", "c1-1")
    ex = LocalExecutor()
    assert kept.pull(ex, str(node)) is None, "no folder on the node yet"
    node.mkdir(parents=True)
    assert kept.pull(ex, str(node)) is None, "an empty folder is no checkpoint"
    (node / "model.pt").write_text("epoch 1")
    first = kept.pull(ex, str(node))
    assert first is not None
    assert kept.pull(ex, str(node)) == first, "nothing changed: no new snapshot"
    for epoch in (2, 3):
        (node / "model.pt").write_text(f"epoch {epoch}")
        os.utime(node / "model.pt", (epoch * 1000, epoch * 1000))
        newest = kept.pull(ex, str(node))
        assert newest is not None
        assert (newest / "model.pt").read_text() == f"epoch {epoch}"
    assert len(kept.snapshots()) == checkpoints.KEEP
    assert not first.exists(), "the oldest went"
    older = kept.snapshots()[0]
    assert (older / "model.pt").read_text() == "epoch 2", "a later copy left it as it was"
    assert kept.required() == kept.newest()


def test_a_job_with_nothing_kept_is_named(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="job c1-9 has no checkpoint kept here"):
        checkpoints.Kept(tmp_path, "c1-9").required()


def test_a_node_folder_is_the_jobs_override_or_its_roots() -> None:
    assert checkpoints.node_folder("/n/root", None) == "/n/root/checkpoints"
    assert checkpoints.node_folder("/n/root", "/data/ckpt") == "/data/ckpt"
