"""What the user's side does about clusters that stop billing by themselves.

The nodes' agents act alone (`cloudtrain.node.agent`): at the idle time, the lifetime or the
budget they remove themselves (ssh, local) or power their machine off (a cloud, which then
deletes it: AWS by ``InstanceInitiatedShutdownBehavior=terminate``; GCP stops it, its disk
kept). An EC2 node of a cluster with a lifetime or budget also powers itself off a little after
it (``shutdown -h +N`` from its user-data), and GCE deletes one at its ``maxRunDuration``,
whatever is left running on it; a node whose agent and its supervisor are both gone is stopped,
or gets its agent again, by the next command's ask (`cloudtrain.node.unattended`). Azure has no
such backstop: a guest's power-off keeps the VM billed. No node holds a credential, so what only
an account can delete (a security group, a key pair, firewall rules, a stopped GCE instance and
its disk) waits for the next command here: `settle` finds such a cluster and removes what is
left — the whole cluster when its lifetime or budget ended, it was to be deleted when idle, or
its instances are stopped rather than gone (GCP: their disks bill, and `up` does not start
them); else it is recorded ``stopped`` (`up` brings it back on the resources it kept: AWS's
security group and key pair). What it cost is in its nodes' spans (`cloudtrain.spans`), which
end at its lifetime's or budget's end at the latest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from cloudtrain.model import NodeInfo
from cloudtrain.records import IN_PROGRESS, ClusterStatus
from cloudtrain.spec import ClusterSpec
from cloudtrain.state import ClusterRecord, State

#: A cluster whose nodes stopped themselves when idle, kept for `up` to bring back.
STOPPED = ClusterStatus.STOPPED
#: Node states that bill no compute (a GCE instance a guest power-off stopped).
HALTED = frozenset({"stopped", "terminated", "stopping"})
#: How late a node may stop after its deadline by this machine's clock and still be "ended".
SKEW_S = 120.0
#: How long after a cluster's end a node of it may still be found before a command here
#: removes the cluster (`expire`): an agent stops its node within a beat of the deadline and
#: gives the jobs' processes 10 s to go.
LATE_S = 20.0


def ended(spec: ClusterSpec, now: float | None = None) -> bool:
    """Whether the cluster's lifetime or budget is over."""
    at = spec.limits.ends_at
    return at is not None and at <= (time.time() if now is None else now) + SKEW_S


def overdue(spec: ClusterSpec, found: list[NodeInfo], now: float | None = None) -> bool:
    """Whether a node of the cluster still bills `LATE_S` after its lifetime or budget ended
    (its agent is gone, or could not stop it)."""
    at = spec.limits.ends_at
    late = at is not None and at + LATE_S < (time.time() if now is None else now)
    return late and any(n.state not in HALTED for n in found)


def expire(state: State, home: Path, record: ClusterRecord, found: list[NodeInfo]) -> str:
    """Remove cluster `record` whose lifetime or budget ended while nodes of it still run
    (`overdue`): one line saying so, also kept as an event."""
    from cloudtrain import api

    spec = record.spec
    live = [f"node {n.index} ({n.node_id})" for n in found if n.state not in HALTED]
    api.down(state, home, spec.name)
    said = (
        f"{spec.name}: {spec.limits.ended()}, but {', '.join(live)} still ran (not stopped by "
        "its agent); removed the cluster"
    )
    state.add_event(spec.name, "down", said)
    return said


def may_have_stopped(state: State, record: ClusterRecord) -> bool:
    """Whether cluster `record` has limits and was made: not while an `up` (or a `down`)
    of it is under way, whose nodes are not there yet (or going)."""
    return (
        bool(record.spec.limits)
        and record.status not in IN_PROGRESS
        and not state.open_intents(record.name)
    )


def stopped_itself(spec: ClusterSpec, found: list[NodeInfo]) -> bool:
    """Whether a cluster with limits has no node that bills compute any more."""
    return bool(spec.limits) and all(n.state in HALTED for n in found)


def settle(
    state: State,
    home: Path,
    record: ClusterRecord,
    left: list[str],
    halted: int = 0,
    was: Sequence[NodeInfo] = (),
) -> str:
    """A cluster whose nodes stopped themselves (`stopped_itself`): its jobs' logs and
    checkpoints brought home from where its nodes `was` (as recorded before) kept them, and
    its jobs' records ended (`cloudtrain.jobs.selfstopped`); then removed, leftovers and
    record, when it ended, was to be deleted when idle, or has `halted` instances left (a
    stopped GCE instance, whose disk bills and which `up` does not start again) — unless a
    managed job of it is making its nodes again; else recorded `STOPPED`. One line saying
    what happened, also kept as an event."""
    from cloudtrain import api
    from cloudtrain.jobs import selfstopped
    from cloudtrain.model import Capability
    from cloudtrain.provision import registry

    spec = record.spec
    why = (
        f"its {spec.limits.ends_why} ended"
        if ended(spec)
        else "it was idle"
        if spec.limits.idle_minutes
        else "its nodes are gone"
    )
    what = ", ".join(left) or "nothing"
    # a cloud's nodes boot from user-data and go with their machines; ssh and local nodes
    # leave their jobs' folders on the machine, beside their own (`selfstop.keep`)
    stays = Capability.USER_DATA not in registry.provider_class(record.provider).capabilities
    prov = api.provider_for(spec, home)
    selfstopped.bring_home(state, home, prov, spec.name, was, why, machines_stay=stays)
    recovering = [j.id for j in state.jobs(spec.name) if j.status == "recovering"]
    if (ended(spec) or spec.limits.down_when_idle or halted) and not recovering:
        api.down(state, home, spec.name)
        said = f"{spec.name} stopped itself ({why}); removed what was left: {what}"
        state.add_event(spec.name, "down", said)
        return said
    if record.status != STOPPED:
        state.set_cluster_status(spec.name, STOPPED)
        state.add_event(spec.name, STOPPED, f"the nodes stopped themselves ({why}); kept: {what}")
    return (
        f"{spec.name} stopped itself ({why}); `cloudtrain up` brings it back, "
        f"`cloudtrain down {spec.name}` removes it (kept: {what})"
    )
