"""The progress panel `train` shows under the logs (`cloudtrain.cli.live`): its words from a
recorded history, and the exact text of a frame as a terminal of 80 columns shows it."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from cloudtrain.cli import live
from cloudtrain.cli.app import console

LINES: list[dict[str, Any]] = [
    {"attempt": 0, "step": 0, "at": 100.0, "rank": 0, "total_steps": 120},
    {"attempt": 0, "step": 20, "at": 110.0, "rank": 0, "epoch": 1, "loss": 1.0980431,
     "test_acc": 0.925, "samples_s": 14494.31},
    {"attempt": 0, "step": 40, "at": 120.0, "rank": 0, "epoch": 2, "loss": 0.1646361,
     "test_acc": 0.9416667, "samples_s": 13503.8},
]  # fmt: skip
DETAIL = {
    "ran_on": [0, 1],
    "nodes": [{"state": "running", "exit_code": None}, {"state": "exited", "exit_code": 0}],
    "progress": {"step": 45},
}


def test_the_words_step_of_total_pace_eta_metrics_and_nodes() -> None:
    assert live.summary("demo-1", LINES, DETAIL) == [
        "job demo-1 · step 45/120 (38%) · 2 steps/s · ETA 0:00:38",
        "epoch 2  loss 0.1646  test_acc 0.9417  samples_s 13504",
        "node 0 running · node 1 exited",
    ]


def test_before_any_report_and_a_hostile_name_shown_escaped() -> None:
    assert live.summary("demo-1", [], {}) == [
        "job demo-1 · step 0",
        "no metrics yet (runtime.report)",
    ]
    hostile = [{"attempt": 0, "step": 1, "at": 1.0, "rank": 0, "x\x1b[2J": 1.0}]
    out = io.StringIO()
    console(out).print(live._panel(live.summary("j-1", hostile, {})))  # as `train` draws it
    assert "\x1b" not in out.getvalue()
    assert "│ x\\x1b[2J 1 " in out.getvalue()


def test_a_frame_as_a_terminal_shows_it() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False, color_system=None)
    console.print(live._panel(live.summary("demo-1", LINES, DETAIL)))
    assert out.getvalue() == (
        "╭──────────────────────────────────────────────────────────╮\n"
        "│ job demo-1 · step 45/120 (38%) · 2 steps/s · ETA 0:00:38 │\n"
        "│ epoch 2  loss 0.1646  test_acc 0.9417  samples_s 13504   │\n"
        "│ node 0 running · node 1 exited                           │\n"
        "╰──────────────────────────────────────────────────────────╯\n"
    )
