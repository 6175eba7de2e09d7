"""The CLI's one context object: where state lives, the consoles, lazily opened resources.

Everything environmental is an attribute, so tests build an `App` with their own home folder
and consoles and compare exact text.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from cloudtrain.jobs.coordinator import Coordinator
    from cloudtrain.model import Event
    from cloudtrain.state import State


def _console(stream: TextIO) -> Console:
    """A console on `stream`; wide when it is not a terminal, so piped tables are not cut."""
    width = None if stream.isatty() else 160
    return Console(file=stream, highlight=False, width=width)


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


@dataclass
class App:
    home: Path
    out: Console = field(default_factory=lambda: _console(sys.stdout))
    err: Console = field(default_factory=lambda: _console(sys.stderr))
    json: bool = False
    #: `train` shows how its job goes under the logs (`cloudtrain.cli.live`); --no-live: not
    live: bool = True
    _state: State | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

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
            else api.provider(registry.DEFAULT, self.home)
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
        self.err.print(Text(f"  {where}{event.message}", style="dim"))

    def node_line(self, index: int, line: str) -> None:
        """One line of a node's log, prefixed ``[node i]``, its control characters shown
        escaped (a node must not drive this terminal: clipboard writes, titles, cursor
        moves); thread-safe."""
        prefix = Text(f"[node {index}] ", style=NODE_STYLES[index % len(NODE_STYLES)])
        with self._lock:
            self.out.print(prefix + Text(escape_controls(line)), soft_wrap=True)
