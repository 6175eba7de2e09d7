"""The progress panel `train` shows under the logs (`cloudtrain.cli.live`): its words from a
recorded history, and the exact text of a frame as a terminal of 80 columns shows it."""

from __future__ import annotations

import contextlib
import io
import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from cloudtrain.cli import live
from cloudtrain.cli.app import App, TerminalConsole, console

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


def test_a_node_line_printed_as_ctrl_c_stops_the_panel_draws_no_frame_after_it(
    tmp_path: Path,
) -> None:
    """Node lines come from the followers' threads: one printed while the panel stopped made
    rich draw the panel again, with no newline, and the line after it (what Ctrl-C stopped)
    went onto that frame's last line. Once Ctrl-C is in, no node line is printed."""
    out = io.StringIO()
    term = TerminalConsole(file=out, width=80, force_terminal=True, force_interactive=True)
    app = App(home=tmp_path, out=term, err=term)
    printing = threading.Event()

    def lines() -> None:
        while app._nodes_heard:
            app.node_line(1, "tick")
            printing.set()

    for _ in range(20):  # the race is a window of a few statements: give it many tries
        app._nodes_heard, printing = True, threading.Event()
        thread = threading.Thread(target=lines, daemon=True)
        with contextlib.suppress(KeyboardInterrupt), live.following(app, "j-1"):
            thread.start()
            printing.wait(5)
            raise KeyboardInterrupt
        app.stop_node_lines()  # as `train` does, before it says what it stopped
        thread.join(5)
        # the panel's end shows the cursor again: no frame may be drawn after it
        after = out.getvalue().rsplit("\x1b[?25h", 1)[1]
        assert "╭" not in after, after[:400]
        out.seek(0)
        out.truncate()
