"""A managed job's watcher, started again when it dies, with no command of the user's.

`managed.start_watcher` starts the supervisor detached (``cloudtrain jobs watch JOB
--supervise``); it runs the watcher (``cloudtrain jobs watch JOB``) as its child and starts it
again whenever it ends while the job is still open: killed (SIGKILL, the OOM killer) or crashed
(an unexpected exception, exit 5)::

    supervisor ──► watcher ──► exits 0 (the job ended; another watcher has it) ──► ends
        ▲             │
        │             └─► dies any other way ──► the job still open? ── no ──► ends
        │                                                │ yes
        └─────────────── waits 1 s, 2 s … 30 s ◄─────────┘

A process of its own, not a ``try`` around the watcher's loop: a loop does not outlive its own
process (a SIGKILL, the OOM killer), and after an unexpected exception the process's threads,
connections and locks are in no known state. A new watcher starts from the job's record, all a
watcher knows by design. The wait doubles from `RESTART_S` to `MAX_RESTART_S`, and is back to
`RESTART_S` after a watcher that lived `HEALTHY_S`. After `GIVE_UP` deaths in a row, each
sooner than `HEALTHY_S` after its start (a crash on every start), it ends and says so in the
watch log: the next command (``status``, ``logs``) starts it again.

One supervisor per job: it holds ``<home>/locks/supervise-<job>.lock`` (`supervisor_pid`).
SIGTERM stops the watcher and the supervisor. A supervisor killed leaves its watcher going;
when both are gone (the machine restarted), the next command starts both
(`managed.unwatched`).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cloudtrain import locks
from cloudtrain.spec import validate_job_id

#: The first wait before a dead watcher is started again; doubled after each quick death.
RESTART_S, MAX_RESTART_S = 1.0, 30.0
#: A watcher that lived this long was working: its death is not counted as a crash loop.
HEALTHY_S = 60.0
#: Quick deaths in a row after which the supervisor ends (the next command starts it again).
GIVE_UP = 10


def watch_argv(job_id: str) -> list[str]:
    """The watcher's command line (in the foreground, as the supervisor's child)."""
    return [sys.executable, "-m", "cloudtrain.cli", "jobs", "watch", validate_job_id(job_id)]


def _key(job_id: str) -> str:
    return f"supervise-{validate_job_id(job_id)}"


def supervisor_pid(home: Path, job_id: str) -> int | None:
    """The pid of the job's live supervisor, or None when none runs."""
    return locks.holder(home, _key(job_id))


def supervise(
    home: Path,
    job_id: str,
    child: Sequence[str],
    is_open: Callable[[], bool],
    say: Callable[[str], None],
) -> int:
    """Run `child` (the watcher), again after each death while `is_open()` (the job's record
    says it has not ended). Blocks; returns 0 when it ends, 1 when it gave up. Returns at
    once when another supervisor has the job."""
    with locks.held_if_free(home, _key(job_id)) as mine:
        if not mine:
            return 0
        stopping = threading.Event()
        current: list[subprocess.Popen[bytes]] = []

        def on_term(signum: int, frame: object) -> None:
            stopping.set()
            for proc in current:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()

        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            return _loop(job_id, child, is_open, say, stopping, current)
        finally:
            signal.signal(signal.SIGTERM, previous)


def _loop(
    job_id: str,
    child: Sequence[str],
    is_open: Callable[[], bool],
    say: Callable[[str], None],
    stopping: threading.Event,
    current: list[subprocess.Popen[bytes]],
) -> int:
    delay, quick = RESTART_S, 0
    while not stopping.is_set():
        began = time.monotonic()
        proc = subprocess.Popen(child, stdin=subprocess.DEVNULL)
        current[:] = [proc]
        if stopping.is_set():  # a SIGTERM just before it started
            proc.terminate()
        code = proc.wait()
        if stopping.is_set() or code == 0 or not is_open():
            return 0
        lived = time.monotonic() - began
        delay, quick = (RESTART_S, 0) if lived >= HEALTHY_S else (delay, quick + 1)
        how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        if quick >= GIVE_UP:
            say(f"the watcher of {job_id} {how}: {quick} deaths in a row, each within "
                f"{HEALTHY_S:.0f} s of its start; not starting it again (the next "
                "`cloudtrain status` does)")  # fmt: skip
            return 1
        say(f"the watcher of {job_id} {how} after {lived:.0f} s; starting it again "
            f"in {delay:.0f} s")  # fmt: skip
        stopping.wait(delay)
        delay = min(delay * 2, MAX_RESTART_S)
    return 0
