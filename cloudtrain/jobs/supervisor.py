"""A managed job's watcher, started again when it dies, with no command of the user's.

`watched.start_watcher` starts the supervisor detached (``cloudtrain jobs watch JOB
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
watcher knows by design. The wait doubles from 1 s to 30 s, and is back to 1 s after
a watcher that lived a minute. After `GIVE_UP` deaths in a row, each
sooner than `HEALTHY_S` after its start (a crash on every start), it ends and says so in the
watch log: the next command (``status``, ``logs``) starts it again. The loop is the node
agent's supervisor's too (`cloudtrain.node.restarts`).

One supervisor per job: it holds ``<home>/locks/supervise-<job>.lock`` (`supervisor_pid`).
SIGTERM stops the watcher and the supervisor. A supervisor killed leaves its watcher going;
when both are gone (the machine restarted), the next command starts both
(`watched.unwatched`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cloudtrain import locks
from cloudtrain.node import restarts
from cloudtrain.spec import validate_job_id

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
        return restarts.supervise(child, f"the watcher of {job_id}", say, is_open=is_open,
                                  give_up=GIVE_UP,
                                  after_give_up=" (the next `cloudtrain status` does)")  # fmt: skip
