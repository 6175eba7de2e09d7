"""Tables and JSON for the CLI's results. Pure functions of records: easy to test."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from cloudtrain.cost import Figure
    from cloudtrain.model import NodeInfo, Plan
    from cloudtrain.plan.catalog import InstanceType
    from cloudtrain.plan.optimizer import Ranking
    from cloudtrain.spec import ClusterSpec
    from cloudtrain.state import ClusterRecord, EventRecord, JobRecord

JOB_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "recovering": "magenta",
}


def ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "-"
    seconds = max(0, int((now or time.time()) - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def duration(start: float | None, end: float | None, now: float | None = None) -> str:
    if start is None:
        return "-"
    seconds = int((end or now or time.time()) - start)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def plan_table(plan: Plan) -> Table:
    spec = plan.spec
    table = Table(title=f"plan for cluster {spec.name!r}", title_justify="left")
    for col in (
        "provider",
        "region",
        "zones",
        "instance type",
        "GPUs/node",
        "nodes",
        "$/node/h",
        "$/h",
    ):
        table.add_column(col, justify="right" if col.startswith("$") else "left")
    for i, offer in enumerate(plan.offers):
        gpus = f"{offer.accelerator}:{offer.accelerator_count}" if offer.accelerator else "-"
        table.add_row(
            offer.provider,
            offer.region,
            ",".join(offer.zones),
            offer.instance_type,
            gpus,
            str(spec.num_nodes),
            f"{offer.price_per_node_hour:.2f}",
            f"{offer.price_per_node_hour * spec.num_nodes:.2f}",
            style=None if i == 0 else "dim",
        )
    return table


def ranking_table(spec: ClusterSpec, ranking: Ranking, most: int | None = None) -> Table:
    """The offers of every cloud at hand, cheapest first, as `up` tries them (the first
    `most`, and how many more)."""
    kind = "spot estimate" if spec.resources.spot else "on-demand"
    table = Table(
        title=f"where {spec.name!r} can run, cheapest first ({kind})", title_justify="left"
    )
    for col in ("#", "provider", "region", "instance type", "GPUs/node", "$/node/h", "$/h"):
        table.add_column(col, justify="right" if col.startswith(("$", "#")) else "left")
    shown = ranking.offers if most is None else ranking.offers[:most]
    for i, offer in enumerate(shown, start=1):
        table.add_row(
            str(i),
            offer.provider,
            offer.region,
            offer.instance_type,
            f"{offer.accelerator}:{offer.accelerator_count}",
            f"{offer.price_per_node_hour:.2f}",
            f"{offer.price_per_node_hour * spec.num_nodes:.2f}",
            style=None if i == 1 else "dim",
        )
    if len(shown) < len(ranking.offers):
        table.caption = f"and {len(ranking.offers) - len(shown)} more (--dry-run lists all)"
    return table


def nodes_table(nodes: Sequence[NodeInfo], most: int = 16) -> Table:
    """The nodes, the first `most` of them for a big cluster (``status --json`` has them all)."""
    shown = nodes if len(nodes) <= most else nodes[: most - 1]
    caption = f"… and {len(nodes) - len(shown)} more nodes" if len(shown) < len(nodes) else None
    table = Table(title_justify="left", caption=caption, caption_justify="left")
    for col in ("node", "id", "state", "private ip", "public ip", "zone", "type"):
        table.add_column(col)
    for n in shown:
        table.add_row(
            str(n.index),
            n.node_id,
            n.state,
            n.private_ip or "-",
            n.public_ip or "-",
            n.zone or "-",
            n.instance_type or "-",
        )
    return table


def clusters_table(
    clusters: Sequence[ClusterRecord],
    node_counts: dict[str, int],
    stops: Mapping[str, str] | None = None,
    now: float | None = None,
    costs: Mapping[str, Figure] | None = None,
    ends: Mapping[str, float] | None = None,
) -> Table:
    """The clusters; ``cost`` is what each cost so far (`costs`: its nodes' spans at the price
    recorded at `up`; ``~`` marks a spot price's estimate), ``stops`` when it stops by itself
    (`stops`: what its agents said) or its provider ends it (`ends`: a time limit)."""
    now = time.time() if now is None else now
    table = Table(title="clusters", title_justify="left")
    for col in (
        "name",
        "provider",
        "nodes",
        "GPUs/node",
        "status",
        "$/h",
        "cost",
        "created",
        "stops",
    ):
        table.add_column(col, justify="right" if col in ("$/h", "cost") else "left")
    for c in clusters:
        spec = c.spec
        price = "-" if c.price_per_hour is None else f"{c.price_per_hour:.2f}"
        table.add_row(
            c.name,
            c.provider,
            f"{node_counts.get(c.name, 0)}/{spec.num_nodes}",
            spec.resources.gpus or "cpu",
            c.status,
            price,
            money_text((costs or {}).get(c.name)),
            ago(c.created_at),
            Text((stops or {}).get(c.name) or lifetime_left(spec, now, (ends or {}).get(c.name))),
        )
    if any(f.estimate for f in (costs or {}).values()):
        table.caption = "~ a spot price's estimate"
        table.caption_justify = "left"
    return table


def money_json(figure: Figure) -> float | None:
    """USD to the cent for ``--json`` (None when no price is known)."""
    from cloudtrain.cost import money

    return None if figure.unpriced and not figure.prices else float(money(figure.cost))


def money_text(figure: Figure | None) -> str:
    """``12.30``, ``~12.30`` for an estimate (a spot price), ``-`` when the price is unknown."""
    from cloudtrain.cost import money

    if figure is None or (figure.unpriced and not figure.prices):
        return "-"
    return f"{'~' if figure.estimate else ''}{money(figure.cost):,}"


def lifetime_left(spec: ClusterSpec, now: float, ends_at: float | None = None) -> str:
    """``budget ends in 1h02m`` / ``lifetime ended 12s ago`` / ``time limit ends in 5m07s`` (the
    provider's: `ends_at`) / ``-``: whichever comes first."""
    limits = ((spec.limits.ends_at, str(spec.limits.ends_why)), (ends_at, "time limit"))
    due = [(at, why) for at, why in limits if at is not None]
    if not due:
        return "-"
    at, why = min(due)
    if at <= now:
        return f"{why} ended {span(now - at)} ago"
    return f"{why} ends in {span(at - now)}"


def span(seconds: float) -> str:
    """``2d03h``, ``1h02m``, ``5m07s``, ``12s``."""
    s = int(seconds)
    for big, small, unit, sub in ((86400, 3600, "d", "h"), (3600, 60, "h", "m"), (60, 1, "m", "s")):
        if s >= big:
            return f"{s // big}{unit}{(s % big) // small:02d}{sub}"
    return f"{s}s"


def stops_text(spec: ClusterSpec, beats: Sequence[Mapping[str, Any]], now: float) -> str:
    """What a cluster's agents say about when it stops: ``idle 2m05s, stops in 2m55s``."""
    up = [b for b in beats if b.get("resident")]
    if not up:
        return lifetime_left(spec, now)
    idle = [b.get("idle_since") for b in up]
    doing = (
        "busy"
        if any(i is None for i in idle)
        else f"idle {span(now - max(float(i) for i in idle if i is not None))}"
    )
    due = [float(b["stops_at"]) for b in up if b.get("stops_at")]
    return f"{doing}, stops in {span(max(0.0, min(due) - now))}" if due else doing


def jobs_table(jobs: Sequence[JobRecord]) -> Table:
    table = Table(title="jobs", title_justify="left")
    columns = (
        "job",
        "cluster",
        "name",
        "status",
        "nodes×procs",
        "on each node",
        "started",
        "duration",
        "exit",
        "recovered",
    )
    for col in columns:
        table.add_column(col)
    for j in jobs:
        style = JOB_STYLES.get(j.status)
        status = f"[{style}]{j.status}[/]" if style else j.status
        table.add_row(
            j.id,
            j.cluster,
            j.name,
            status,
            f"{j.num_nodes}×{j.nproc_per_node}",
            node_states(j),
            ago(j.started_at),
            duration(j.started_at, j.ended_at),
            "-" if j.exit_code is None else str(j.exit_code),
            recoveries(j),
        )
    return table


def events_table(events: Sequence[EventRecord]) -> Table:
    """The event log, oldest first; a message is text, never markup (it may quote a cloud's
    or a node's words)."""
    table = Table(title="events", title_justify="left")
    for col in ("when", "kind", "job", "what happened"):
        table.add_column(col)
    for e in events:
        table.add_row(ago(e.ts), e.kind, e.job_id or "-", Text(e.message))
    return table


def agent_line(beat: dict[str, Any], now: float | None = None) -> str:
    """``node 0: agent up, idle 2m, removes itself in 3m`` from a node's beat."""
    now = time.time() if now is None else now
    if beat.get("stopped"):
        failed = " (the stop failed: it is tried again)" if beat.get("stop_failed") else ""
        return f"node {beat.get('node')}: stopped now, {beat['stopped']}{failed}"
    if beat.get("restarted"):
        return (
            f"node {beat.get('node')}: its agent was not running ({beat['restarted']}); "
            "started it again"
        )
    if not beat.get("resident"):
        return f"node {beat.get('node')}: its agent is not running"
    jobs, sessions = beat.get("jobs") or [], beat.get("sessions") or 0
    if jobs:
        doing = f"running {', '.join(jobs)}"
    elif sessions:
        doing = f"{sessions} SSH session(s) open"
    else:
        since = beat.get("idle_since")
        doing = f"idle for {duration(since, now)}" if since else "idle"
    stops = beat.get("stops_at")
    when = (
        f", removes itself in {duration(now, max(now, float(stops)))}"
        if stops
        else ", stays until `cloudtrain down`"
    )
    return f"node {beat.get('node')}: agent up, {doing}{when}"


def event_json(e: EventRecord) -> dict[str, Any]:
    return {"ts": e.ts, "cluster": e.cluster, "job": e.job_id, "kind": e.kind, "message": e.message}


def recoveries(job: JobRecord) -> str:
    """A managed job's recoveries against its budget (``1/3: node 1 vanished``); ``-`` for a
    job that is not managed."""
    policy = job.detail.get("managed")
    if not policy:
        return "-"
    done = job.detail.get("recoveries") or []
    where = f"node {done[-1]['node']} " if done and done[-1].get("node") is not None else ""
    last = f": {where}{done[-1]['cause']}" if done else ""
    return f"{len(done)}/{policy.get('max_recoveries')}{last}"


def node_states(job: JobRecord) -> str:
    """``0 running, 1 exited 1`` from the states the last refresh read on the nodes (a record
    written by another version may lack a field: ``?``, never a crash)."""
    states = [s for s in job.detail.get("nodes") or [] if isinstance(s, dict)]
    return (
        ", ".join(
            f"{i} {s.get('state', '?')}"
            + (f" {s.get('exit_code')}" if s.get("state") == "exited" else "")
            for i, s in enumerate(states)
        )
        or "-"
    )


def gpus_table(rows: Sequence[InstanceType], spot: bool, prices_read_on: str) -> Table:
    kind = "spot" if spot else "on-demand"
    table = Table(
        title=f"GPU machines, cheapest first ({kind} $/h, prices read {prices_read_on})",
        title_justify="left",
    )
    for col in (
        "provider",
        "instance type",
        "GPUs",
        "GPU mem",
        "vCPUs",
        "RAM GiB",
        "region",
        "$/h",
        "$/GPU/h",
        "note",
    ):
        table.add_column(col, justify="right" if col.startswith(("$", "vCPU", "RAM")) else "left")
    for r in rows:
        price = r.price(spot)
        table.add_row(
            r.provider,
            r.instance_type,
            f"{r.accelerator}:{r.accelerator_count}",
            f"{r.gpu_memory_gb} GB",
            str(r.vcpus),
            str(r.memory_gib),
            r.region,
            "-" if price is None else f"{price:.2f}",
            "-" if price is None else f"{price / r.accelerator_count:.2f}",
            r.status if r.retired else "",
        )
    return table


def job_json(j: JobRecord) -> dict[str, Any]:
    return {
        "id": j.id,
        "cluster": j.cluster,
        "name": j.name,
        "status": j.status,
        "num_nodes": j.num_nodes,
        "nproc_per_node": j.nproc_per_node,
        "command": list(j.command),
        "created_at": j.created_at,
        "started_at": j.started_at,
        "ended_at": j.ended_at,
        "exit_code": j.exit_code,
        "detail": dict(j.detail),
    }
