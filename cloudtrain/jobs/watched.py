"""A managed job seen from any process: its one watcher (found by its lock, started detached
under its supervisor) and its logs across attempts, from the copies the watcher keeps. The
recovery itself is `cloudtrain.jobs.managed`; this module imports none of it, so that the
commands that only find, start or follow a watcher (``status``, ``logs -f``) stay light.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cloudtrain import locks
from cloudtrain.errors import NotFoundError
from cloudtrain.jobs import supervisor
from cloudtrain.spec import validate_job_id
from cloudtrain.state import JobRecord, State

#: The watcher's own output, beside the job's log copies.
WATCH_LOG = "watch.log"


@contextlib.contextmanager
def watching(home: Path, job_id: str) -> Iterator[bool]:
    """Hold the job's watcher lock for the block, if no other process holds it: yields whether
    this process is the job's watcher."""
    with locks.held_if_free(home, f"watch-{validate_job_id(job_id)}") as mine:
        yield mine


def watcher_pid(home: Path, job_id: str) -> int | None:
    """The pid of the job's live watcher, or None when none runs."""
    return locks.holder(home, f"watch-{validate_job_id(job_id)}")


def start_watcher(home: Path, job_id: str) -> int:
    """Start ``cloudtrain jobs watch JOB --supervise`` detached (its own session, no
    terminal): the watcher under its supervisor, which starts it again when it dies
    (`cloudtrain.jobs.supervisor`), their output in ``<home>/logs/<job>/watch.log``; the
    supervisor's pid."""
    folder = home / "logs" / job_id
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(folder / WATCH_LOG, "a") as out:
        proc = subprocess.Popen(
            [*supervisor.watch_argv(job_id), "--supervise"],
            env={**os.environ, "CLOUDTRAIN_HOME": str(home)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def unwatched(state: State, home: Path) -> list[str]:
    """The managed jobs still open that no watcher watches and no supervisor restarts (both
    died, or the machine restarted)."""
    return [
        rec.id
        for rec in state.jobs()
        if not rec.finished
        and rec.status != "pending"
        and rec.detail.get("managed")
        and watcher_pid(home, rec.id) is None
        and supervisor.supervisor_pid(home, rec.id) is None
    ]


def follow_copies(
    state: State,
    home: Path,
    job_id: str,
    on_line: Callable[[int, str], None],
    on_event: Callable[[str], None],
    *,
    poll_s: float = 0.2,
) -> JobRecord:
    """Stream a managed job's logs across its attempts, from the copies its watcher keeps,
    and its recovery events, until it ends. Blocks; Ctrl-C stops following only."""
    folder = home / "logs" / job_id
    offsets: dict[Path, int] = {}
    partial: dict[Path, bytes] = {}
    seen = max((e.id for e in state.events(job_id=job_id, limit=1)), default=0)
    while True:
        rec = state.job(job_id)
        if rec is None:
            raise NotFoundError(f"no job {job_id!r}")
        for event in state.events(job_id=job_id, limit=None):
            if event.id > seen and event.kind in ("recovery", "preemption", "down"):
                on_event(event.message)
            seen = max(seen, event.id)
        for copy in sorted(folder.glob("node-*.log")):
            with open(copy, "rb") as f:
                f.seek(offsets.get(copy, 0))
                chunk = f.read()
            offsets[copy] = offsets.get(copy, 0) + len(chunk)
            *lines, rest = (partial.pop(copy, b"") + chunk).split(b"\n")
            partial[copy] = rest
            index = int(copy.stem.split("-")[1])
            for line in lines:
                on_line(index, line.decode(errors="replace"))
        if rec.finished:
            for copy, rest in partial.items():
                if rest:
                    on_line(int(copy.stem.split("-")[1]), rest.decode(errors="replace"))
            return rec
        time.sleep(poll_s)
