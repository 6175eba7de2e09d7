"""What the records say against what the providers' tags say: a cluster's nodes gone behind
cloudtrain's back or found new, a cluster whose lifetime passed or whose nodes stopped
themselves settled, what is left of a cluster with no node, and clusters of this owner that
exist but are not recorded here (`reconcile`); and every cluster of this owner, recorded or
found by tag, for `down --all` (`every_cluster`). The provider's tags are the truth."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cloudtrain.model import NodeInfo
from cloudtrain.provision import registry
from cloudtrain.provision.registry import account
from cloudtrain.records import ClusterStatus
from cloudtrain.state import ClusterRecord, State

__all__ = ["every_cluster", "node_changes", "reconcile"]


def reconcile(
    state: State,
    home: Path,
    clusters: list[ClusterRecord],
    note: Callable[[str], None],
    *,
    others: bool = True,
) -> None:
    """Compare the records with the providers' tags and fix what drifted: nodes gone behind
    our back, nodes that appeared; say (`note`) what it found, and with `others` the clusters
    of this owner that exist but are not recorded here."""
    from cloudtrain import api, autostop

    for c in clusters:
        prov = api.provider_for(c.spec, home)  # the account the cluster was made in
        found = prov.describe(c.name, c.spec.cluster_id)
        known = {n.node_id: n for n in state.nodes(c.name)}
        found = [  # a node that does not answer keeps what was known of it
            dataclasses.replace(known[n.node_id], state=n.state)
            if n.state == "unreachable" and n.node_id in known
            else n
            for n in found
        ]
        before = set(known)
        after = {n.node_id for n in found}
        if before != after:
            note(
                f"{c.name}: {len(before - after)} node(s) gone, {len(after - before)} "
                "new, since the last record; updated"
            )
        for line in node_changes(c.provider, list(known.values()), found):
            state.add_event(c.name, "node", line)
        state.set_nodes(c.name, found)
        live = sum(n.state == "running" for n in found)
        status = ClusterStatus.PARTIAL if found else ClusterStatus.GONE
        if live >= c.spec.num_nodes:
            status = ClusterStatus.UP
        left = [] if found else prov.leftovers(c.name, c.spec.cluster_id)
        if autostop.overdue(c.spec, found) and autostop.may_have_stopped(state, c):
            note(autostop.expire(state, home, c, found))  # its end passed: it goes
            continue
        if autostop.stopped_itself(c.spec, found) and autostop.may_have_stopped(state, c):
            # its agents acted: what they could not remove is removed here
            left += [f"node {n.index} ({n.node_id}, {n.state})" for n in found]
            gone = [n for i, n in known.items() if i not in after]  # its jobs' folders: home
            note(autostop.settle(state, home, c, left, halted=len(found), was=gone))
            continue
        if left:
            status = ClusterStatus.LEFTOVERS
            said = f"no node is left, but {', '.join(left)} remain"
            if [e.message for e in state.events(c.name, limit=1)] != [
                said
            ]:  # once, not per refresh
                state.add_event(c.name, "leftovers", said)
            note(f"{c.name}: {said}; `cloudtrain down {c.name}` removes them")
        state.set_cluster_status(c.name, status)
    if not others:
        return
    recorded = {c.name for c in state.clusters()}
    accounts = {
        (c.provider, json.dumps(account(c.spec.extra, c.provider), sort_keys=True)): c
        for c in clusters
    }
    providers = [api.provider(registry.default(), home)] + [
        api.provider_for(c.spec, home)
        for (p, _), c in sorted(accounts.items())
        if p != registry.default()
    ]
    for prov in providers:
        pname = prov.name
        for name in prov.clusters():
            if name not in recorded:
                note(
                    f"warning: cluster {name!r} exists on {pname} (found by its tags) but "
                    f"is not recorded here; `cloudtrain down {name} --provider {pname}` "
                    "removes it"
                )


def node_changes(provider: str, recorded: list[NodeInfo], found: list[NodeInfo]) -> list[str]:
    """What became of the nodes since they were recorded, one line each (an event): gone from
    the provider (preempted, or removed behind cloudtrain's back), no longer billing, or new."""
    from cloudtrain.spans import NOT_BILLING

    now = {n.node_id: n for n in found}
    lines = []
    for old in recorded:
        new = now.get(old.node_id)
        if new is None:
            lines.append(f"node {old.index} ({old.node_id}) is gone: {provider} no longer has it")
        elif new.state in NOT_BILLING and old.state not in NOT_BILLING:
            lines.append(f"node {old.index} ({old.node_id}) is {new.state}")
    was = {n.node_id for n in recorded}
    for n in found:
        if n.node_id not in was:
            lines.append(f"node {n.index} ({n.node_id}) found {n.state}, not recorded before")
    return lines


def every_cluster(
    state: State, home: Path, provider: str | None, options: Mapping[str, str] | None
) -> list[tuple[str, str | None, dict[str, Any] | None]]:
    """Recorded clusters, and clusters of this owner found by tag on `provider` (or on local
    and every provider that has a record), each with the account to reach it in."""
    from cloudtrain import api

    records = state.clusters()
    found: dict[str, tuple[str, dict[str, Any] | None]] = {
        c.name: (c.provider, None) for c in records
    }
    wanted = {provider} if provider else {registry.default(), *(c.provider for c in records)}
    for pname in sorted(wanted):
        # the accounts to look in: the flags', else those the records were made in
        recorded = {
            json.dumps(account(c.spec.extra, pname), sort_keys=True)
            for c in records
            if c.provider == pname
        }
        accounts = [dict(options)] if options else [json.loads(a) or None for a in sorted(recorded)]
        for acct in accounts or [None]:
            for cluster in api.provider(pname, home, acct).clusters():
                found.setdefault(cluster, (pname, acct))
    return [(n, p, acct) for n, (p, acct) in sorted(found.items()) if not provider or p == provider]
