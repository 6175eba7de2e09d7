"""Managed jobs: recovered until they succeed, are cancelled, or their budget is spent.

A managed job (``train --managed``) is watched by a process of its own on the user's machine,
``cloudtrain jobs watch JOB``, started detached so that it outlives the command that submitted
the job. No cloud credential ever goes to a node: replacing a node is the watcher's business,
through the same provider (and the same provisioning engine) as ``up``. One watcher per job: it
holds ``<home>/locks/watch-<job>.lock`` while it runs (the kernel lets go when it dies), by
which any process finds it (`cloudtrain.jobs.watched`, which also starts it and follows the
job's logs across attempts). All it
knows is in the job's record, so a watcher that died is started again by its supervisor
(`cloudtrain.jobs.supervisor`, at once, with no command), or when both are gone by the next
``status``, ``logs`` or ``jobs watch``, and goes on from where the record says::

    running ──► the attempt ends ──► succeeded / cancelled                     (recorded once)
       ▲                │
       │                ├─ a node lost (vanished, stopped answering, preempted)  ─┐ budget left
       │                ├─ a rank or launcher killed by SIGKILL (OOM killer)     ─┤
       │                ├─ the script's own exit, with --retry-on-failure        ─┤
       │                └─ otherwise, or the budget spent ──► failed              │
       │                                                                          ▼
       └──────────── start again ◄── restore ◄── replace ◄── stop the rest ◄── recovering

Recovery: the attempt's processes still running anywhere are stopped (by its follower, the
moment one node fails; again here only where a node did not answer, or a watcher that died
left the job ``recovering``); the newest checkpoint is brought home
(`cloudtrain.jobs.checkpoints`); a node the cloud no longer runs is made again by ``up`` of the
recorded spec (the engine completes a half-made cluster where it is, and fails over as for any
``up``); the job starts again as its next attempt (``jobs/<id>.<n>`` on the
nodes, the rendezvous ``<id>.<n>``) with every node given that checkpoint. Each recovery is an
event with its cause, its downtime and the age of the checkpoint it resumed from; once the next
attempt reports where it resumed (`cloudtrain.runtime.progress`), the steps it redid.

An elastic job (``--nodes MIN:MAX``) is not stopped by a lost node: its survivors go on, and
the watcher makes the node again meanwhile (`_regrow`, a counted recovery); once it is back,
the attempt is stopped and the next starts on every node (`_grow`), from the newest checkpoint,
which `runtime.load_checkpoint` hands every rank alike. A lost head takes the rendezvous
with it: the survivors start again on one of their own while it is made again (`_rehost`,
one recovery; `cloudtrain.jobs.rehost` says why it moves).

A cancel (``cloudtrain cancel``) asks first, in the record, then stops what runs: a watcher in
the middle of a recovery starts nothing more. With ``--down`` the watcher tears the cluster
down when the job ends, whatever the outcome (a cancel too); the job's final status is recorded
before, and a failed teardown is an event, never a new status.

What a controller VM would add (not built): the watcher lives on the user's machine, so a
managed job whose nodes all die while that machine sleeps waits for it to wake (the next
command restarts the watcher). A small always-on controller instance, with a role scoped to
the cluster, would recover at once; it would also need its own credentials and its own bill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain import lifecycle, locks
from cloudtrain.errors import CloudtrainError, JobError, NodeLostError, NotFoundError
from cloudtrain.jobs import checkpoints, preemptions, rehost, replacing
from cloudtrain.jobs.attempts import HEARTBEAT_S, Verdict, attempt_of, elastic
from cloudtrain.jobs.coordinator import Coordinator
from cloudtrain.jobs.staging import readying
from cloudtrain.jobs.teardown import stop_jobs
from cloudtrain.model import Event, NodeInfo
from cloudtrain.provision.provider import Provider
from cloudtrain.spec import ClusterSpec
from cloudtrain.state import JobRecord, State

log = logging.getLogger(__name__)

DEFAULT_MAX_RECOVERIES = 3
#: Before it tries again after a recovery that failed (no capacity, a node that did not come).
RETRY_PAUSE_S = 5.0


@dataclass(frozen=True)
class Policy:
    """How a managed job is recovered. `max_recoveries` bounds the recoveries of every cause;
    the script's own non-zero exit is recovered only with `retry_on_failure`."""

    max_recoveries: int = DEFAULT_MAX_RECOVERIES
    retry_on_failure: bool = False
    down: bool = False  # tear the cluster down when the job ends

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_recoveries": self.max_recoveries,
            "retry_on_failure": self.retry_on_failure,
            "down": self.down,
        }

    @classmethod
    def of(cls, rec: JobRecord) -> Policy | None:
        """The job's policy; None for a job that is not managed."""
        data = rec.detail.get("managed")
        if not data:
            return None
        return cls(
            max_recoveries=int(data.get("max_recoveries", DEFAULT_MAX_RECOVERIES)),
            retry_on_failure=bool(data.get("retry_on_failure")),
            down=bool(data.get("down")),
        )


# -- the watcher ---------------------------------------------------------------------------


class Watcher:
    """Recovers one managed job until it ends (`run`)."""

    def __init__(
        self,
        state: State,
        home: Path,
        coordinator: Callable[[str], Coordinator],
        on_event: Callable[[Event], None] | None = None,
        *,
        provider: Callable[[ClusterSpec], Provider] | None = None,
        bootstrap_timeout_s: float | None = 1800,
    ) -> None:
        self.state = state
        self.home = home
        self._coordinator = coordinator  # for a cluster name, built afresh for each attempt
        self._provider = provider  # default: the cluster's recorded provider and account
        self.bootstrap_timeout_s = bootstrap_timeout_s  # for a replaced node (None: no wait)
        self._on_event = on_event or (lambda event: None)

    def _say(self, rec: JobRecord, kind: str, message: str) -> None:
        self.state.add_event(rec.cluster, kind, message, job_id=rec.id)
        self._on_event(Event(kind, message))

    def _job(self, job_id: str) -> JobRecord:
        rec = self.state.job(job_id)
        if rec is None:
            raise NotFoundError(f"no job {job_id!r}; `cloudtrain status` lists jobs")
        return rec

    def run(self, job_id: str) -> JobRecord:
        """Watch and recover the job until it ends; then apply its teardown policy. Blocks.
        Returns its final record."""
        rec = self._job(job_id)
        policy = Policy.of(rec)
        if policy is None:
            raise NotFoundError(f"job {job_id} is not a managed job (`train --managed`)")
        try:
            while not rec.finished:
                self._step(rec, policy)
                rec = self._job(job_id)
        finally:
            if policy.down:
                self._teardown(self._job(job_id))
        return rec

    def _step(self, rec: JobRecord, policy: Policy) -> None:
        """Follow the current attempt to its end and act on how it ended."""
        coord = self._coordinator(rec.cluster)
        try:
            verdict: Verdict | None
            if rec.status == "recovering":  # an earlier watcher died mid-recovery, or it failed
                verdict = Verdict("failed", str(rec.detail.get("recovering_cause") or "lost"))
            else:
                regrow = (lambda index: self._regrow(rec, index, policy)) if elastic(rec) else None
                verdict = coord.watch_attempt(
                    rec.id,
                    lambda i, line: None,
                    append=True,
                    regrow=regrow,
                    absent=rehost.absent(rec),
                )
            rec = self._job(rec.id)
            if rec.finished:
                return
            if verdict is None:  # a node does not answer yet: ask again
                time.sleep(HEARTBEAT_S)
                return
            if verdict.cause == "regrow" and not rec.detail.get("cancel_requested"):
                self._grow(coord, rec)
                return
            if rec.detail.get("cancel_requested") or verdict.status != "failed":
                if verdict.status == "failed":
                    verdict = Verdict("cancelled", "cancelled")
                coord.record(rec, verdict)
                return
            used = len(rec.detail.get("recoveries") or [])
            if not (verdict.recoverable or policy.retry_on_failure):
                coord.record(rec, verdict)
                return
            over = self._over(rec)
            if over:  # its lifetime or budget ended (and took its nodes): nothing is made
                reason = f"{verdict.reason or verdict.cause}; {over}"
                coord.record(rec, dataclasses.replace(verdict, reason=reason))
                return
            if used >= policy.max_recoveries:
                spent = f"its {policy.max_recoveries} recoveries are spent"
                reason = f"{verdict.reason or verdict.cause}; {spent}"
                coord.record(rec, dataclasses.replace(verdict, reason=reason))
                return
            left = rehost.survivors(rec, self.state.nodes(rec.cluster), verdict)
            if left:  # the rendezvous host was lost: the others start again on their own
                self._rehost(coord, rec, verdict, used + 1, policy, left)
                return
            # a verdict the attempt's follower gave: it stopped the others before it ended,
            # unless some did not answer (a host away may come back with its processes)
            settled = rec.status != "recovering" and verdict.cause not in ("lost", "preempted")
            self._recover(coord, rec, verdict, used + 1, policy, stopped=settled)
        finally:
            coord.close()

    def _over(self, rec: JobRecord) -> str | None:
        """Why no recovery may make a node for `rec`'s cluster: its lifetime or budget ended
        (`up` refuses such a cluster too); None when it may."""
        record = self.state.cluster(rec.cluster)
        ended = record.spec.limits.ended() if record is not None else None
        return f"cluster {rec.cluster!r}: {ended}; no node is made for it again" if ended else None

    def _recover(
        self,
        coord: Coordinator,
        rec: JobRecord,
        verdict: Verdict,
        number: int,
        policy: Policy,
        *,
        stopped: bool = False,
    ) -> None:
        """Start the job again after `verdict`: what still runs of it is stopped (unless
        `stopped`: its follower saw every node that answers end), the newest checkpoint
        brought home, the cluster made whole, and the next attempt started."""
        began = time.time()
        if verdict.node is not None:
            what = f"node {verdict.node} {verdict.reason}"
        else:  # a recovery begun by a watcher that died, or one that failed: again
            what = f"again after {verdict.cause}"
        self.state.update_job(
            rec.id, status="recovering", detail={"recovering_cause": verdict.cause}
        )
        self._say(
            rec, "recovery", f"job {rec.id}: recovery {number}/{policy.max_recoveries}: {what}"
        )
        made: list[int] = []  # the nodes this recovery makes: a cancel takes them with it
        try:
            if not stopped:
                with contextlib.suppress(CloudtrainError):  # what still answers stops
                    coord.stop(
                        rec.id,
                        [n for n in self.state.nodes(rec.cluster) if n.index != verdict.node],
                    )
            snapshot = coord.pull_checkpoints(rec.id, lost=verdict.node)
            preempted = {
                n.zone
                for n in self.state.nodes(rec.cluster)
                if n.index == verdict.node and n.zone and verdict.cause == "preempted"
            } | preemptions.zones(self._job(rec.id))  # the notices this attempt's beats saw
            replaced = self.complete_cluster(
                rec, zones_last=preempted, made=made, ready=lambda node: coord.prewarm(rec.id, node)
            )
            if self._cancelled(rec, made):
                return
            rec = coord.relaunch(rec.id, snapshot)
            if self._job(rec.id).detail.get("cancel_requested"):  # asked while it started
                coord.stop(rec.id, mark=True)
                self._cancelled(rec, made)
                return
        except CloudtrainError as exc:
            if self._cancelled(rec, made):  # a cancel (or a `down`) ended it
                return
            self._count(rec, verdict, began, None, error=str(exc))
            if isinstance(exc, NodeLostError):  # a new loss: its replacement is made at once
                self._say(
                    rec,
                    "recovery",
                    f"job {rec.id}: recovery {number} failed: {exc}; it is made again",
                )
                return
            self._say(rec, "recovery", f"job {rec.id}: recovery {number} failed: {exc}")
            time.sleep(RETRY_PAUSE_S)
            return
        age, restored = _resumed_from(snapshot, began)
        self._count(rec, verdict, began, age, replaced=replaced)
        self._say(
            rec,
            "recovery",
            f"job {rec.id} recovered in {time.time() - began:.1f} s "
            f"(attempt {attempt_of(rec) + 1}), from {restored}",
        )

    def _regrow(self, rec: JobRecord, index: int, policy: Policy) -> bool:
        """An elastic job goes on without node `index`: make it again meanwhile (a recovery,
        counted, unless it is the head whose loss `_rehost` counted; the cluster back to its
        size). Whether it is back (not: budget spent, cancelled, or an error, which an event
        names)."""
        counted = index in rehost.absent(self._job(rec.id))
        used = len(self._job(rec.id).detail.get("recoveries") or [])
        if self._job(rec.id).detail.get("cancel_requested") or (
            not counted and used >= policy.max_recoveries
        ):
            return False
        began = time.time()
        verdict = Verdict("failed", "lost", node=index, reason="was lost")
        if not counted:
            self._say(
                rec,
                "recovery",
                f"job {rec.id}: recovery {used + 1}/"
                f"{policy.max_recoveries}: node {index} was lost; the others go on "
                "(elastic) while it is made again",
            )
        try:
            replaced = self.complete_cluster(rec)
        except CloudtrainError as exc:
            if not counted:
                self._count(rec, verdict, began, None, error=str(exc))
            self._say(rec, "recovery", f"job {rec.id}: node {index} not made again: {exc}")
            return False
        if counted:  # the recovery that moved the rendezvous made it again
            self._replaced(rec, index, replaced)
        else:
            self._count(rec, verdict, began, None, replaced=replaced)
        took = time.time() - began
        self._say(
            rec,
            "recovery",
            f"job {rec.id}: node {index} is back after {took:.1f} s; "
            "the job starts again on all its nodes",
        )
        return True

    def _rehost(
        self,
        coord: Coordinator,
        rec: JobRecord,
        verdict: Verdict,
        number: int,
        policy: Policy,
        left: list[NodeInfo],
    ) -> None:
        """The head of an elastic job, its rendezvous host, was lost (`cloudtrain.jobs.rehost`):
        the nodes `left` start again at once on a rendezvous of their own, from the newest
        checkpoint, and the head is made again while they train (one recovery, counted once)."""
        began = time.time()
        names = ", ".join(str(n.index) for n in left)
        self.state.update_job(
            rec.id, status="recovering", detail={"recovering_cause": verdict.cause}
        )
        self._say(
            rec,
            "recovery",
            f"job {rec.id}: recovery {number}/{policy.max_recoveries}: "
            f"node {verdict.node}, the rendezvous host, {verdict.reason}; node(s) {names} "
            "lost their rendezvous with it and start again on one of their own while it "
            "is made again",
        )
        try:
            with contextlib.suppress(CloudtrainError):  # stopped already, unless they hang
                coord.stop(rec.id, left)
            snapshot = coord.pull_checkpoints(rec.id, lost=verdict.node)
            rec = coord.relaunch(rec.id, snapshot, on=[n.index for n in left])
            if self._job(rec.id).detail.get("cancel_requested"):  # asked while it started
                coord.stop(rec.id, mark=True)
                return
        except CloudtrainError as exc:  # the next step recovers it as any lost attempt
            self._count(rec, verdict, began, None, error=str(exc))
            self._say(rec, "recovery", f"job {rec.id}: recovery {number} failed: {exc}")
            time.sleep(RETRY_PAUSE_S)
            return
        age, restored = _resumed_from(snapshot, began)
        self._count(rec, verdict, began, age)
        self.state.update_job(rec.id, detail={rehost.ABSENT_KEY: [verdict.node]})
        self._say(
            rec,
            "recovery",
            f"job {rec.id} runs on node(s) {names} again in "
            f"{time.time() - began:.1f} s (attempt {attempt_of(rec) + 1}), rendezvous on "
            f"node {rehost.head_of(rec)}, from {restored}; node {verdict.node} is being "
            "made again",
        )

    def _replaced(self, rec: JobRecord, index: int, replaced: list[int]) -> None:
        """Record `replaced` on the recovery that counted node `index`'s loss."""
        recoveries = list(self._job(rec.id).detail.get("recoveries") or [])
        for entry in reversed(recoveries):
            if entry.get("node") == index:
                entry["replaced"] = sorted({*entry.get("replaced", ()), *replaced})
                break
        self.state.update_job(rec.id, detail={"recoveries": recoveries})

    def _grow(self, coord: Coordinator, rec: JobRecord) -> None:
        """Start the next attempt on every node, from the newest checkpoint (the nodes made
        again by `_regrow` are in the cluster now)."""
        began = time.time()
        try:
            snapshot = coord.pull_checkpoints(rec.id)
            if self._job(rec.id).detail.get("cancel_requested"):
                return
            rec = coord.relaunch(rec.id, snapshot)
        except CloudtrainError as exc:  # the next step recovers it as any lost attempt
            self.state.update_job(rec.id, status="recovering", detail={"recovering_cause": "lost"})
            self._say(rec, "recovery", f"job {rec.id}: could not start again: {exc}")
            return
        self._say(
            rec,
            "recovery",
            f"job {rec.id} runs on {rec.num_nodes} node(s) again in "
            f"{time.time() - began:.1f} s (attempt {attempt_of(rec) + 1})",
        )

    def _count(
        self,
        rec: JobRecord,
        verdict: Verdict,
        began: float,
        checkpoint_age_s: float | None,
        *,
        replaced: list[int] | None = None,
        error: str | None = None,
    ) -> None:
        """Add this recovery to the job's record (every try counts against the budget)."""
        recoveries = list(self._job(rec.id).detail.get("recoveries") or [])
        entry: dict[str, Any] = {
            "cause": verdict.cause,
            "node": verdict.node,
            "reason": verdict.reason,
            "at": began,
            "seconds": round(time.time() - began, 2),
            "checkpoint_age_s": None if checkpoint_age_s is None else round(checkpoint_age_s, 1),
            "replaced": replaced or [],
        }
        reached = (self._job(rec.id).detail.get("progress") or {}).get("step")
        if reached is not None:  # the steps redone are counted once the next attempt resumes
            entry["step_at_loss"] = int(reached)
        if error:
            entry["error"] = error
        recoveries.append(entry)
        self.state.update_job(rec.id, detail={"recoveries": recoveries})

    def complete_cluster(
        self,
        rec: JobRecord,
        zones_last: Collection[str] = (),
        made: list[int] | None = None,
        ready: Callable[[NodeInfo], None] | None = None,
    ) -> list[int]:
        """Make again the nodes of `rec`'s cluster that the cloud no longer runs (``up`` of the
        recorded spec, through the engine: in the zone of the others, failing over as any
        ``up`` does, a zone in `zones_last` (one that just preempted a node) tried last when no
        node is left to pin the zone; it waits for their bootstrap); the indices replaced,
        added to `made` as soon as they are asked for.

        The nodes found gone are recorded gone first, under the cluster's lock: their spans
        end now, not when the replacements are recorded (which may take many minutes). The
        bootstrap is waited for with the lock free (`replacing.wait_booted`): a replacement
        lost meanwhile is `NodeLostError` within a heartbeat, a cancel ends the wait; `ready`
        is given each replacement once it is past its torch phase (`staging.readying`)."""

        def wait(message: str) -> None:
            self._on_event(Event("wait", message))

        with locks.cluster_lock(self.home, rec.cluster, "recover", on_wait=wait):
            record = self.state.cluster(rec.cluster)
            if record is None:
                raise NotFoundError(f"the cluster {rec.cluster!r} of job {rec.id} is gone")
            prov = self._provider_for(record.spec)
            found = prov.describe(rec.cluster, record.spec.cluster_id)
            running = [n for n in found if n.state == "running"]
            indices = {n.index for n in running}
            missing = [i for i in range(record.spec.num_nodes) if i not in indices]
            if missing and len(indices) == len(running):  # what still bills, as the cloud says
                self.state.set_nodes(rec.cluster, running)
        if missing:
            self._say(
                rec,
                "recovery",
                f"job {rec.id}: replacing node(s) {', '.join(map(str, missing))} of {rec.cluster}",
            )
            if made is not None:
                made.extend(missing)
            nodes = lifecycle.up(
                self.state,
                self.home,
                record.spec,
                self._on_event,
                bootstrap_timeout_s=None,
                prov=prov,
                complete_only=True,
                zones_last=zones_last,
            )
            if self.bootstrap_timeout_s is not None:

                def check() -> None:
                    if self._job(rec.id).detail.get("cancel_requested"):
                        raise JobError(rec.id, "cancelled", cancelled=True)

                tap = self._on_event if ready is None else readying(self._on_event, nodes, ready)
                replacing.wait_booted(
                    self.state,
                    self.home,
                    prov,
                    rec.cluster,
                    nodes,
                    tap,
                    self.bootstrap_timeout_s,
                    check=check,
                )
        return missing

    def _cancelled(self, rec: JobRecord, made: list[int]) -> bool:
        """Whether the job was asked to stop; if so, the nodes its recovery `made` go with it
        (the others stay), and an event says so."""
        if not self._job(rec.id).detail.get("cancel_requested"):
            return False
        record = self.state.cluster(rec.cluster)
        if made and record is not None:
            prov = self._provider_for(record.spec)
            done = replacing.drop(self.state, self.home, prov, rec.cluster, made, self._on_event)
            self._say(rec, "recovery", f"job {rec.id}: cancelled during its recovery; {done}")
        return True

    def _provider_for(self, spec: ClusterSpec) -> Provider:
        return (self._provider or (lambda s: lifecycle.provider_for(s, self.home)))(spec)

    def _teardown(self, rec: JobRecord) -> None:
        if self.state.cluster(rec.cluster) is None:
            return
        try:
            lifecycle.down(
                self.state, self.home, rec.cluster, stop_jobs=stop_jobs, on_event=self._on_event
            )
        except CloudtrainError as exc:  # the job's status stands; the event says what is left
            self._say(
                rec,
                "down",
                f"job {rec.id}: could not tear down {rec.cluster}: {exc}; "
                f"`cloudtrain down {rec.cluster}` again",
            )
        else:
            self._say(rec, "down", f"job {rec.id} ended {rec.status}; {rec.cluster} torn down")


def _resumed_from(snapshot: Path | None, began: float) -> tuple[float | None, str]:
    """How old, when the recovery `began`, the checkpoint a new attempt resumes from is (None:
    there is none), and the words that say so."""
    if snapshot is None:
        return None, "no checkpoint"
    age = checkpoints.age(snapshot, began)
    return age, f"the checkpoint kept {age:.0f} s before"
