"""Node spans: when each node billed, and at what price (the ``spans`` table of the state file).

A span is one node billing: opened when the node is recorded billing (``up``, a replacement, a
stopped cluster started again), ended when it is recorded gone, replaced, stopped, or its
cluster is torn down. `State.set_nodes` and `State.delete_cluster` call `track` and `end_all`
inside their own transactions, so spans never drift from the recorded nodes; spans outlive their
cluster's record, and `cloudtrain.cost` turns them into money.

The price is the plan's, recorded at ``up`` (today's catalog never changes a past bill). What a
span does not know: when a node that stopped itself (autostop) really went, which only the node
saw; its span ends when a command here finds it gone, or at its cluster's lifetime or budget
end (`SpanRecord.bills_until`) when that comes first.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain.model import NodeInfo
from cloudtrain.spec import ClusterSpec

__all__ = ["NOT_BILLING", "SCHEMA", "SpanRecord", "end_all", "record", "select", "track"]

#: Node states that bill no compute: a span ends when its node is recorded in one of them.
NOT_BILLING = frozenset({"stopping", "stopped", "terminated", "failed"})

_COLS = (
    "id, cluster, cluster_id, idx, node_id, provider, region, zone, instance_type, "
    "price_per_hour, spot, started_at, ended_at, bills_until, end_reason"
)
#: The state file's schema version 2: the table, and the spans of the nodes recorded before it
#: (billing since their cluster's record was made, a stopped cluster's until it was found
#: stopped, at the first offer's price). Released: never edit it; add a version to
#: `cloudtrain.state`'s migrations.
SCHEMA: tuple[str, ...] = (
    """CREATE TABLE spans (
        id INTEGER PRIMARY KEY AUTOINCREMENT, cluster TEXT NOT NULL, cluster_id TEXT,
        idx INTEGER NOT NULL, node_id TEXT NOT NULL, provider TEXT NOT NULL, region TEXT,
        zone TEXT, instance_type TEXT, price_per_hour REAL, spot INTEGER NOT NULL,
        started_at REAL NOT NULL, ended_at REAL, bills_until REAL, end_reason TEXT)""",
    "CREATE INDEX spans_open ON spans (cluster, idx) WHERE ended_at IS NULL",
    "CREATE INDEX spans_ended ON spans (ended_at)",
    """INSERT INTO spans (cluster, cluster_id, idx, node_id, provider, region, zone,
        instance_type, price_per_hour, spot, started_at, ended_at, bills_until, end_reason)
    SELECT n.cluster, json_extract(c.spec_json, '$.cluster_id'), n.idx,
        json_extract(n.node_json, '$.node_id'), c.provider,
        coalesce(json_extract(n.node_json, '$.region'),
                 json_extract(n.node_json, '$.extra.region')),
        json_extract(n.node_json, '$.zone'), json_extract(n.node_json, '$.instance_type'),
        coalesce(json_extract(c.plan_json, '$.offers[0].price_per_node_hour'),
                 c.price_per_hour / max(1, json_extract(c.spec_json, '$.num_nodes'))),
        coalesce(json_extract(c.plan_json, '$.offers[0].spot'),
                 json_extract(c.spec_json, '$.resources.spot'), 0),
        c.created_at, CASE WHEN c.status = 'stopped' OR json_extract(n.node_json,
            '$.state') IN ('stopping', 'stopped', 'terminated', 'failed') THEN c.updated_at
            END,
        json_extract(c.spec_json, '$.limits.ends_at'),
        CASE WHEN c.status = 'stopped' OR json_extract(n.node_json, '$.state') IN
            ('stopping', 'stopped', 'terminated', 'failed') THEN 'stopped' END
    FROM nodes AS n JOIN clusters AS c ON c.name = n.cluster
    WHERE json_valid(n.node_json) AND json_valid(c.spec_json)
        AND (c.plan_json IS NULL OR json_valid(c.plan_json))
    ORDER BY n.cluster, n.idx""",
)
#: What a new span is given (`_row`), in this order.
_NEW = (
    "cluster, cluster_id, idx, node_id, provider, region, zone, instance_type, price_per_hour, "
    "spot, started_at, bills_until"
)


@dataclass(frozen=True)
class SpanRecord:
    """One node billing from `started_at` until `ended_at` (None: it still bills), and never
    after `bills_until` (its cluster's lifetime or budget end: the node stops itself then), at
    `price_per_hour` USD (the offer it runs under in the plan of the ``up`` that made it; None:
    unknown). A `spot` price is an estimate: the cloud's spot price moves. `end_reason`:
    ``down``, ``replaced`` (another node took its index), ``stopped`` or ``gone``."""

    id: int
    cluster: str
    cluster_id: str | None
    index: int
    node_id: str
    provider: str
    region: str | None
    zone: str | None
    instance_type: str | None
    price_per_hour: float | None
    spot: bool
    started_at: float
    ended_at: float | None
    bills_until: float | None
    end_reason: str | None


def track(
    conn: sqlite3.Connection,
    spec: ClusterSpec,
    plan: Mapping[str, Any] | None,
    price_per_hour: float | None,
    nodes: Sequence[NodeInfo],
    *,
    now: float,
    since: float | None = None,
) -> None:
    """Bring the open spans of `spec`'s cluster in step with its `nodes`, as just recorded: an
    open span whose node is not among them, or is there in a state of `NOT_BILLING`, ends
    `now`; a billing node with no open span gets one from `since` (when it was asked for; at
    most `now`), priced from `plan` (``offers``) or else the cluster's `price_per_hour`."""
    billing = {(n.index, n.node_id): n for n in nodes if n.state not in NOT_BILLING}
    states = {n.index: n.state for n in nodes}
    kept: set[tuple[int, str]] = set()
    for span_id, index, node_id in _open(conn, spec.name):
        if (index, node_id) in billing and (index, node_id) not in kept:
            kept.add((index, node_id))
            continue
        if any(i == index for i, _ in billing):
            why = "replaced"
        else:
            why = "stopped" if states.get(index) in NOT_BILLING else "gone"
        _end(conn, span_id, now, why)
    offers = list((plan or {}).get("offers") or [])
    start = now if since is None else min(now, since)
    conn.executemany(
        f"INSERT INTO spans ({_NEW}) VALUES ({', '.join('?' * len(_NEW.split(',')))})",
        [
            _row(spec, n, *_priced(n, offers, price_per_hour, spec), start)
            for key, n in billing.items()
            if key not in kept
        ],
    )


def end_all(conn: sqlite3.Connection, cluster: str, now: float) -> None:
    """End every open span of `cluster` `now` (it is torn down)."""
    for span_id, _, _ in _open(conn, cluster):
        _end(conn, span_id, now, "down")


def select(cluster: str | None, since: float | None) -> tuple[str, list[Any]]:
    """The query (and its parameters) for the spans of `cluster` (every cluster when None)
    still open or ended at or after `since`, oldest first; rows for `record`."""
    where: list[str] = []
    params: list[Any] = []
    if cluster is not None:
        where.append("cluster = ?")
        params.append(cluster)
    if since is not None:
        where.append("(ended_at IS NULL OR ended_at >= ?)")
        params.append(since)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {_COLS} FROM spans{clause} ORDER BY id", params


def record(row: Sequence[Any]) -> SpanRecord:
    """A row of `select`'s query as a record."""
    return SpanRecord(*(*row[:10], bool(row[10]), *row[11:]))


def _row(
    spec: ClusterSpec, node: NodeInfo, price: float | None, spot: bool, start: float
) -> tuple[Any, ...]:
    """A new span's values, in `_NEW`'s order."""
    return (
        spec.name,
        spec.cluster_id,
        node.index,
        node.node_id,
        spec.provider,
        node.region,
        node.zone,
        node.instance_type,
        price,
        spot,
        start,
        spec.limits.ends_at,
    )


def _open(conn: sqlite3.Connection, cluster: str) -> list[tuple[int, int, str]]:
    return conn.execute(
        "SELECT id, idx, node_id FROM spans WHERE cluster = ? AND ended_at IS NULL ORDER BY id",
        (cluster,),
    ).fetchall()


def _end(conn: sqlite3.Connection, span_id: int, now: float, why: str) -> None:
    conn.execute(
        "UPDATE spans SET ended_at = max(started_at, ?), end_reason = ? WHERE id = ?",
        (now, why, span_id),
    )


def _priced(
    node: NodeInfo,
    offers: Sequence[Mapping[str, Any]],
    price_per_hour: float | None,
    spec: ClusterSpec,
) -> tuple[float | None, bool]:
    """(USD per hour, spot) of `node`: the plan's first offer that agrees with where it runs
    and what it is (the one `apply` made it from, after a failover too), else the first
    offer; with no plan, the cluster's price shared by its nodes."""

    def agrees(offer: Mapping[str, Any]) -> bool:
        zones = offer.get("zones") or ()
        return (
            node.region in (None, offer.get("region"))
            and node.instance_type in (None, offer.get("instance_type"))
            and (node.zone is None or not zones or node.zone in zones)
        )

    offer = next((o for o in offers if agrees(o)), offers[0] if offers else None)
    if offer is not None and offer.get("price_per_node_hour") is not None:
        return float(offer["price_per_node_hour"]), bool(offer.get("spot"))
    if price_per_hour is None:
        return None, spec.resources.spot
    return price_per_hour / max(1, spec.num_nodes), spec.resources.spot
