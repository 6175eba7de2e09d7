"""The jobs of a cluster whose nodes stopped themselves (idle, lifetime, budget): brought home.

A node that removes itself (ssh, local) first moves its jobs' folders and checkpoints beside its
folder (`cloudtrain.node.selfstop.keep`), and says when and why (its ``.stopped.json``). The next
command here, which finds the cluster stopped (`cloudtrain.autostop.settle`), calls `bring_home`
before anything is removed: every job's logs and metrics are copied to ``<home>/logs`` and the
newest checkpoint to the job's snapshots, from those kept folders, through the node's own
executor; then each job not yet ended is recorded as it ended: ``succeeded`` (or ``failed``, or
``cancelled``) when it ended by itself before the stop, else ``cancelled`` with the reason
"stopped: the cluster stopped itself (…)". A managed job is its watcher's to record.

Idempotent: a job already ended keeps its record, and copying again copies the same files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from cloudtrain.errors import CloudtrainError, CommandError
from cloudtrain.executors.base import fan_out
from cloudtrain.jobs.attempts import first_nonzero, ran_on, run_dir
from cloudtrain.jobs.coordinator import Coordinator
from cloudtrain.model import NodeInfo
from cloudtrain.node import selfstop
from cloudtrain.provision.provider import Provider
from cloudtrain.state import State

log = logging.getLogger(__name__)

#: The job's ``detail["cause"]`` when the cluster's own stop ended it.
CAUSE = "cluster-stopped"


def kept_nodes(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    """`nodes` as they are after removing themselves: their roots where they kept their jobs."""
    return [
        dataclasses.replace(n, root=str(selfstop.kept_dir(PurePosixPath(n.root)))) for n in nodes
    ]


def bring_home(
    state: State,
    home: Path,
    provider: Provider,
    cluster: str,
    nodes: Sequence[NodeInfo],
    why: str,
    *,
    machines_stay: bool = True,
) -> list[str]:
    """Copy home the logs and checkpoints that the cluster's `nodes` (as recorded before they
    stopped themselves) kept, and record how each of its unfinished jobs ended (`why`: why the
    cluster stopped). One line per job recorded. Blocks; a node that cannot be read is logged
    (its jobs are still recorded: their nodes are gone). Without `machines_stay` (a cloud's
    nodes, whose machines went with them) nothing is read: the jobs are recorded stopped."""
    if not nodes:
        return []
    kept = kept_nodes(nodes)
    coord = Coordinator(state, provider, home=home)
    try:
        if machines_stay:
            try:
                coord.archive_logs(cluster, kept)
            except (CloudtrainError, OSError) as exc:
                log.warning("could not copy the logs of %s home: %s", cluster, exc)
        stopped_at = _stopped_at(provider, nodes) if machines_stay else None
        lines = []
        for rec in state.jobs(cluster):
            if rec.finished or rec.detail.get("managed"):
                continue
            ran = ran_on(rec, kept)
            statuses: list[dict[str, Any] | None] = [None] * len(ran)
            if machines_stay:
                dirs = [(n, run_dir(n, rec)) for n in ran]
                statuses = fan_out(lambda nd: _status(provider, *nd), dirs)
            status, code, detail = _ending(statuses, stopped_at, why)
            if coord.finish(rec.id, status, exit_code=code, detail=detail):
                said = detail.get("reason") or f"{status} before the cluster stopped itself"
                line = f"job {rec.id} {said}"
                state.add_event(cluster, "job", line, job_id=rec.id)
                lines.append(line)
        return lines
    finally:
        coord.close()


def _ending(
    statuses: Sequence[Mapping[str, Any] | None], stopped_at: float | None, why: str
) -> tuple[str, int | None, dict[str, Any]]:
    """How a job ended, from its nodes' kept statuses: by itself before the stop (every node
    has an exit code written before `stopped_at`), else by the stop."""
    read = [s for s in statuses if s is not None]
    codes = [s.get("exit_code") for s in read]
    ends = [s.get("ended") for s in read]
    before = (
        bool(read)
        and len(read) == len(statuses)
        and stopped_at is not None
        and all(isinstance(c, int) for c in codes)
        and all(isinstance(e, int | float) and e < stopped_at for e in ends)
    )
    if before:
        if any(s.get("cancelled") for s in read):
            return "cancelled", first_nonzero(codes), {}
        code = first_nonzero(codes)
        if code is None:
            return "succeeded", 0, {}
        return (
            "failed",
            code,
            {
                "reason": f"failed: exited {code} before the cluster stopped itself ({why})",
                "cause": "exit",
            },
        )
    reason = f"stopped: the cluster stopped itself ({why})"
    return "cancelled", first_nonzero(codes), {"reason": reason, "cause": CAUSE}


def _status(provider: Provider, node: NodeInfo, job_dir: str) -> dict[str, Any] | None:
    """The node agent's ``status`` of a kept job folder; None when it cannot be read."""
    ex = provider.executor(node)
    try:
        done = ex.run([node.python, "-m", "cloudtrain.node", "status", job_dir], timeout=60)
        found = json.loads(done.check().stdout)
    except (CloudtrainError, CommandError, ValueError) as exc:
        log.warning("could not read %s on node %d: %s", job_dir, node.index, exc)
        return None
    finally:
        ex.close()
    return found if isinstance(found, dict) else None


def _stopped_at(provider: Provider, nodes: Sequence[NodeInfo]) -> float | None:
    """When the first of `nodes` stopped itself (its ``.stopped.json``), on its own clock."""
    node = nodes[0]
    record = f"{node.root}.stopped.json"
    ex = provider.executor(node)
    try:
        done = ex.run(["cat", record], timeout=60)
        at = json.loads(done.stdout).get("at") if done.returncode == 0 else None
    except (CloudtrainError, ValueError, AttributeError) as exc:
        log.warning("could not read %s: %s", record, exc)
        return None
    finally:
        ex.close()
    return float(at) if isinstance(at, int | float) else None
