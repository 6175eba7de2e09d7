"""A `launch`'s workdir and setup, sent to each node while its bootstrap runs.

`launch` is `up`, then `train`; `train` begins by syncing the workdir to every node and running
the task's ``setup`` there. The sync needs nothing of the bootstrap but a node that answers;
the setup needs the node's Python with torch in it, not what the last phases make (``nccl``:
the network's NCCL settings; ``verify``: the check that torch sees the GPUs). So a `Stager`
taps `up`'s events: the first status a node reports starts a thread of its own that syncs the
workdir while the bootstrap installs (torch takes minutes), then runs the setup as soon as the
node says it is past its ``torch`` phase, while the other nodes and the last phases go on. The
job's submit does the same two steps again, and they cost nothing then: the sync moves only
what changed, and the setup is skipped when its marker says the same script already succeeded
there (`run_setup`).

Staging is a head start, never a second way to fail: a node whose staging fails is logged
and left to the submit, which runs the setup again and reports its failure as it always has;
a setup waits for torch (a setup's ``pip install`` beside the torch phase's could fight over
the same venv), and one whose node never got there (`up` failed) is not run.

A recovery's replacement node gets a head start the same way (`readying`): once past its torch
phase, its job's runtime readies it (a torch job's warm server imports torch there while the
bootstrap checks it), so the next attempt does not wait for its slowest node's imports.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from cloudtrain.errors import CloudtrainError
from cloudtrain.executors.base import Executor, join
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.coordinator import OnLine, run_setup, sync_workdir
from cloudtrain.model import Event, NodeInfo, OnEvent
from cloudtrain.node.bootstrap import ALL_PHASES

__all__ = ["AFTER", "Stager", "readying"]

log = logging.getLogger(__name__)

#: The bootstrap phases that come after torch is in the node's Python: a node that reports
#: one of them (or that it is ready) can run the setup.
AFTER = ALL_PHASES[ALL_PHASES.index("torch") + 1 :]


def past_torch(event: Event) -> bool:
    """Whether `event` is a node's bootstrap status past its torch phase."""
    if event.kind != "bootstrap" or event.node is None:
        return False
    phase, _, state = event.message.partition(": ")
    return phase in AFTER or state == "ready"


def readying(
    on_event: OnEvent, nodes: Sequence[NodeInfo], ready: Callable[[NodeInfo], None]
) -> OnEvent:
    """`on_event`, and `ready(node)` run once, in a thread of its own (the wait it taps goes
    on), for each of `nodes` whose bootstrap goes past its torch phase: a recovery readies a
    replacement for its job while the bootstrap checks torch (`Coordinator.prewarm`)."""
    by_index = {n.index: n for n in nodes}
    begun: set[int] = set()

    def tap(event: Event) -> None:
        on_event(event)
        node = by_index.get(event.node) if event.node is not None else None
        if node is not None and node.index not in begun and past_torch(event):
            begun.add(node.index)
            threading.Thread(
                target=ready, args=(node,), daemon=True, name=f"cloudtrain-ready-{node.index}"
            ).start()

    return tap


class Stager:
    """Stages `job` on the nodes of a cluster as `tap` sees their bootstrap go.

    `nodes(index)` gives a node's record (None: not known yet) and `executor(node)` a
    way to run commands there; `join` waits for every staging begun."""

    def __init__(
        self,
        job: JobSpec,
        nodes: Callable[[int], NodeInfo | None],
        executor: Callable[[NodeInfo], Executor],
        on_event: Callable[[Event], None],
        on_line: OnLine | None = None,
    ) -> None:
        self.job = job
        self._nodes = nodes
        self._executor = executor
        self._on_event = on_event
        self._on_line = on_line
        self._threads: dict[int, threading.Thread] = {}
        self._past: dict[int, threading.Event] = {}  # node → past its torch phase
        self._closing = threading.Event()  # `up` is over: no node goes further
        #: node → "staged", "synced" (its setup left to the submit) or "failed: why"
        self.outcome: dict[int, str] = {}

    def tap(self, event: Event) -> None:
        """`up`'s event sink: passes `event` on; a node's first bootstrap status starts its
        staging, and one past its torch phase lets the staging run the setup."""
        self._on_event(event)
        index = event.node
        if event.kind != "bootstrap" or index is None:
            return
        past = self._past.setdefault(index, threading.Event())
        if past_torch(event):
            past.set()
        if index in self._threads:
            return
        node = self._nodes(index)
        if node is None:
            return
        thread = threading.Thread(
            target=self._stage, args=(node, past), daemon=True, name=f"cloudtrain-stage-{index}"
        )
        self._threads[index] = thread
        thread.start()

    def _stage(self, node: NodeInfo, past: threading.Event) -> None:
        workdir: Path | None = self.job.workdir
        ex: Executor | None = None
        try:
            ex = self._executor(node)
            sync_workdir(ex, node, workdir)
            if self.job.setup:
                while not past.wait(0.2):
                    if self._closing.is_set():  # the node never got past torch
                        self.outcome[node.index] = "synced"
                        return
                run_setup(ex, node, self.job.setup, self.job.envs, self._on_line)
        except (CloudtrainError, OSError) as exc:  # the submit does it again, and says why
            log.info("staging node %d failed (the job's start tries again): %s", node.index, exc)
            self.outcome[node.index] = f"failed: {exc}"
            return
        finally:
            if ex is not None:
                ex.close()
        self.outcome[node.index] = "staged"
        what = "workdir and setup" if self.job.setup else "workdir"
        self._on_event(
            Event("stage", f"{what} in place while the bootstrap finishes", node=node.index)
        )

    def join(self) -> None:
        """Wait for every staging begun (a node's setup can take minutes); a node that did
        not get past its torch phase by now does not run the setup. `up` calls it under the
        cluster's lock, so no other command's setup runs beside a staged one (and again for
        each cloud it tries, and `launch` once more when `up` never took the lock)."""
        self._closing.set()
        join(*self._threads.values())
        self._closing.clear()
