"""`cloudtrain status`: clusters, their nodes and jobs, what a killed command left open, and
what each cluster's agents say of their idle clocks; with a NAME, that cluster's latest events.
What the records say is checked against the providers' tags where it may have drifted
(`cloudtrain.reconcile`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from cloudtrain.cli.app import App
from cloudtrain.cli.options import cluster_name
from cloudtrain.records import ClusterStatus

if TYPE_CHECKING:
    from cloudtrain.cost import Figure
    from cloudtrain.state import ClusterRecord

pass_app = click.make_pass_decorator(App)


#: The latest events `status` shows (of one cluster with --cluster, else of all).
EVENTS_SHOWN = 20


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--cluster",
    "-c",
    callback=cluster_name,
    help="Only this cluster: its jobs and its latest events.",
)
@click.option("--refresh", is_flag=True, help="Ask each provider which nodes really exist.")
@click.argument("name", required=False, callback=cluster_name)
@pass_app
def status(app: App, as_json: bool, cluster: str | None, refresh: bool, name: str | None) -> None:
    """Clusters, their nodes, and jobs (running jobs are read from their nodes). With a NAME
    (or --cluster), that cluster only, and what happened to it lately."""
    if name is not None and cluster is not None and name != cluster:
        raise click.UsageError(f"NAME {name!r} and --cluster {cluster!r} differ; give one")
    cluster = cluster or name
    import time

    from cloudtrain import api, autostop
    from cloudtrain.cli import render
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.reconcile import reconcile

    state = app.state
    from cloudtrain.cli.watch import restart_watchers

    restart_watchers(app)
    clusters = [c for c in state.clusters() if cluster is None or c.name == cluster]
    # a cluster that may have stopped itself is looked at by every status: what its nodes
    # could not remove (they hold no credential) is removed by the next command here
    watched = clusters if refresh else [c for c in clusters if autostop.may_have_stopped(state, c)]
    if watched:
        reconcile(state, app.home, watched, app.note, others=refresh)
        clusters = [c for c in state.clusters() if cluster is None or c.name == cluster]
    if api.abandoned(state, app.home, [c.name for c in clusters]):  # a killed `up`'s status
        clusters = [c for c in state.clusters() if cluster is None or c.name == cluster]
    for intent in state.open_intents(cluster):
        app.note(interrupted_line(intent.action, intent.cluster, render.ago(intent.ts)))
    for c in clusters:
        if c.status == ClusterStatus.UNWATCHED:
            app.note(
                f"warning: the wait for the bootstrap of {c.name!r} was interrupted; its "
                "nodes run, ready or not: `cloudtrain up` it again to wait, or "
                f"`cloudtrain down {c.name}`"
            )
    refreshed = {}
    for c in clusters:
        running = [j for j in state.jobs(c.name) if not j.finished]
        if running:
            coord = app.coordinator(c.name)
            try:
                for job in running:
                    refreshed[job.id] = coord.refresh(job.id)
            except CloudtrainError as exc:
                app.note(f"warning: could not read jobs of {c.name!r} from its nodes: {exc}")
            finally:
                coord.close()
    jobs = [refreshed.get(j.id, j) for j in state.jobs(cluster)]
    nodes = {c.name: state.nodes(c.name) for c in clusters}
    events = state.events(cluster, limit=EVENTS_SHOWN)
    now = time.time()
    spent = {c.name: cost_so_far(app, c, now) for c in clusters}
    if as_json:
        data = {
            "clusters": [
                {
                    "name": c.name,
                    "provider": c.provider,
                    "status": c.status,
                    "price_per_hour": c.price_per_hour,
                    "created_at": c.created_at,
                    "cost_so_far": render.money_json(spent[c.name]),
                    "cost_is_estimate": spent[c.name].estimate,
                    "spec": c.spec.to_dict(),
                    "nodes": [n.to_dict() for n in nodes[c.name]],
                }
                for c in clusters
            ],
            "jobs": [render.job_json(j) for j in jobs],
            "events": [render.event_json(e) for e in events],
        }
        click.echo(json.dumps(data, indent=2))
        return
    if not clusters and not jobs:
        if cluster is not None and events:  # a cluster that is gone: what became of it
            app.out.print(render.events_table(events))
            return
        app.out.print("no clusters and no jobs; `cloudtrain up --name demo --nodes 2` makes one")
        return
    # the agents of clusters with an idle clock say how long they have been idle and when they
    # stop; one cluster's story has each of its agents' lines
    idle = [
        c
        for c in clusters
        if c.spec.limits.idle_minutes and c.status in (ClusterStatus.UP, ClusterStatus.PARTIAL)
    ]
    told = [c for c in clusters if c.name == cluster and _stops_itself(c)]
    beats = _agent_beats(app, [c for c in clusters if c in idle or c in told])
    acted = [c for c in clusters if any(b.get("stopped") for b in beats.get(c.name, []))]
    if acted:  # a node with no agent, due, was stopped by that ask: its cluster settles now
        reconcile(state, app.home, acted, app.note, others=False)
        clusters = [c for c in state.clusters() if cluster is None or c.name == cluster]
        nodes = {c.name: state.nodes(c.name) for c in clusters}
        events = state.events(cluster, limit=EVENTS_SHOWN)
    stops = {
        c.name: render.stops_text(c.spec, beats[c.name], now)
        for c in idle
        if c.name in beats and c not in acted
    }
    counts = {k: len(v) for k, v in nodes.items()}
    ends = {k: min(e) for k, v in nodes.items() if (e := [n.ends_at for n in v if n.ends_at])}
    app.out.print(render.clusters_table(clusters, counts, stops, now, spent, ends))
    if jobs:
        app.out.print(render.jobs_table(jobs[:20]))
    if cluster is not None:  # one cluster's story: its agents, what happened to it lately
        for c in told:
            for beat in beats.get(c.name, []):
                app.out.print(render.agent_line(beat, now), markup=False)
        if events:
            app.out.print(render.events_table(events))


def interrupted_line(action: str, cluster: str, ago: str) -> str:
    """What `status` says of an intent a killed command left open: which command it was and
    the one that finishes it (a teardown is finished by `down`, never by `up`)."""
    if action in ("terminate", "down"):
        return (
            f"warning: an earlier `cloudtrain down {cluster}` was interrupted ({ago}); "
            f"`cloudtrain down {cluster}` again finishes it"
        )
    return (
        f"warning: an earlier `cloudtrain up` of cluster {cluster!r} was interrupted ({ago}); "
        f"`cloudtrain up` it again to finish it, or `cloudtrain down {cluster}` to remove what "
        "it made"
    )


def cost_so_far(app: App, record: ClusterRecord, now: float) -> Figure:
    """What the cluster `record` cost since it was made: its nodes' spans of this record (a
    name's earlier clusters are `cloudtrain cost`'s), at the price recorded at `up`."""
    from cloudtrain import cost

    return cost.spent(app.state.spans(record.name), now, record.name, record.created_at)


def _stops_itself(c: ClusterRecord) -> bool:
    """Whether the nodes of `c`'s provider can stop themselves (they have agents to ask)."""
    from cloudtrain.model import Capability
    from cloudtrain.provision import registry

    return Capability.AUTOSTOP in registry.provider_class(c.provider).capabilities


def _agent_beats(app: App, clusters: list[ClusterRecord]) -> dict[str, list[dict[str, Any]]]:
    """Each cluster's node agents as they see themselves (one round trip to each cluster's
    nodes); a cluster whose agents cannot be asked is left out, with a warning."""
    from cloudtrain import api
    from cloudtrain.errors import CloudtrainError

    found = {}
    for c in clusters:
        try:
            found[c.name] = api.agent_beats(app.state, app.home, c.name)
        except CloudtrainError as exc:
            app.note(f"warning: could not ask the agents of {c.name!r}: {exc}")
    return found


COMMANDS = (status,)
