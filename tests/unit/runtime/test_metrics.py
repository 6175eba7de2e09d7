"""What a script reports (`runtime.report`), and its way home: the node's whole lines from an
offset (`python -m cloudtrain.node metrics`), the copy that takes them up where it stopped, and
the merge `cloudtrain metrics` prints (`cloudtrain.jobs.metrics`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from cloudtrain import runtime
from cloudtrain.jobs import metrics as kept
from cloudtrain.node import whole_lines
from cloudtrain.runtime import progress


@pytest.fixture
def run_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    monkeypatch.setenv("CLOUDTRAIN_RUN_DIR", str(folder))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(progress, "_step", 0)
    return folder


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(t) for t in path.read_text().splitlines()]


def test_rank_0_writes_a_line_per_report_the_others_only_when_asked(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime.report(total_steps=10)
    for _ in range(3):
        runtime.step()
    runtime.report(loss=torch.tensor(0.5), acc=1, lr=float("nan"))
    runtime.report(step=7, samples_s=812.5)
    monkeypatch.setenv("RANK", "3")
    assert runtime.report(loss=9.0) is None
    runtime.report(loss=0.25, all_ranks=True)
    written = lines(run_dir / "metrics.jsonl")
    assert [{k: v for k, v in ln.items() if k != "at"} for ln in written] == [
        {"step": 0, "rank": 0, "total_steps": 10},
        {"step": 3, "rank": 0, "loss": 0.5, "acc": 1, "lr": None},
        {"step": 7, "rank": 0, "samples_s": 812.5},
        {"step": 3, "rank": 3, "loss": 0.25},
    ]
    assert all(isinstance(ln["at"], float) for ln in written)


def test_a_value_that_is_not_a_number_is_refused_naming_it(run_dir: Path) -> None:
    with pytest.raises(TypeError, match=r"runtime.report: loss='low' is not a number"):
        runtime.report(loss="low")
    with pytest.raises(TypeError, match=r"'rank' is the line's own"):
        runtime.report(rank=2)
    assert not (run_dir / "metrics.jsonl").exists()


def test_without_cloudtrain_nothing_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CLOUDTRAIN_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert runtime.report(step=1, loss=1.0) is not None
    assert list(tmp_path.iterdir()) == []


def test_ranks_appending_at_once_never_interleave(run_dir: Path) -> None:
    """Four processes, 200 reports each with a long line: every line whole."""
    code = (
        "import os, sys; from cloudtrain.runtime.metrics import report\n"
        "for i in range(200): report(step=i, all_ranks=True, **{f'm{j}': j * 1.5 for j in "
        "range(40)})\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": str(r)})
        for r in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    written = lines(run_dir / "metrics.jsonl")
    assert len(written) == 800
    assert sorted({ln["rank"] for ln in written}) == [0, 1, 2, 3]  # type: ignore[type-var]


def test_the_node_gives_whole_lines_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert whole_lines(path, 0) == b""
    path.write_bytes(b'{"step":1}\n{"step":2}\n{"ste')
    assert whole_lines(path, 0) == b'{"step":1}\n{"step":2}\n'
    assert whole_lines(path, 11) == b'{"step":2}\n'
    assert whole_lines(path, 22) == b"", "a torn last line waits for its end"
    assert whole_lines(path, 0, limit=4) == b'{"step":1}\n', "a line longer than the limit"
    done = subprocess.run([sys.executable, "-m", "cloudtrain.node", "metrics", str(tmp_path),
                           "--offset", "11"], capture_output=True, check=True)  # fmt: skip
    assert done.stdout == b'22\n{"step":2}\n', "the offset after what it sends, first"


def test_the_copy_takes_up_where_it_stopped_and_two_at_once_copy_each_line_once(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node.jsonl"
    node.write_text("".join(json.dumps({"step": i, "at": i, "rank": 0}) + "\n" for i in range(50)))
    copy = kept.copy_path(tmp_path / "home", "j-1", 0, 1)

    def fetch(offset: int) -> str:  # as the node agent answers, a few lines per call
        data = whole_lines(node, offset, limit=100)
        return f"{offset + len(data)}\n{data.decode()}"

    threads = [threading.Thread(target=kept.pull, args=(copy, fetch)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lines(copy) == lines(node)
    with node.open("a") as f:
        f.write(json.dumps({"step": 50, "at": 50, "rank": 0}) + "\n")
    assert kept.pull(copy, fetch) == 1
    assert oct(copy.stat().st_mode & 0o777) == "0o600"


def test_read_merges_attempts_and_nodes_in_time_and_keeps_only_names_and_numbers(
    tmp_path: Path,
) -> None:
    home = tmp_path
    written: list[tuple[int, int, list[object]]] = [
        (0, 0, [{"step": 1, "at": 1.0, "rank": 0, "loss": 2.0}, "not json",
                {"step": 2, "at": 3.0, "rank": 0, "loss": 1.5}]),
        (0, 1, [{"step": 1, "at": 2.0, "rank": 1, "loss": 2.2}]),
        (1, 0, [{"step": 2, "at": 9.0, "rank": 0, "loss": 1.0, "=cmd()": 1,
                 "note": "\x1b]52;c;evil\x07", "\x1b[2J": 3, "ok": True}]),
    ]  # fmt: skip
    for attempt, node, rows in written:
        path = kept.copy_path(home, "j-1", attempt, node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    merged = kept.read(home, "j-1")
    assert [(ln["attempt"], ln["step"], ln["rank"]) for ln in merged] == [
        (0, 1, 0), (0, 1, 1), (0, 2, 0), (1, 2, 0),
    ]  # fmt: skip
    assert merged[-1] == {"attempt": 1, "step": 2, "at": 9.0, "rank": 0, "loss": 1.0}
    assert kept.columns(merged) == ["attempt", "step", "at", "rank", "loss"]
    assert kept.latest(merged)["loss"] == 1.0
    assert not math.isnan(kept.latest(merged)["at"])


def test_a_node_that_never_stops_answering_fills_the_copy_to_its_bound_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kept, "MAX_COPY", 64 << 10)
    copy = kept.copy_path(tmp_path, "j-1", 0, 0)
    calls = []

    def liar(offset: int) -> str:  # always "more", from an offset that always moves on
        calls.append(offset)
        return f"{offset + 1}\n" + '{"step": 1, "loss": 0.5}\n' * 1000

    kept.pull(copy, liar)
    assert copy.stat().st_size <= 64 << 10
    assert len(calls) < 5
    assert kept.pull(copy, liar) == 0, "a full copy asks the node nothing more"
    assert len(calls) < 5


def test_a_copy_cut_after_its_lines_and_before_its_mark_adds_each_line_once(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node.jsonl"
    node.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(10)))
    copy = kept.copy_path(tmp_path / "home", "j-1", 0, 1)

    def fetch(offset: int) -> str:
        data = whole_lines(node, offset)
        return f"{offset + len(data)}\n{data.decode()}"

    assert kept.pull(copy, fetch) == 10
    with copy.open("ab") as cut:  # a process killed after writing, before its mark
        cut.write(b'{"step":10}\n')
    with node.open("a") as f:
        f.write(json.dumps({"step": 10}) + "\n")
    assert kept.pull(copy, fetch) == 1
    assert [ln["step"] for ln in lines(copy)] == list(range(11))
