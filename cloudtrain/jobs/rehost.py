"""An elastic job whose rendezvous host is lost: its rendezvous moves to a node that is left.

torchrun's c10d rendezvous keeps its state in a `TCPStore` served by one agent, the head's
(`cloudtrain.jobs.rendezvous`), and torch has no failover for it: once that agent is gone, every
other agent fails with ``RendezvousConnectionError`` at its next keep-alive or round
(pytorch/pytorch#67742; torch's answer is etcd, on a machine that does not fail). So the
"survivors go on" of an elastic job holds for a lost worker node only; a lost head took the
whole job, and a managed job's watcher counted the head's loss and then the survivors' deaths.

Keeping the store up elsewhere would not keep the attempt: any node can be the one lost, a
store on the user's machine is out of the nodes' reach, and the head's ranks were in every
process group (its agent also served the workers' own store), so every survivor's workers
restart anyway. cloudtrain moves the rendezvous instead, which costs the same restart:

    head lost ──► the survivors are stopped (not left to time out against a store that is gone)
              ──► the newest checkpoint is brought home from a survivor
              ──► the survivors start again as the next attempt, on a new rendezvous hosted by
                  the first of them (`torchrun.rendezvous_first`), from that checkpoint
              ──► meanwhile the head is made again; once it is back, the job starts again on
                  every node (`managed.Watcher._grow`)

One loss is one recovery: the head's replacement belongs to the recovery that moved the
rendezvous, and is not counted again. The watcher records the head being made again in the
job's ``detail["absent"]``, so that a watcher started again goes on making it.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudtrain.jobs.attempts import Verdict, elastic, ran_on
from cloudtrain.model import NodeInfo
from cloudtrain.state import JobRecord

#: The job's record key: the node that hosts the current attempt's rendezvous.
HEAD_KEY = "head_node"
#: The job's record key: the nodes lost with the rendezvous, being made again (counted).
ABSENT_KEY = "absent"


def head_of(rec: JobRecord) -> int | None:
    """The node that hosts the rendezvous of the job's current attempt (None: not recorded)."""
    head = rec.detail.get(HEAD_KEY)
    return int(head) if head is not None else None


def survivors(rec: JobRecord, nodes: Sequence[NodeInfo], verdict: Verdict) -> list[NodeInfo]:
    """The nodes of the current attempt (among the cluster's `nodes`) that can go on without
    the head the attempt ended on, as many as the job's minimum or more; none when the attempt
    did not end on its head's loss, the job is not elastic, or too few are left."""
    if not (elastic(rec) and verdict.lost_node) or verdict.node is None:
        return []
    if verdict.node != head_of(rec):
        return []
    left = [n for n in ran_on(rec, nodes) if n.index != verdict.node]
    least = int((rec.detail.get("spec") or {}).get("min_nodes") or 1)
    return left if len(left) >= least else []


def absent(rec: JobRecord) -> list[int]:
    """The nodes that were lost with the rendezvous and are being made again: those of
    ``detail["absent"]`` that the current attempt does not run on."""
    started = set(rec.detail.get("ran_on") or ())
    return [int(i) for i in rec.detail.get(ABSENT_KEY) or () if int(i) not in started]
