"""What a container runtime keeps a container's processes in: a cgroup, here cgroup v1's
``pids`` hierarchy, one group per container under one of this stand-in's.

A process the kubelet starts (a container's main process, an exec's) puts itself in its
container's group before it runs anything (`Groups.preexec`, between fork and exec), so every
process it starts is in it too, whatever session it moves to: a daemon that called ``setsid``
(a node agent, a warm server) dies with its pod, as on a real node, and a leak check sees it.
Where the hierarchy cannot be written (not root, no cgroup v1), there are no groups and the
kubelet falls back to the sessions it started (`members`), which a ``setsid`` escapes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

PIDS = Path("/sys/fs/cgroup/pids")


class Groups:
    """This stand-in's cgroups: one per container, below ``PIDS/NAME``."""

    def __init__(self, name: str) -> None:
        self.top: Path | None = PIDS / name
        try:
            self.top.mkdir()
        except OSError:
            self.top = None

    def path(self, key: str) -> Path | None:
        """The group of the container `key` (``NAMESPACE/POD/CONTAINER``), made if need be."""
        if self.top is None:
            return None
        group = self.top / key.replace("/", "_")
        with contextlib.suppress(FileExistsError):
            group.mkdir()
        return group

    def preexec(self, key: str) -> tuple[Callable[[], None] | None, Callable[[], None]]:
        """What a new process runs before its program (it joins the group of `key`), and what
        the caller runs once it started (closes the group's file here)."""
        group = self.path(key)
        if group is None:
            return None, lambda: None
        fd = os.open(group / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

        def join() -> None:  # in the child: no lock, no import, no allocation to speak of
            os.write(fd, b"%d" % os.getpid())

        return join, lambda: os.close(fd)

    def pids(self, prefix: str = "") -> list[int]:
        """The live processes of the groups whose key starts with `prefix` (all: "")."""
        found: list[int] = []
        for group in self._groups(prefix):
            with contextlib.suppress(OSError):
                found += [int(p) for p in (group / "cgroup.procs").read_text().split()]
        return found

    def kill(self, prefix: str = "", timeout: float = 10) -> None:
        """SIGKILL to every process of the groups of `prefix`, until none is left; then the
        groups go."""
        deadline = time.monotonic() + timeout
        while (left := self.pids(prefix)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        for group in self._groups(prefix):
            with contextlib.suppress(OSError):
                group.rmdir()

    def close(self) -> None:
        self.kill()
        if self.top is not None:
            with contextlib.suppress(OSError):
                self.top.rmdir()

    def _groups(self, prefix: str) -> Iterator[Path]:
        if self.top is None:
            return
        wanted = prefix.replace("/", "_")
        for group in sorted(self.top.iterdir()) if self.top.is_dir() else []:
            if group.is_dir() and group.name.startswith(wanted):
                yield group
