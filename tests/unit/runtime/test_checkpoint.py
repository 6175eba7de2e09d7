"""save_checkpoint / load_checkpoint: atomic, written by LOCAL_RANK 0 only, clear on corruption."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch

from cloudtrain.errors import CloudtrainError
from cloudtrain.runtime import (
    CheckpointError,
    checkpoint_dir,
    load_checkpoint,
    save_checkpoint,
)
from cloudtrain.runtime import checkpoint as ckpt_mod


class Opaque:
    """Not a type weights_only loading allows."""


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No torchrun env; record the barriers instead of needing a process group."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CLOUDTRAIN_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    calls: list[str] = []
    monkeypatch.setattr(ckpt_mod, "barrier", lambda: calls.append("barrier"))
    return calls


def state(epoch: int) -> dict[str, Any]:
    return {"model": {"w": torch.full((2, 3), float(epoch))}, "epoch": epoch, "lr": 0.1}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "last.pt")


def test_round_trip_creates_the_folder_and_loads_to_cpu(
    tmp_path: Path, single_process: list[str]
) -> None:
    path = tmp_path / "deep" / "er" / "last.pt"
    save_checkpoint(path, state(3))
    loaded = load_checkpoint(path)
    assert loaded is not None
    assert loaded["epoch"] == 3
    assert loaded["lr"] == 0.1
    assert torch.equal(loaded["model"]["w"], torch.full((2, 3), 3.0))
    assert loaded["model"]["w"].device.type == "cpu"
    assert leftovers(path.parent) == []
    assert single_process == ["barrier"]


def test_a_missing_file_loads_as_none(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path / "nope.pt") is None


def test_saving_again_replaces_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(str(path), state(1))
    save_checkpoint(str(path), state(2))
    loaded = load_checkpoint(str(path))
    assert loaded is not None
    assert loaded["epoch"] == 2
    assert torch.equal(loaded["model"]["w"], torch.full((2, 3), 2.0))
    assert leftovers(tmp_path) == []


def test_a_failed_rename_keeps_the_old_checkpoint_and_removes_the_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single_process: list[str]
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, state(1))

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, state(2))
    loaded = load_checkpoint(path)
    assert loaded is not None
    assert loaded["epoch"] == 1
    assert leftovers(tmp_path) == []
    assert single_process == ["barrier", "barrier"]  # the other ranks are not left waiting


def test_a_crash_mid_write_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, state(1))

    def half_save(obj: object, f: BinaryIO) -> None:
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", half_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, state(2))
    monkeypatch.undo()
    loaded = load_checkpoint(path)
    assert loaded is not None
    assert loaded["epoch"] == 1
    assert leftovers(tmp_path) == []


def test_a_stale_temp_file_from_a_killed_writer_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    stale = tmp_path / ".last.pt.abc123.tmp"
    stale.write_bytes(b"partial")
    assert load_checkpoint(path) is None
    save_checkpoint(path, state(4))
    loaded = load_checkpoint(path)
    assert loaded is not None
    assert loaded["epoch"] == 4


@pytest.mark.parametrize("local_rank", ["1", "3"])
def test_only_local_rank_zero_writes_but_every_rank_meets_the_barrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single_process: list[str], local_rank: str
) -> None:
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("RANK", "5")
    save_checkpoint(tmp_path / "last.pt", state(1))
    assert list(tmp_path.iterdir()) == []
    assert single_process == ["barrier"]


def test_local_rank_zero_of_another_node_writes_its_own_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "8")
    save_checkpoint(tmp_path / "last.pt", state(1))
    assert (tmp_path / "last.pt").is_file()


@pytest.mark.parametrize(
    "content",
    [b"", b"definitely not a checkpoint", b"PK\x03\x04 truncated zip", b"\x80\x02}q\x00."],
    ids=["empty", "garbage", "truncated-zip", "bare-pickle"],
)
def test_a_corrupt_file_is_an_error_naming_the_path(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "last.pt"
    path.write_bytes(content)
    with pytest.raises(
        CheckpointError, match="corrupt, truncated or not a torch checkpoint"
    ) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, CloudtrainError)
    assert info.value.path == path


def test_a_truncated_real_checkpoint_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, state(1))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="corrupt, truncated"):
        load_checkpoint(path)


def test_arbitrary_objects_are_refused_not_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    torch.save({"obj": Opaque()}, path)
    with pytest.raises(CheckpointError, match=r"test_checkpoint\.Opaque, which weights_only"):
        load_checkpoint(path)


def test_a_file_that_is_not_a_dict_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="holds a list, expected a dict"):
        load_checkpoint(path)


def test_checkpoint_dir_comes_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert checkpoint_dir() == Path("checkpoints")
    monkeypatch.setenv("CLOUDTRAIN_CHECKPOINT_DIR", "/mnt/ckpt")
    assert checkpoint_dir() == Path("/mnt/ckpt")
