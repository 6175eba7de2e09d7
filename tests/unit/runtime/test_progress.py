"""The step counter a job's progress is read from: written where the coordinator reads it,
carried through a checkpoint, and where a resumed process started counting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain import runtime
from cloudtrain.runtime import progress


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name, value in (("_step", 0), ("_resumed_from", None), ("_written", 0.0), ("_saved", None)):
        monkeypatch.setattr(progress, name, value)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("CLOUDTRAIN_RUN_DIR", str(run_dir))
    monkeypatch.setenv("LOCAL_RANK", "0")
    return run_dir


def read(run_dir: Path) -> dict[str, object]:
    return dict(json.loads((run_dir / "progress.json").read_text()))


def test_steps_are_counted_and_written_at_most_once_a_second(fresh: Path) -> None:
    assert [runtime.step() for _ in range(3)] == [1, 2, 3]
    assert read(fresh)["step"] == 1, "the first is written, the next two within the second"
    progress.write()
    assert read(fresh) == {"step": 3, "at": read(fresh)["at"], "resumed_from": None, "saved": None}


def test_a_checkpoint_carries_the_count_and_a_resumed_process_goes_on_from_it(
    fresh: Path, tmp_path: Path
) -> None:
    for _ in range(5):
        runtime.step()
    path = tmp_path / "ckpt.pt"
    runtime.save_checkpoint(path, {"epoch": 1})
    assert read(fresh)["step"] == 5, "a checkpoint writes the count"
    saved = read(fresh)["saved"]
    assert isinstance(saved, dict), "and the marker that brings the checkpoint home"
    assert (saved["step"], saved["count"]) == (5, 1)
    for _ in range(4):
        runtime.step()  # work after the checkpoint: lost with the node
    progress._step = 0  # a new process (the next attempt)
    assert runtime.load_checkpoint(path) == {"epoch": 1}, "the count is cloudtrain's, not yours"
    assert progress.current() == 5
    assert read(fresh)["resumed_from"] == 5
    assert runtime.step() == 6


def test_nothing_is_written_by_other_local_ranks_or_outside_cloudtrain(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    runtime.step()
    progress.write()
    assert not (fresh / "progress.json").exists()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("CLOUDTRAIN_RUN_DIR")
    progress.write()
    assert not (fresh / "progress.json").exists()
