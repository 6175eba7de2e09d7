"""A followed job's checkpoints brought home as each save completes, not on a timer alone.

The runtime's saves (`runtime.save_checkpoint`, `runtime.save_sharded`) leave a completion
marker once a checkpoint is whole on a node: ``"saved"`` in the attempt's ``progress.json``
(`cloudtrain.runtime.progress.saved`). While a job is followed, `HomeCopies.tick` (called from
the coordinator's loop, which it never blocks) reads that marker every `CHECK_S` on the nodes a
pull reads (the head; every node of a sharded job) and, once it changed, brings the
checkpoints home (and to the job's bucket) at once, so that losing every node costs the steps
since the newest save, about one checkpoint interval, not the copy's 30 s on top. The copy
every `checkpoint_pull_s()` stays, for scripts that save their own way::

    tick ──► no round running, CHECK_S since the last ──► a round, in a thread of its own:
               read the markers ── changed, or the timer is due ──► pull (the coordinator's)

One round at a time: a marker that changes while a pull runs is seen by the next round.
What a pull copies is only what is whole: in-progress temp files and folders stay on the
node (`cloudtrain.executors.received.IN_PROGRESS`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from cloudtrain.executors.base import Executor
from cloudtrain.jobs.attempts import checkpoint_pull_s, run_dir
from cloudtrain.model import NodeInfo
from cloudtrain.state import JobRecord

log = logging.getLogger(__name__)

#: How often the nodes' save markers are read while a job is followed.
CHECK_S = 1.0
#: The most of a node's progress.json read (a node's file is untrusted; the real one is tiny).
MARKER_BYTES = 64 * 1024


def marker(ex: Executor, folder: str) -> dict[str, Any] | None:
    """The save marker in the attempt's folder `folder` on a node (None: no save finished
    there yet, the node did not answer, or its file is no marker). Blocks for one command on
    the node."""
    done = ex.run(["head", "-c", str(MARKER_BYTES), f"{folder}/progress.json"], timeout=30)
    if done.returncode != 0:
        return None
    try:
        found = json.loads(done.stdout)
    except ValueError:
        return None
    saved = found.get("saved") if isinstance(found, dict) else None
    return dict(saved) if isinstance(saved, dict) else None


class HomeCopies:
    """Pulls of one attempt's checkpoints: when a save completes, and every `every_s`.

    `nodes` are the attempt's (in the order a pull reads them), `executor` reaches one, `pull`
    brings the checkpoints home (it logs what fails; what it raises is logged here), `lost`
    (read at each round) the nodes left out."""

    def __init__(
        self,
        rec: JobRecord,
        nodes: Sequence[NodeInfo],
        executor: Callable[[NodeInfo], Executor],
        pull: Callable[[], object],
        *,
        lost: Collection[int] = (),
        every_s: float | None = None,
        check_s: float = CHECK_S,
    ) -> None:
        sharded = (rec.detail.get("spec") or {}).get("strategy") == "fsdp"
        self._readers = list(nodes) if sharded else list(nodes[:1])
        self._folders = {n.index: run_dir(n, rec) for n in nodes}
        self._executor, self._pull, self._lost = executor, pull, lost
        self.every_s = checkpoint_pull_s() if every_s is None else every_s
        self.check_s = check_s
        self._seen: list[Mapping[str, Any]] | None = None
        self._next_check = 0.0
        self._next_pull = time.monotonic() + self.every_s
        self._round: threading.Thread | None = None

    def tick(self) -> None:
        """Start a round unless one runs or the last began under `check_s` ago. Never blocks."""
        now = time.monotonic()
        if now < self._next_check or (self._round is not None and self._round.is_alive()):
            return
        self._next_check = now + self.check_s
        timer = now >= self._next_pull
        self._round = threading.Thread(target=self._run, args=(timer,), daemon=True)
        self._round.start()

    def _markers(self) -> list[Mapping[str, Any]] | None:
        """Every reader's marker, or None while one has none (a sharded checkpoint is whole
        when every node's save is)."""
        found: list[Mapping[str, Any]] = []
        for node in self._readers:
            if node.index in self._lost:
                return None
            saved = marker(self._executor(node), self._folders[node.index])
            if saved is None:
                return None
            found.append(saved)
        return found or None

    def _run(self, timer: bool) -> None:
        try:
            found = self._markers()
        except Exception as exc:  # a node that cannot be reached: the next round asks again
            log.debug("could not read the save markers: %s", exc)
            found = None
        saved = found is not None and found != self._seen
        if not (saved or timer):
            return
        self._seen = found if saved else self._seen
        self._next_pull = time.monotonic() + self.every_s
        try:
            self._pull()
        except Exception as exc:  # the pull logs its own failures; this is the unexpected
            log.warning("could not bring the checkpoints home: %s", exc)

    def close(self) -> None:
        """Wait for the round that runs, if any (the caller's last pull comes after it)."""
        if self._round is not None:
            self._round.join()
