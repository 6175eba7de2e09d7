"""Following a job: its nodes' logs streamed, a heartbeat asking each node for its part, the
verdict once no node runs the attempt (`cloudtrain.jobs.attempts.judge`), and the record of it.
The job's lifecycle is in `cloudtrain.jobs.coordinator`'s docstring."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from cloudtrain.errors import NotFoundError, ProviderError
from cloudtrain.executors.base import fan_out, join
from cloudtrain.jobs import logtail, preemptions, rehost, saves
from cloudtrain.jobs.attempts import (
    HEARTBEAT_S,
    Verdict,
    attempt_of,
    elastic,
    heartbeat_timeout_s,
    judge,
    last_end,
    node_state,
    ran_on,
    run_dir,
)
from cloudtrain.jobs.nodes import OnLine
from cloudtrain.jobs.pulling import Pulling
from cloudtrain.jobs.torchrun import read_failure
from cloudtrain.model import NodeInfo
from cloudtrain.state import JobRecord

log = logging.getLogger(__name__)

#: While a followed job prints, its metrics come home this often (a script reports as it
#: prints: the progress panel keeps pace with the log); when it is quiet, at each heartbeat.
METRICS_S = 1.0


class Following(Pulling):
    """A job's attempts followed to their end, and how each ended recorded."""

    def _note_preemptions(
        self, rec: JobRecord, nodes: Sequence[NodeInfo], statuses: Sequence[Mapping[str, Any]]
    ) -> None:
        """A node whose cloud announced its preemption (its agent recorded the notice) is an
        event of the job, once per notice, recorded at the heartbeat that sees it
        (`cloudtrain.jobs.preemptions`)."""
        preemptions.note(self.state, self._job(rec.id), nodes, statuses)

    def _note_agents(
        self, rec: JobRecord, nodes: Sequence[NodeInfo], statuses: Sequence[Mapping[str, Any]]
    ) -> None:
        """A node whose resident agent had stopped, and that the heartbeat started again, is
        an event of the cluster."""
        for node, status in zip(nodes, statuses, strict=True):
            why = (status.get("agent") or {}).get("restarted")
            if why:
                self.state.add_event(
                    rec.cluster,
                    "agent",
                    f"node {node.index}'s agent was not running ({why}); started again",
                    job_id=rec.id,
                )

    def _note_progress(self, rec: JobRecord, statuses: Sequence[Mapping[str, Any]]) -> None:
        """Record the furthest step a node reported (``detail["progress"]``); once a recovered
        attempt says where it resumed, the recovery's ``steps_redone`` (an event too)."""
        reports = [s["progress"] for s in statuses if isinstance(s.get("progress"), dict)]
        if not reports:
            return
        furthest = max(reports, key=lambda p: int(p.get("step") or 0))
        detail: dict[str, Any] = {"progress": furthest}
        recoveries = list(self._job(rec.id).detail.get("recoveries") or [])
        last = recoveries[-1] if recoveries else None
        resumed = furthest.get("resumed_from")
        if last and "step_at_loss" in last and "steps_redone" not in last and resumed is not None:
            redone = max(0, int(last["step_at_loss"]) - int(resumed))
            last.update(resumed_at_step=int(resumed), steps_redone=redone)
            detail["recoveries"] = recoveries
            self.state.add_event(
                rec.cluster,
                "recovery",
                f"job {rec.id}: resumed at step {resumed}, {redone} step(s) redone",
                job_id=rec.id,
            )
        self.state.update_job(rec.id, detail=detail)

    def _read_log(self, node: NodeInfo, rec: JobRecord, tail: int | None = None) -> str:
        args = ["follow", "--once", run_dir(node, rec)]
        if tail is not None:
            args[2:2] = ["--tail", str(tail)]
        return self._agent(node, *args, timeout=300).stdout

    def refresh(self, job_id: str) -> JobRecord:
        """Read the job's state from its nodes and record it. Idempotent; blocks for one round
        trip to every node. A managed job's outcome is its watcher's to record."""
        rec = self._job(job_id)
        if rec.finished:
            return rec
        nodes = self._job_nodes(rec)
        statuses = fan_out(lambda n: self._status(n, rec), nodes)
        verdict = self._verdict(rec, nodes, statuses)
        if verdict is None or rec.detail.get("managed"):
            return self._job(rec.id)
        return self.record(rec, verdict, ended_at=last_end(statuses))  # not when it was seen

    def _verdict(
        self,
        rec: JobRecord,
        nodes: Sequence[NodeInfo],
        statuses: Sequence[Mapping[str, Any]],
        *,
        lost: Mapping[int, str] | None = None,
    ) -> Verdict | None:
        """Record each node's state; once no node runs the attempt, how it ended (None while
        it runs, or cannot be told). A node that cannot be reached keeps the job open, unless
        `lost` says its host went away while the job was followed (then the job failed
        there)."""
        states = [node_state(s) for s in statuses]
        self.state.update_job(rec.id, detail={"nodes": states})
        self._note_preemptions(rec, nodes, statuses)
        self._note_agents(rec, nodes, statuses)
        self._note_progress(rec, statuses)
        statuses = preemptions.remembered(self._job(rec.id), nodes, statuses)  # node gone since
        return judge(
            rec,
            nodes,
            statuses,
            lost or {},
            lambda node: read_failure(self._read_log(node, rec, tail=80)),
        )

    def record(
        self, rec: JobRecord, verdict: Verdict, *, ended_at: float | None = None
    ) -> JobRecord:
        """Record how the job ended (once: a job that already ended keeps its status), and
        when: `ended_at` as its nodes said (`State.finish_job` bounds it), else now."""
        if verdict.status == "failed":
            detail = {
                "failed_node": verdict.node,
                "reason": verdict.reason,
                "log_tail": verdict.tail,
                "cause": verdict.cause,
            }
            code: int | None = verdict.exit_code if verdict.exit_code is not None else -1
            message = f"failed: node {verdict.node} {verdict.reason}"
        else:
            detail, code, message = {}, verdict.exit_code, verdict.status
        recorded = self.finish(
            rec.id, verdict.status, exit_code=code, detail=detail, ended_at=ended_at
        )
        if recorded:
            self.state.add_event(rec.cluster, "job", f"job {rec.id} {message}", job_id=rec.id)
        return self._job(rec.id)

    def finish(
        self,
        job_id: str,
        status: str,
        *,
        exit_code: int | None = None,
        detail: Mapping[str, Any] | None = None,
        ended_at: float | None = None,
    ) -> bool:
        """Record the job's final status unless it has one already; whether it was recorded."""
        return self.state.finish_job(
            job_id, status, exit_code=exit_code, detail=detail, ended_at=ended_at
        )

    def follow(self, job_id: str, on_line: OnLine) -> JobRecord:
        """Stream every node's log to `on_line(node_index, line)` until the job ends, keep a
        copy under ``<home>/logs/<job>/``, and record the outcome. When a node fails, the
        others are stopped. Blocks; a KeyboardInterrupt stops following and leaves the job."""
        verdict = self.watch_attempt(job_id, on_line)
        rec = self._job(job_id)
        if verdict is None and not rec.finished and rec.detail.get("cancel_requested"):
            # stopped by a `down` (or a cancel) whose teardown left no node to say so: the
            # job was cancelled, whichever of the two records it first
            self.finish(job_id, "cancelled")
            rec = self._job(job_id)
        if rec.finished or verdict is None:
            return rec
        return self.record(rec, verdict)

    def watch_attempt(
        self,
        job_id: str,
        on_line: OnLine,
        *,
        append: bool = False,
        regrow: Callable[[int], bool] | None = None,
        absent: Collection[int] = (),
    ) -> Verdict | None:
        """Follow the job's current attempt to its end (see `follow`) and say how it ended,
        recording nothing but the nodes' states. Every `HEARTBEAT_S` each node is asked for
        its part: one that has not answered for `heartbeat_timeout_s()` is lost, and the
        others are stopped. With `append`, the log copies grow (a managed job's attempts).

        An elastic job's survivors go on without a lost node but its head (the rendezvous
        host: its loss ends the attempt, `cloudtrain.jobs.rehost`); with `regrow` (a managed
        elastic job's watcher), `regrow(index)` runs in a thread of its own for each one (and
        from the start for those `absent`, lost before this attempt), making it again while
        they train. Once it says the node is back, the attempt is stopped and its
        verdict is ``regrow``: the watcher starts the next one on every node. (A replacement
        that joins the running attempt instead, at torchrun's next round, deadlocked in
        torch 2.13's rank assignment when it came while the survivors re-formed; a restart
        from the newest checkpoint costs what a membership change costs: every worker
        restarts and resumes.)"""
        rec = self._job(job_id)
        nodes = self._job_nodes(rec)
        stop_once = threading.Lock()
        closes = self._closes
        heard = [-math.inf]  # when a node last printed a line
        lost: dict[int, str] = {}
        copy_dir = self.home / "logs" / job_id
        copy_dir.mkdir(parents=True, exist_ok=True)
        back: list[int] = []  # the nodes made again (filled by the regrow threads)
        restart: int | None = None  # the node whose return stopped the attempt
        regrowing: dict[int, threading.Thread] = {}
        head = rehost.head_of(rec)

        def goes_on(index: int) -> bool:  # the others go on without this node
            return elastic(rec) and index != head

        def stop_others(node: NodeInfo, why: str, *, itself: bool = False) -> None:
            if stop_once.acquire(blocking=False):
                log.info("job %s: node %d %s; stopping the others", job_id, node.index, why)
                others = [n for n in nodes if (itself or n is not node) and n.index not in lost]
                self._stop(rec, others, mark=False)

        def watch(node: NodeInfo) -> None:
            with open(copy_dir / f"node-{node.index}.log", "a" if append else "w") as copy:
                if append:  # a managed job's copy holds every attempt: say where one starts
                    copy.write(f"cloudtrain: attempt {attempt_of(rec) + 1} of {job_id}\n")
                    copy.flush()

                def emit(line: str) -> None:
                    copy.write(line + "\n")
                    copy.flush()
                    heard[0] = time.monotonic()
                    on_line(node.index, line)

                with contextlib.suppress(ProviderError):  # unreachable: the status says so
                    self._agent(node, "follow", run_dir(node, rec), timeout=None, on_output=emit)
            if self._closes != closes:  # left (Ctrl-C): the job goes on, nothing to judge
                return
            status = self._status(node, rec)
            if "unreachable" in status:
                lost[node.index] = status["unreachable"]
            code = status["exit_code"]
            if code == 0 or status["cancelled"]:
                return
            if code is not None or not goes_on(node.index):  # an elastic job's survivors go on
                # a node that exited answers: what its launcher left (its ranks, when the
                # launcher was killed) stops too
                stop_others(node, node_state(status)["state"], itself=code is not None)

        def make_again(index: int) -> None:
            assert regrow is not None
            with contextlib.suppress(Exception):  # `regrow` says why; the survivors go on
                if regrow(index):
                    back.append(index)

        for index in absent if regrow is not None else ():
            regrowing[index] = threading.Thread(target=make_again, args=(index,), daemon=True)
            regrowing[index].start()

        threads = {n.index: threading.Thread(target=watch, args=(n,), daemon=True) for n in nodes}
        for t in threads.values():
            t.start()
        silent: dict[int, float] = {}  # node → when it first did not answer
        vanished: dict[int, int] = {}  # node → heartbeats that found its processes gone
        copies = saves.HomeCopies(  # each save that completes comes home at once
            rec, nodes, self._executor, lambda: self.pull_checkpoints(job_id), lost=lost
        )
        next_beat = time.monotonic() + HEARTBEAT_S
        next_metrics = 0.0

        def followed(index: int) -> bool:
            return index not in lost and vanished.get(index, 0) < 2

        while any(t.is_alive() for i, t in threads.items() if followed(i)):
            for t in threads.values():
                t.join(timeout=0.2 / len(threads))
            if back and stop_once.acquire(blocking=False):  # the cluster is whole again
                restart = back[0]
                log.info("job %s: node %d is back; stopping the attempt", job_id, restart)
                self._stop(rec, [n for n in nodes if n.index not in lost], mark=False)
            now = time.monotonic()
            if now > next_beat:
                beats = fan_out(lambda n: self._status(n, rec), nodes)
                self.pull_metrics(rec, [n for n in nodes if n.index not in lost])
                self.state.update_job(rec.id, detail={"nodes": [node_state(b) for b in beats]})
                self._note_agents(rec, nodes, beats)
                self._note_preemptions(rec, nodes, beats)  # before the node goes with it
                self._note_progress(rec, beats)
                for node, status in zip(nodes, beats, strict=True):
                    state = node_state(status)["state"]
                    if state != "unreachable":
                        silent.pop(node.index, None)
                    elif now - silent.setdefault(node.index, now) > heartbeat_timeout_s():
                        why = status["unreachable"]
                        lost[node.index] = f"no answer for {now - silent[node.index]:.0f} s: {why}"
                        if not goes_on(node.index):
                            stop_others(node, "stopped answering")
                    if state == "vanished":  # its follower may wait on files that are gone
                        vanished[node.index] = vanished.get(node.index, 0) + 1
                        if not goes_on(node.index):
                            stop_others(node, state)
                if regrow is not None and elastic(rec):
                    for node, status in zip(nodes, beats, strict=True):
                        gone = not followed(node.index) or not threads[node.index].is_alive()
                        ended = node_state(status)["state"] in ("vanished", "unreachable")
                        if gone and ended and goes_on(node.index) and node.index not in regrowing:
                            regrowing[node.index] = threading.Thread(
                                target=make_again, args=(node.index,), daemon=True
                            )
                            regrowing[node.index].start()
                next_beat = time.monotonic() + HEARTBEAT_S
            if now > next_metrics and now - heard[0] < 2 * METRICS_S:  # it prints: keep pace
                self.pull_metrics(rec, [n for n in nodes if n.index not in lost])
                next_metrics = time.monotonic() + METRICS_S
            copies.tick()  # each save that completes comes home at once (and every 30 s)
        join(*regrowing.values())  # a node made again is the next attempt's
        copies.close()
        last = [n for n in nodes if n.index not in lost]  # their last metrics, meanwhile
        metrics = threading.Thread(target=self.pull_metrics, args=(rec, last), daemon=True)
        metrics.start()
        try:
            self.pull_checkpoints(job_id)
            if self._job(job_id).finished:
                return None
            if restart is not None:
                return Verdict("failed", "regrow", node=restart, reason="is back")
            statuses = fan_out(lambda n: self._status(n, rec), nodes)
        finally:
            join(metrics)
        return self._verdict(rec, nodes, statuses, lost=lost)

    def logs(self, job_id: str, on_line: OnLine, *, follow: bool = False) -> JobRecord:
        """Print a job's logs from its nodes (or the copy kept when its cluster is gone, and
        for a managed job, whose copy holds every attempt): the tail of each, bounded
        (`logtail`), with a line saying what was left out."""
        rec = self._job(job_id)
        if follow and not rec.finished:
            return self.follow(job_id, on_line)
        nodes = ran_on(rec, self.state.nodes(rec.cluster))
        if nodes and rec.status != "pending" and not rec.detail.get("managed"):
            for node in nodes:
                folder = run_dir(node, rec)
                done = self._agent(
                    node, "follow", "--once", "--tail", str(logtail.LINES), folder, timeout=300
                )
                if cut := logtail.skipped(done.stderr):
                    on_line(node.index, logtail.left_out(cut, f"{folder}/node.log on the node"))
                for line in done.stdout.splitlines():
                    on_line(node.index, line)
            return self.refresh(job_id)
        copies = sorted((self.home / "logs" / job_id).glob("node-*.log"))
        if not copies:
            raise NotFoundError(f"job {job_id}: no logs left (its cluster {rec.cluster!r} is gone)")
        for copy in copies:
            index = int(copy.stem.split("-")[1])
            text, cut = logtail.read(copy)
            if cut:
                on_line(index, logtail.left_out(cut, str(copy)))
            for line in text.splitlines():
                on_line(index, line)
        return rec
