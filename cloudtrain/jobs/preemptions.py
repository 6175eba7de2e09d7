"""Preemption notices as a followed job sees them: recorded the moment a heartbeat finds one,
so that the node's loss seconds later is known for what it was.

A node's agent records its cloud's notice in the node's folder (`cloudtrain.node.notices`),
and every ``status`` of the node carries it. A preempted node is gone soon after (30 s to two
minutes), its folder with it: a status read once the attempt ended finds no notice, and the
node reads as ``vanished`` or ``lost``. So the heartbeat records each notice it sees (`note`)
in the job's ``detail["preemptions"]``, keyed by node index:

    {"<index>": {source, action, not_before, noticed_at,   the node's notice, as it wrote it
                 attempt, zone}}                            the attempt it came in; the node's zone

and an event says so, once per notice (a replacement node at the same index gets its own).
`remembered` gives the judge the notices of the current attempt that the nodes no longer
show; `zones` says which zones just preempted, for the watcher to try last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cloudtrain.jobs.attempts import attempt_of
from cloudtrain.model import NodeInfo
from cloudtrain.state import JobRecord, State


def _same(known: Mapping[str, Any] | None, notice: Mapping[str, Any]) -> bool:
    return known is not None and all(
        known.get(k) == notice.get(k) for k in ("source", "noticed_at")
    )


def note(
    state: State,
    rec: JobRecord,
    nodes: Sequence[NodeInfo],
    statuses: Sequence[Mapping[str, Any]],
) -> None:
    """Record each notice that `statuses` (one per node of `nodes`) carry and the job's record
    does not hold yet, with an event. Idempotent; blocks for the state only."""
    known = dict(rec.detail.get("preemptions") or {})
    new = False
    for node, status in zip(nodes, statuses, strict=True):
        notice = status.get("preemption")
        if not isinstance(notice, Mapping) or _same(known.get(str(node.index)), notice):
            continue
        known[str(node.index)] = {**notice, "attempt": attempt_of(rec), "zone": node.zone}
        new = True
        when = f" at {notice['not_before']}" if notice.get("not_before") else ""
        said = (
            f"job {rec.id}: node {node.index}'s cloud will {notice.get('action')} it{when} "
            f"({notice.get('source')} notice); the job was told to checkpoint"
        )
        state.add_event(rec.cluster, "preemption", said, job_id=rec.id)
    if new:
        state.update_job(rec.id, detail={"preemptions": known})


def _current(rec: JobRecord) -> dict[str, dict[str, Any]]:
    """The notices recorded during the job's current attempt, by node index."""
    found = rec.detail.get("preemptions") or {}
    return {
        index: dict(notice)
        for index, notice in found.items()
        if isinstance(notice, Mapping) and notice.get("attempt") == attempt_of(rec)
    }


def remembered(
    rec: JobRecord, nodes: Sequence[NodeInfo], statuses: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`statuses` with the notice recorded in this attempt put back where a node no longer
    shows it (its folder went with it): a node that vanished after its notice was preempted."""
    current = _current(rec)
    merged = []
    for node, status in zip(nodes, statuses, strict=True):
        notice = current.get(str(node.index))
        if notice is not None and not status.get("preemption"):
            status = {**status, "preemption": notice}
        merged.append(dict(status))
    return merged


def zones(rec: JobRecord) -> set[str]:
    """The zones of the nodes whose cloud gave notice during the job's current attempt."""
    return {str(n["zone"]) for n in _current(rec).values() if n.get("zone")}
