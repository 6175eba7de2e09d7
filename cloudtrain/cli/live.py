"""How a followed job is going, under its log stream: the step (of the total the script said),
steps/s, ETA, the last value of every metric it reports (`runtime.report`), each node's state.

On a terminal it is a rich ``Live`` panel below the log lines, redrawn twice a second; elsewhere
(a pipe, CI) the same words are a plain line on stderr, at most every `PLAIN_EVERY_S` and only
when they changed. `train --no-live` turns both off. It reads only what the follower already
keeps: the job's metrics copied home (`cloudtrain.jobs.metrics`) and its record in the state
(the step and node states of the last heartbeat), through its own connection: the panel draws
from rich's thread, and never slows the follower. The follower copies the metrics home each
second while the job prints (`cloudtrain.jobs.following.METRICS_S`), so the panel keeps pace
with the log. It is as wide as the terminal (`cloudtrain.cli.app.TerminalConsole`), which also
shows a hostile metric name's control characters escaped.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from cloudtrain.cli.app import App
from cloudtrain.jobs import metrics as kept

__all__ = ["PLAIN_EVERY_S", "following", "summary"]

log = logging.getLogger(__name__)

PLAIN_EVERY_S = 10.0
REFRESH_S = 0.5
#: The node states shown, and their colour.
STYLES = {"running": "green", "exited": "cyan", "cancelled": "yellow", "stopped": "yellow",
          "vanished": "red", "unreachable": "red"}  # fmt: skip


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def _rate(lines: Sequence[Mapping[str, Any]]) -> float | None:
    """Steps per second over the last attempt's lines of rank 0 (None before two of them)."""
    if not lines:
        return None
    attempt = lines[-1]["attempt"]
    mine = [ln for ln in lines if ln["attempt"] == attempt and not ln.get("rank")]
    if len(mine) < 2 or mine[-1]["at"] <= mine[0]["at"]:
        return None
    return float(mine[-1]["step"] - mine[0]["step"]) / float(mine[-1]["at"] - mine[0]["at"])


def summary(
    job_id: str, lines: Sequence[Mapping[str, Any]], detail: Mapping[str, Any]
) -> list[str]:
    """The panel's lines (plain words): the step and pace, the last metrics, the nodes."""
    last = kept.latest(lines)
    progress = detail.get("progress") or {}
    step = max(int(last.get("step") or 0), int(progress.get("step") or 0))
    total = last.get("total_steps")
    head = f"job {job_id} · step {step}"
    if isinstance(total, int) and total > 0:
        head += f"/{total} ({min(step, total) / total:.0%})"
    rate = _rate(lines)
    if rate:
        head += f" · {rate:.3g} steps/s"
        if isinstance(total, int) and total > step:
            head += f" · ETA {datetime.timedelta(seconds=round((total - step) / rate))}"
    shown = {k: v for k, v in last.items() if k not in (*kept.FIELDS, "total_steps")}
    words = [f"{k} {_number(v)}" for k, v in shown.items()]
    out = [head, "  ".join(words) if words else "no metrics yet (runtime.report)"]
    nodes = detail.get("nodes") or []
    ran_on = detail.get("ran_on") or list(range(len(nodes)))
    states = [f"node {i} {n.get('state', '?')}" for i, n in zip(ran_on, nodes, strict=False)]
    if states:
        out.append(" · ".join(states))
    return out


def _panel(lines: list[str]) -> Panel:
    body = [Text(lines[0], style="bold"), Text(lines[1])]
    if len(lines) > 2:
        nodes = Text()
        for i, part in enumerate(lines[2].split(" · ")):
            state = part.rsplit(" ", 1)[-1]
            nodes.append((" · " if i else "") + part, style=STYLES.get(state, ""))
        body.append(nodes)
    return Panel(Group(*body), expand=False, border_style="dim")


class _Reader:
    """What the panel shows, read from `home` (a connection of its own per read: the panel
    draws from rich's thread)."""

    def __init__(self, home: Path, job_id: str) -> None:
        self.home, self.job_id = home, job_id

    def lines(self) -> list[str]:
        from cloudtrain.state import State

        with State.open(self.home) as state:
            rec = state.job(self.job_id)
        return summary(self.job_id, kept.read(self.home, self.job_id), rec.detail if rec else {})


@contextlib.contextmanager
def following(app: App, job_id: str, *, live: bool = True) -> Iterator[None]:
    """Show how `job_id` goes while the block follows it (nothing when not `live`)."""
    if not live:
        yield
        return
    reader = _Reader(app.home, job_id)
    if app.out.is_terminal:
        with Live(
            get_renderable=lambda: _panel(reader.lines()),
            console=app.out,
            refresh_per_second=1 / REFRESH_S,
            redirect_stderr=False,
        ):
            try:
                yield
            except KeyboardInterrupt:
                # No node line may be printed while the panel stops: rich draws the panel
                # again under a line printed then (its hook does not ask whether it stopped),
                # with no newline after it, and the line saying what was stopped would be
                # written onto that frame's last line.
                app.stop_node_lines()
                raise
        return
    stop = threading.Event()

    def plain() -> None:
        said: list[str] = []
        while not stop.wait(PLAIN_EVERY_S):
            try:
                now = reader.lines()
            except Exception as exc:  # a panel never fails the command; the next try may read
                log.debug("live panel: %s: %s", type(exc).__name__, exc)
                continue
            if now[:2] != said[:2]:  # a new step or a new report
                app.note("cloudtrain: " + " | ".join(now))
            said = now

    thread = threading.Thread(target=plain, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
