"""The CLI's consoles (`cloudtrain.cli.app.TerminalConsole`): the one place every line of a
node's text passes on its way to the terminal, whatever renders it, and the terminal's own
width."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import struct
import termios
from pathlib import Path

import pytest
from rich.console import RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cloudtrain.cli.app import App, TerminalConsole, console
from cloudtrain.model import Event
from tests.conftest import Cli

HOSTILE = "boom \x1b]52;c;b3duZWQ=\x07 \x1b]0;owned\x07 \x9b2J\x08"
SHOWN = "boom \\x1b]52;c;b3duZWQ=\\x07 \\x1b]0;owned\\x07 \\x9b2J\\x08"


def table() -> Table:
    grid = Table()
    grid.add_column("phase")
    grid.add_row(Text(HOSTILE))
    return grid


@pytest.mark.parametrize(
    "renderable",
    [HOSTILE, Text(HOSTILE), Panel(Text(HOSTILE)), table()],
    ids=["str", "text", "panel", "table"],  # the same on every xdist worker
)
def test_no_control_character_of_a_node_reaches_the_terminal(renderable: RenderableType) -> None:
    out = io.StringIO()
    terminal = TerminalConsole(
        file=out, force_terminal=True, color_system="standard", width=200, highlight=False
    )
    terminal.print(renderable, Text(" ok", style="red"), markup=False)
    shown = out.getvalue()
    assert "\x1b[31m ok\x1b[0m" in shown  # rich's own styles still reach it
    assert "\x1b]" not in shown
    assert "\x9b" not in shown
    assert "\x07" not in shown
    assert "\x08" not in shown
    assert "\\x1b]52;c;b3duZWQ=" in shown


def test_the_apps_lines_of_node_text_show_it_escaped(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    app = App(home=tmp_path, out=console(out), err=console(err))
    app.node_line(0, HOSTILE)
    app.note(f"last lines of node 0:\n{HOSTILE}")
    app.event(Event("bootstrap", f"{HOSTILE}: ready", node=1))
    assert out.getvalue() == f"[node 0] {SHOWN}\n"
    assert err.getvalue() == (f"last lines of node 0:\n{SHOWN}\n  node 1: {SHOWN}: ready\n")
    app.stop_node_lines()  # Ctrl-C: what followers still read is not heard
    app.node_line(0, "late")
    assert out.getvalue() == f"[node 0] {SHOWN}\n"


def test_the_width_is_the_terminals_own_not_a_stale_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "72")
    parent, child = pty.openpty()
    try:
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        with os.fdopen(os.dup(child), "w") as stream:
            assert console(stream).width == 200
            fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 0, 0, 0))
            assert console(stream).width == 72  # a terminal that reports no size: COLUMNS
    finally:
        os.close(parent)
        os.close(child)
    assert console(io.StringIO()).width == 160  # a pipe: wide, so tables are not cut


def test_a_warning_that_quotes_a_node_is_shown_escaped(
    run_cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without -v a warning is a plain line (as Python's last resort shows it), through the
    same console: one quoting a node's error (a metrics copy that failed) does not go raw."""
    assert run_cli("status").exit_code == 0  # the CLI sets up its logging
    capsys.readouterr()
    logging.getLogger("cloudtrain.jobs.coordinator").warning("node 0 said: %s", HOSTILE)
    assert capsys.readouterr().err == f"node 0 said: {SHOWN}\n"
