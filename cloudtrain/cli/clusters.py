"""Cluster commands: up, down, gpus, autostop (`status` is `cloudtrain.cli.status_cmd`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cloudtrain.cli.app import App
from cloudtrain.cli.options import (
    cluster_name,
    given_options,
    listed,
    loose_settings,
    provider_options,
    provider_settings,
    with_account_options,
)

if TYPE_CHECKING:
    from cloudtrain.model import NodeInfo, OnEvent
    from cloudtrain.plan.optimizer import Ranking
    from cloudtrain.spec import ClusterSpec, TaskSpec

pass_app = click.make_pass_decorator(App)


def cluster_options(fn: Any) -> Any:
    """The flags that shape a cluster (each overrides the task file's field), and every
    provider's own options, as each provider declares them."""
    options = [
        click.option("--name", "-n", help="Cluster name: lowercase letters, digits, '-'."),
        click.option("--provider", "-p", help=f"Where: {', '.join(listed())} or any (default: "
                     "local; with --gpus, any: the cheapest cloud whose credentials are here)."),
        click.option("--nodes", "num_nodes", type=str, help="Number of nodes."),
        click.option("--gpus", help="Accelerator and count per node, e.g. A100:8, V100:1."),
        click.option("--spot", is_flag=True, default=None, help="Use spot/preemptible nodes."),
        click.option("--region", help="Region to use."),
        click.option("--zone", help="Zone to use."),
        click.option("--disk-gb", type=int, help="Root disk size per node (default 200)."),
        click.option("--image", help="Machine image to boot."),
        click.option(
            "--ssh-cidr",
            help="Where SSH is allowed from (default: this machine's "
            "public address; 0.0.0.0/0 only when you say so).",
        ),
        click.option("--idle-minutes", help="Its nodes go after this long without a job or an "
                     "SSH session of yours (their agents judge it; this machine may be off)."),
        click.option("--down-when-idle", is_flag=True, default=None, help="With --idle-minutes: "
                     "delete the idle cluster (the next command removes what is left), not "
                     "keep it stopped for `up` to bring back."),
        click.option("--max-hours", help="Delete the cluster this many hours after `up`, idle or "
                     "not."),
        click.option("--max-cost", help="Delete the cluster when it has cost this many USD "
                     "(the price at launch × node-hours)."),
        click.option("--max-price", help="The most USD per node-hour an offer may cost (the "
                     "catalog's price; spot's with --spot)."),
        click.option("--no-preflight", is_flag=True, help="Skip the all-reduce check across "
                     "the nodes at the end of up of a multi-node GPU cluster."),
        *provider_options(),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn


def load_task(task_file: Path | None, **flags: Any) -> TaskSpec:
    """A validated task from an optional YAML file with the cluster flags on top, and the
    provider's own options (checked against what it declares) in its `extra`."""
    import dataclasses

    from cloudtrain.spec import ANYWHERE, taskfile, validate_num_nodes

    overrides = {
        "name": flags.get("name"),
        "provider": flags.get("provider"),
        "num_nodes": flags.get("num_nodes"),
        "resources.accelerator": flags.get("gpus"),
        "resources.spot": flags.get("spot"),
        "resources.region": flags.get("region"),
        "resources.zone": flags.get("zone"),
        "resources.disk_gb": flags.get("disk_gb"),
        "resources.image": flags.get("image"),
        **{k: flags.get(k) for k in ("idle_minutes", "down_when_idle", "max_hours", "max_cost")},
    }
    task = (
        taskfile.from_flags(overrides) if task_file is None else taskfile.load(task_file, overrides)
    )
    task = with_access(task, flags.get("ssh_cidr"))
    cluster = task.cluster
    if cluster.provider == ANYWHERE:  # each cloud takes its own (`anywhere.on`)
        return dataclasses.replace(
            task,
            cluster=dataclasses.replace(cluster, extra={**cluster.extra, **loose_settings(flags)}),
        )
    settings = provider_settings(cluster.provider, flags)
    if not settings:
        return task
    num_nodes = cluster.num_nodes
    if flags.get("num_nodes") is None:  # a host list says how many nodes (checked here)
        for opt, value in given_options(cluster.provider, flags).values():
            if opt.nodes is not None:
                num_nodes = validate_num_nodes(opt.nodes(str(value)), opt.cli)
    cluster = dataclasses.replace(cluster, num_nodes=num_nodes, extra={**cluster.extra, **settings})
    return dataclasses.replace(task, cluster=cluster)


def with_access(task: TaskSpec, ssh_cidr: str | None) -> TaskSpec:
    """The task with --ssh-cidr applied (validated: bad input costs nothing)."""
    import dataclasses

    from cloudtrain.access import validate_cidr

    if ssh_cidr is None:
        return task
    cluster = dataclasses.replace(task.cluster, ssh_cidr=validate_cidr(ssh_cidr))
    return dataclasses.replace(task, cluster=cluster)


def validate_max_price(value: str | None) -> float | None:
    """--max-price as a number of USD per node-hour (None: unbounded)."""
    if value is None:
        return None
    try:
        price = float(value)
    except ValueError:
        price = -1.0
    if not 0 < price < float("inf"):
        from cloudtrain.errors import ConfigError

        raise ConfigError(
            f"--max-price {value!r} is not a price; allowed: a positive number of USD per "
            "node-hour, e.g. 3.5"
        )
    return price


def bring_up(
    app: App,
    task: TaskSpec,
    dry_run: bool,
    *,
    setup: bool = True,
    down_on_failure: bool = False,
    max_price: str | None = None,
    preflight: bool = True,
    on_event: OnEvent | None = None,
    before_unlock: Callable[[], None] | None = None,
) -> None:
    """`up`'s body, shared with `launch`: the cluster made (on the cheapest cloud at hand when
    it names none), its bootstrap waited for, and its network checked (`preflight`) when it
    has several GPU nodes. `on_event` sees its events (default: `App.event` shows them);
    `before_unlock` as `api.up` runs it."""
    from cloudtrain import anywhere, api
    from cloudtrain.cli import render
    from cloudtrain.provision import registry
    from cloudtrain.spec import ANYWHERE

    price_cap = validate_max_price(max_price)
    spec = anywhere.place(app.state, task.cluster)
    if spec.provider == ANYWHERE or price_cap is not None:
        ranking = anywhere.rank(spec, price_cap)
        _show_ranking(app, spec, ranking, dry_run)
        if not dry_run:
            _up_cheapest(
                app, spec, ranking, setup, down_on_failure, on_event or app.event, before_unlock
            )
            _preflight(app, spec.name, setup and preflight)
        return
    if dry_run:
        plan = api.plan(spec, app.home, dry_run=True)
        app.out.print(render.plan_table(plan))
        if plan.requests:
            import json

            app.out.print("the requests the first offer would send:", markup=False)
            app.out.print(json.dumps(list(plan.requests), indent=2, default=str), markup=False)
        app.out.print(
            f"dry run: would create {spec.num_nodes} node(s) of {plan.offer.instance_type} on "
            f"{spec.provider} for ${plan.price_per_hour:.2f}/h; nothing was created",
            markup=False,
        )
        if plan.unresolved:
            app.out.print(
                "not asked of the cloud (placeholders above): " + "; ".join(plan.unresolved),
                markup=False,
            )
        if spec.provider not in registry.available():
            app.note(f"note: the {spec.provider} provider cannot create clusters in this version")
        return
    app.note(f"Bringing up {spec.name!r}: {spec.num_nodes} node(s) on {spec.provider} …")
    _bring_up(
        app,
        spec,
        setup,
        down_on_failure,
        lambda: api.up(
            app.state,
            app.home,
            spec,
            on_event or app.event,
            bootstrap_timeout_s=1800 if setup else None,
            before_unlock=before_unlock,
        ),
    )
    _preflight(app, spec.name, setup and preflight)


def _preflight(app: App, name: str, wanted: bool) -> None:
    """The preflight after `up` (a multi-node GPU cluster only; not with --no-setup, whose
    nodes have no torch yet, nor with --no-preflight)."""
    if wanted:
        from cloudtrain.cli.preflight_cmd import after_up

        after_up(app, name)


def _show_ranking(app: App, spec: ClusterSpec, ranking: Ranking, dry_run: bool) -> None:
    """The offers `up` tries in order (all of them in a dry run, else the first few), what
    was left out, and a warning when the catalog's prices are old."""
    from cloudtrain.cli import render
    from cloudtrain.plan import catalog

    stale = catalog.staleness()
    if stale:
        app.note(f"warning: {stale}")
    app.out.print(render.ranking_table(spec, ranking, most=None if dry_run else 5))
    for line in ranking.skipped:
        app.note(f"  left out: {line}")
    if dry_run:
        tries = ", then ".join(f"{c.provider} ({', '.join(c.regions)})" for c in ranking.choices())
        app.out.print(f"dry run: would try {tries}; nothing was created", markup=False)


def _up_cheapest(
    app: App,
    spec: ClusterSpec,
    ranking: Ranking,
    setup: bool,
    down_on_failure: bool,
    on_event: OnEvent,
    before_unlock: Callable[[], None] | None,
) -> None:
    from cloudtrain import anywhere

    first = ranking.offers[0]
    app.note(
        f"Bringing up {spec.name!r}: {spec.num_nodes} node(s), cheapest first "
        f"({first.provider} {first.region} at ${first.price_per_node_hour:.2f}/node-hour) …"
    )
    _bring_up(
        app,
        spec,
        setup,
        down_on_failure,
        lambda: anywhere.up(
            app.state,
            app.home,
            spec,
            ranking,
            on_event,
            bootstrap_timeout_s=1800 if setup else None,
            before_unlock=before_unlock,
        ),
    )


def _bring_up(
    app: App,
    spec: ClusterSpec,
    setup: bool,
    down_on_failure: bool,
    create: Callable[[], list[NodeInfo]],
) -> None:
    """Run `create` (an `up`), then say what is up, or what was kept when the bootstrap
    failed."""
    from cloudtrain import api
    from cloudtrain.cli import render
    from cloudtrain.errors import BootstrapError

    try:
        with app.err.status(f"provisioning {spec.name}"):
            nodes = create()
    except BootstrapError:
        if down_on_failure:
            app.note(f"the bootstrap failed; tearing {spec.name!r} down (--down-on-failure)")
            api.down(app.state, app.home, spec.name, on_event=app.event)
        else:
            app.note(
                f"the cluster is kept for inspection; `cloudtrain down {spec.name}` removes it"
            )
        raise
    record = app.state.cluster(spec.name)
    price = record.price_per_hour if record and record.price_per_hour is not None else 0.0
    app.out.print(render.nodes_table(nodes))
    app.out.print(f"cluster {spec.name} is up: {len(nodes)} node(s), ${price:.2f}/h", markup=False)
    if record is not None and record.spec.limits:
        app.note(f"{spec.name} stops itself {record.spec.limits.text()}")


@click.command()
@click.argument("task_file", required=False, type=click.Path(path_type=Path))
@cluster_options
@click.option("--dry-run", is_flag=True, help="Print the plan and its price; create nothing.")
@click.option(
    "--no-setup",
    is_flag=True,
    help="Stop after provisioning; do not wait for the nodes' bootstrap.",
)
@click.option(
    "--down-on-failure",
    is_flag=True,
    help="Tear the cluster down when a node's bootstrap fails (default: keep it for inspection).",
)
@pass_app
def up(
    app: App,
    /,
    task_file: Path | None,
    dry_run: bool,
    no_setup: bool,
    down_on_failure: bool,
    **flags: Any,
) -> None:
    """Create a cluster (or complete a half-made one) from flags and/or TASK_FILE, and wait
    until every node's bootstrap reports ready."""
    task = load_task(task_file, **flags)
    bring_up(
        app,
        task,
        dry_run,
        setup=not no_setup,
        down_on_failure=down_on_failure,
        max_price=flags.get("max_price"),
        preflight=not flags.get("no_preflight"),
    )


@click.command()
@click.argument("name", callback=cluster_name)
@click.option("--idle-minutes", help="Minutes without a job before each node removes itself.")
@click.option("--off", is_flag=True, help="Never: the cluster stays until `cloudtrain down`.")
@pass_app
def autostop(app: App, name: str, idle_minutes: str | None, off: bool) -> None:
    """Set when cluster NAME stops itself when idle (the idle clock starts again now), or
    --off. Its nodes' agents act on it, with this machine on or off."""
    from cloudtrain import api
    from cloudtrain.spec.limits import validate_idle_minutes

    if off == (idle_minutes is not None):
        raise click.UsageError("give --idle-minutes N or --off")
    idle = None if off else validate_idle_minutes(idle_minutes)
    beats = api.autostop(app.state, app.home, name, idle)
    record = app.state.cluster(name)
    text = record.spec.limits.text() if record else "never"
    when = "never stops by itself" if text == "never" else f"stops itself {text}"
    app.out.print(f"cluster {name} {when} ({len(beats)} node(s) told)", markup=False)


@click.command()
@click.argument("name", required=False, callback=cluster_name)
@click.option(
    "--provider",
    "-p",
    help="Where to look when the local state has no record (found by tag; default local).",
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Every cluster: those recorded here and those of this owner found by tag.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask before --all.")
@click.option(
    "--forget",
    is_flag=True,
    help="Drop the record of NAME when its provider finds nothing of it, or can reach none "
    "of it (what plain `down` cannot remove); deletes nothing.",
)
@click.option(
    "--owner",
    help="Whose clusters (default $CLOUDTRAIN_OWNER, else user@host): to clean up from "
    "another machine what you made on one.",
)
@with_account_options
@pass_app
def down(
    app: App,
    /,
    name: str | None,
    provider: str | None,
    every: bool,
    yes: bool,
    forget: bool,
    owner: str | None,
    **flags: Any,
) -> None:
    """Tear down cluster NAME: stop its jobs, delete every node and resource it has.

    Idempotent: a cluster that does not exist is "nothing to do" (exit 0).
    """
    from cloudtrain import api
    from cloudtrain.errors import ConfigError
    from cloudtrain.provision import registry

    record = app.state.cluster(name) if name else None
    pname = provider or (record.provider if record else None if every else registry.default())
    given = provider_settings(pname, flags) if pname else loose_settings(flags)
    options = {**given, **({"owner": owner} if owner else {})} or None
    if every == bool(name):
        raise ConfigError("give a cluster NAME, or --all (not both)")
    if forget:
        if every:
            raise ConfigError("--forget takes one cluster NAME, not --all")
        why = api.forget(app.state, app.home, str(name), on_event=app.event)
        app.out.print(f"cluster {name} is forgotten here: {why}", markup=False)
        return
    from cloudtrain.reconcile import every_cluster

    walk = every_cluster(app.state, app.home, provider, options) if every else []
    targets = [(name, provider, options)] if name else walk
    if every:
        if not targets:
            app.out.print("nothing to do: no clusters", markup=False)
            return
        listing = ", ".join(f"{n} ({p})" for n, p, _ in targets)
        if not yes and not _confirm(f"tear down {listing}?"):
            raise ConfigError("nothing was torn down (pass --yes to skip the question)")
    for target, where, acct in targets:
        with app.err.status(f"tearing down {target}"):
            done = api.down(
                app.state,
                app.home,
                str(target),
                provider_name=where,
                options=acct,
                on_event=app.event,
            )
        if done:
            app.out.print(f"cluster {target} is down; nothing of it is left running", markup=False)
        else:
            app.out.print(f"nothing to do: no cluster named {target!r}", markup=False)


def _confirm(question: str) -> bool:
    """Ask on the terminal; no terminal (or end of input) is a no."""
    try:
        return click.confirm(question, err=True)
    except click.Abort:
        return False


@click.command()
@click.option("--provider", "-p", help="Only this provider's machines.")
@click.option("--accelerator", "-a", help="Only this GPU (V100, V100-32GB, A100, A100-80GB).")
@click.option("--spot", is_flag=True, help="Sort and show by spot price.")
@click.option("--all", "show_all", is_flag=True, help="Include retired machine types.")
@pass_app
def gpus(
    app: App, provider: str | None, accelerator: str | None, spot: bool, show_all: bool
) -> None:
    """What the catalog offers, with prices, cheapest first."""
    from cloudtrain.cli import render
    from cloudtrain.errors import ConfigError, suggest
    from cloudtrain.plan import catalog
    from cloudtrain.spec import parse_gpus

    cat = catalog.load()
    count = None
    if accelerator:
        raw = accelerator
        accelerator, count = parse_gpus(raw, cat.accelerators(), "--accelerator")
        if ":" not in raw:
            count = None  # every count of that GPU
    if provider and provider not in cat.providers():
        raise ConfigError(
            f"--provider {provider!r} has no catalog entries{suggest(provider, cat.providers())};"
            f" allowed: {', '.join(cat.providers())}"
        )
    rows = cat.find(
        provider=provider, accelerator=accelerator, count=count, spot=spot, include_retired=show_all
    )
    app.out.print(render.gpus_table(rows, spot, cat.prices_read_on))


COMMANDS = (up, down, gpus, autostop)
