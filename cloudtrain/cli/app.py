"""The CLI's one context object: where state lives, the consoles, lazily opened resources.

Everything environmental is an attribute, so tests build an `App` with their own home folder
and consoles (`TerminalConsole`) and compare exact text.

Text from a node (its logs, a failure's tail, a phase name from its ``status.json``, a metric's
name, an error that quotes it) is untrusted: it must never drive the terminal (an OSC 52
clipboard write, a window title, cursor moves). The one place it is made safe is the consoles'
`TerminalConsole.render`, which every line printed through `App.out` and `App.err` passes
(plain strings, `Text`, tables, panels, the live panel): each control character is shown as
its escape there, whichever command printed it. No command escapes on its own.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

if TYPE_CHECKING:
    from cloudtrain.jobs.coordinator import Coordinator
    from cloudtrain.model import Event
    from cloudtrain.state import State


NODE_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red")


#: C0 (but tab and newline), DEL and C1 control characters, each to its Python escape
#: (``\\x1b``); a carriage return (a progress bar redrawing itself) is dropped, as rich would.
_CONTROLS: dict[int, str] = {
    c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))
}
_CONTROLS[0x0D] = ""


def escape_controls(text: str) -> str:
    """`text` with every control character but tab and newline written as its escape, so
    what a node prints cannot reach the terminal as a command (a log tail keeps its lines)."""
    return text.translate(_CONTROLS)


class TerminalConsole(Console):
    """A rich console whose every rendered character of text is shown safe (`escape_controls`):
    rich's own control codes (styles, the live panel's cursor moves) are segments marked
    ``control`` and pass as they are. Unless a `width` is given, its width on a terminal is
    that terminal's own, read at each render (a resize is followed), before ``COLUMNS`` (a
    snapshot a shell may have exported long ago) or another stream's size; ``COLUMNS`` counts
    when the terminal reports no size."""

    def __init__(self, *, width: int | None = None, **options: Any) -> None:
        super().__init__(width=width, **options)
        self._given_width = width

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or segment.text.isprintable():
                yield segment
            else:
                yield Segment(escape_controls(segment.text), segment.style)

    def render_str(self, text: str, **options: Any) -> Text:
        """`text` as rich makes it a `Text`, its control characters escaped first: also those
        rich would drop unseen (a bell, a backspace) are shown."""
        return super().render_str(escape_controls(text), **options)

    @property
    def size(self) -> ConsoleDimensions:
        dimensions = super().size
        if self._given_width is not None:
            return dimensions
        try:
            columns = os.get_terminal_size(self.file.fileno()).columns
        except (AttributeError, ValueError, OSError):  # not a terminal (or no file number)
            return dimensions
        return ConsoleDimensions(columns or dimensions.width, dimensions.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._given_width = self._width = new_size[0]
        self._height = new_size[1]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, and the one `line` that says what it stopped and what keeps running: the only
    thing the CLI prints of it (then it exits 130)."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def console(stream: TextIO) -> TerminalConsole:
    """A console on `stream`; wide when it is not a terminal, so piped tables are not cut;
    no ``:name:`` in what it prints becomes an emoji (a node's text is shown as it is)."""
    width = None if stream.isatty() else 160
    return TerminalConsole(file=stream, highlight=False, emoji=False, width=width)


@dataclass
class App:
    home: Path
    out: TerminalConsole = field(default_factory=lambda: console(sys.stdout))
    err: TerminalConsole = field(default_factory=lambda: console(sys.stderr))
    json: bool = False
    #: `train` shows how its job goes under the logs (`cloudtrain.cli.live`); --no-live: not
    live: bool = True
    _state: State | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _nodes_heard: bool = True

    @property
    def state(self) -> State:
        if self._state is None:
            from cloudtrain.state import State

            self._state = State.open(self.home)
        return self._state

    def coordinator(self, cluster: str) -> Coordinator:
        """A coordinator for jobs on `cluster` (which may be gone: its jobs' logs remain)."""
        from cloudtrain import api
        from cloudtrain.jobs.coordinator import Coordinator
        from cloudtrain.provision import registry

        record = self.state.cluster(cluster)
        provider = (
            api.provider_for(record.spec, self.home)
            if record
            else api.provider(registry.default(), self.home)
        )
        return Coordinator(self.state, provider, home=self.home)

    def close(self) -> None:
        if self._state is not None:
            self._state.close()
            self._state = None

    def note(self, message: str) -> None:
        """A progress line on stderr (stdout stays for results and logs), never broken at the
        terminal's width: it may hold a path or a command to copy."""
        self.err.print(message, markup=False, soft_wrap=True)

    def event(self, event: Event) -> None:
        where = f"node {event.node}: " if event.node is not None else ""
        self.err.print(f"  {where}{event.message}", style="dim", markup=False, soft_wrap=True)

    def node_line(self, index: int, line: str) -> None:
        """One line of a node's log, prefixed ``[node i]`` (its control characters shown
        escaped, as everything `out` prints); thread-safe. None once `stop_node_lines`
        was called."""
        prefix = Text(f"[node {index}] ", style=NODE_STYLES[index % len(NODE_STYLES)])
        with self._lock:
            if not self._nodes_heard:
                return
            self.out.print(prefix + self.out.render_str(line, markup=False), soft_wrap=True)

    def stop_node_lines(self) -> None:
        """Print no more node lines (Ctrl-C: the followers still winding down are not heard;
        the line saying what was stopped is the last word)."""
        with self._lock:
            self._nodes_heard = False
