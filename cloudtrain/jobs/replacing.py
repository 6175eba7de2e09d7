"""A managed job's replacement nodes: booted without the cluster's lock, removed on a cancel.

A recovery makes its nodes again with ``up`` of the recorded spec, under the cluster's lock
(`managed.Watcher.complete_cluster`). What follows is here:

``wait_booted``   their bootstrap, waited for with the lock free, so that a ``down`` never
                  waits for a recovery (it ends one: the nodes it removes are lost). Every
                  `HEARTBEAT_S` the provider is asked which nodes it still runs: a replacement
                  that died while it was made or booted is `NodeLostError` at once, a new loss
                  the watcher recovers from, never a wait for the bootstrap's timeout (nor a
                  bootstrap "failed" by the signal of a machine going away). Once they
                  are ready, the cluster's limits are handed to every node, under the lock.
``drop``          a recovery cancelled while it ran takes the nodes it made with it; the nodes
                  that were there before stay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path

from cloudtrain import lifecycle, locks
from cloudtrain.errors import (
    BootstrapError,
    CloudtrainError,
    NodeLostError,
    NotFoundError,
)
from cloudtrain.jobs.attempts import HEARTBEAT_S
from cloudtrain.model import Event, NodeInfo, OnEvent
from cloudtrain.provision.provider import Provider, RemovesNodes
from cloudtrain.state import State

log = logging.getLogger(__name__)


def wait_booted(
    state: State,
    home: Path,
    prov: Provider,
    cluster: str,
    nodes: list[NodeInfo],
    on_event: OnEvent,
    timeout_s: float,
    *,
    check: Callable[[], None] = lambda: None,
    every_s: float = HEARTBEAT_S,
) -> None:
    """Wait, without the cluster's lock, for the bootstrap of `nodes` (those just made among
    them); then hand the cluster's limits to its nodes. Blocks. Raises `NodeLostError` within
    `every_s` of a node the provider no longer runs, `BootstrapError` for a bootstrap that
    failed or timed out, `NotFoundError` when the cluster went meanwhile, and what `check`
    (asked as often) raises: how the caller ends the wait (a cancel)."""
    from cloudtrain.boot import readiness, wheel

    record = state.cluster(cluster)
    cluster_id = record.spec.cluster_id if record else None

    def lost() -> set[int]:
        check()
        running = {n.index for n in prov.describe(cluster, cluster_id) if n.state == "running"}
        return {n.index for n in nodes} - running

    try:
        if not readiness.watch(
            nodes,
            prov.executor,
            lambda: wheel.build(home),
            lost,
            on_event=on_event,
            timeout_s=timeout_s,
            lost_every_s=every_s,
        ):
            return  # a provider that cannot run commands on its nodes yet
    except NodeLostError:
        raise
    except BootstrapError as exc:  # a machine going away TERMs its bootstrap first
        deadline = time.monotonic() + every_s
        while time.monotonic() < deadline:
            if exc.node.isdigit() and int(exc.node) in lost():
                raise NodeLostError(exc.node, exc.phase) from exc
            time.sleep(min(0.5, every_s))
        raise
    with locks.cluster_lock(home, cluster, "recover"):
        record = state.cluster(cluster)
        if record is None or record.spec.cluster_id != cluster_id:
            raise NotFoundError(f"cluster {cluster!r} was torn down while its nodes booted")
        state.add_event(cluster, "up", f"cluster {cluster!r} is whole: {len(nodes)} node(s) ready")
        if record.spec.limits:
            lifecycle.hand_limits(state, home, record.spec)


def drop(
    state: State,
    home: Path,
    prov: Provider,
    cluster: str,
    made: Collection[int],
    on_event: OnEvent,
) -> str:
    """Remove the nodes `made` (by a recovery that was cancelled) and keep the others, under
    the cluster's lock; what was done, in words. A provider that cannot remove one node of
    many (no `RemovesNodes`) keeps them, unless they are all the cluster has: then the whole
    cluster's nodes go (its record stays, for `down`). Never raises `CloudtrainError`: what it
    could not remove is said."""
    made = sorted(set(made))
    if not made:
        return "no node was made"
    which = ", ".join(map(str, made))
    try:
        with locks.cluster_lock(home, cluster, "recover"):
            record = state.cluster(cluster)
            if record is None:
                return "the cluster is gone"
            cid = record.spec.cluster_id
            others = [n for n in prov.describe(cluster, cid) if n.index not in made]
            if isinstance(prov, RemovesNodes):
                prov.remove_nodes(cluster, cid, made)
            elif not others:
                prov.terminate(cluster, cid)
            else:
                return (
                    f"node(s) {which} stay: {prov.name} cannot remove a node and keep the "
                    f"others; `cloudtrain down {cluster}` removes them"
                )
            state.set_nodes(cluster, others)
    except CloudtrainError as exc:
        log.warning("could not remove node(s) %s of %s: %s", which, cluster, exc)
        return f"node(s) {which} could not be removed ({exc}); `cloudtrain down {cluster}`"
    on_event(Event("terminate", f"removed node(s) {which} of {cluster!r}"))
    return f"node(s) {which} removed"
