"""``cloudtrain check [--provider NAME]... [--gpus A100:8]... [--json]``: per cloud, are
credentials present and valid, what GPU quota is left, and what to fix (`cloudtrain.check`).

The clouds are checked side by side, each with one read-only call for its identity and a few
for its quotas; nothing is created. The machines of interest are the catalog's for that cloud
(``--gpus`` narrows them: ``A100:8``, or ``A100`` for any count), in the catalog's regions.

Exit status: 0 when every cloud named with ``--provider`` is usable (`CloudCheck.usable`) or,
with none named, when at least one cloud is; else `EXIT_NOT_USABLE`. Bad input is 2, as for
every command.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from cloudtrain.cli.app import App
from cloudtrain.cli.options import with_account_options
from cloudtrain.provision import registry

if TYPE_CHECKING:
    from cloudtrain.check import CloudCheck
    from cloudtrain.plan.catalog import InstanceType

pass_app = click.make_pass_decorator(App)

#: The exit status when a cloud asked for (or, with none asked for, every cloud) is not usable.
EXIT_NOT_USABLE = 1


def machines(provider: str, gpus: Sequence[str]) -> list[InstanceType]:
    """The catalog's machines of `provider` that match any of `gpus` (all when empty); for a
    provider the catalog does not price (a cluster the team runs), one node of each of `gpus`.
    Raises `ConfigError` for an accelerator the catalog does not know."""
    from cloudtrain.plan import catalog
    from cloudtrain.spec import parse_gpus

    cat = catalog.load()
    wanted = []
    for raw in gpus:
        name, count = parse_gpus(raw, cat.accelerators(), "--gpus")
        wanted.append((name, count if ":" in raw else None))
    if not registry.plugin(provider).cloud:
        return [_node(provider, name, count or 1) for name, count in wanted]
    rows = cat.find(provider=provider)
    if not gpus:
        return rows
    return [
        r
        for r in rows
        if any(r.accelerator == n and c in (None, r.accelerator_count) for n, c in wanted)
    ]


def _node(provider: str, accelerator: str, count: int) -> InstanceType:
    """One node of `count` `accelerator`s where the catalog has no machines: named by its GPUs,
    in every region (`cloudtrain.check.GLOBAL`), priced at nothing."""
    from cloudtrain.check import GLOBAL
    from cloudtrain.plan.catalog import InstanceType

    gpus = f"{accelerator}:{count}"
    return InstanceType(
        provider, gpus, accelerator, count, 0, "", 0, 0, GLOBAL, (), 0.0, None, "", ""
    )


def account_options(flags: dict[str, Any], clouds: Sequence[str]) -> dict[str, Any]:
    """The account options given (``--profile``…, ``-o KEY=VALUE``), by key; `ConfigError`
    for a ``-o`` key that none of `clouds` takes."""
    from cloudtrain.cli.options import loose_settings
    from cloudtrain.errors import ConfigError
    from cloudtrain.provision.registry import account_keys

    given = loose_settings(flags)
    taken = sorted({k for p in clouds for k in account_keys(p)})
    for item in flags.get("opt_generic") or ():
        key, sep, value = str(item).partition("=")
        if not sep or key not in taken:
            raise ConfigError(
                f"--option {item!r}: no cloud checked takes {key!r}; they take: "
                f"{', '.join(taken) or 'none'} (write KEY=VALUE)"
            )
        given[key] = value
    return given


def _text(value: str) -> Text:
    """A cell as given (no markup; the console shows its control characters escaped: it may
    quote a cloud)."""
    return Text(value)


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def summary_table(checks: Sequence[CloudCheck]) -> Table:
    table = Table(title="clouds", title_justify="left")
    for col in ("cloud", "credentials", "valid", "identity", "usable"):
        table.add_column(col)
    for c in checks:
        found = (c.source or "present") if c.present else "not found"
        valid = {True: "yes", False: "no", None: "-"}[c.valid]
        table.add_row(
            c.provider,
            _text(found),
            valid,
            _text(c.identity or "-"),
            Text("yes", style="green") if c.usable else Text("no", style="red"),
        )
    return table


def quota_table(c: CloudCheck) -> Table:
    """The quotas read for `c`, with the GPUs each governs."""
    gpus = {r.row.instance_type: r.row.accelerator for r in c.room}
    table = Table(title=f"{c.provider} quotas", title_justify="left")
    for col in ("region", "quota", "for", "limit", "used", "left", "unit"):
        table.add_column(col, justify="right" if col in ("limit", "used", "left") else "left")
    for q in c.quotas:
        kind = {True: " (spot)", False: "", None: ""}[q.spot]
        accelerators = sorted({gpus.get(t, t) for t, _ in q.needs})
        smallest = min((n for _, n in q.needs), default=0)
        left = Text(_number(q.left), style="red" if smallest and q.left < smallest else "")
        table.add_row(
            q.region,
            _text(q.name + kind),
            ", ".join(accelerators),
            _number(q.limit),
            _number(q.used),
            left,
            q.unit,
        )
    return table


def room_table(c: CloudCheck) -> Table:
    """How many nodes of each machine of interest the quotas leave room for."""
    table = Table(title=f"{c.provider}: nodes the quotas leave room for", title_justify="left")
    for col in ("GPUs", "instance type", "region", "on-demand", "spot"):
        table.add_column(col, justify="right" if col in ("on-demand", "spot") else "left")
    by_row: dict[tuple[str, str], dict[bool, int | None]] = {}
    rows: dict[tuple[str, str], InstanceType] = {}
    for r in c.room:
        key = (r.row.instance_type, r.row.region)
        rows[key] = r.row
        by_row.setdefault(key, {})[r.spot] = r.nodes
    for key, nodes in by_row.items():
        row = rows[key]
        cells = [
            "-" if spot not in nodes else ("?" if nodes[spot] is None else str(nodes[spot]))
            for spot in (False, True)
        ]
        table.add_row(row.gpus, row.instance_type, row.region, *cells)
    return table


@click.command()
@click.option(
    "--provider",
    "providers",
    multiple=True,
    type=click.Choice(registry.checked()),
    help="Only this cloud or cluster (repeat for more; default: every one).",
)
@click.option(
    "--gpus",
    multiple=True,
    help="The GPUs of interest, e.g. A100:8 or A100 (repeat for more; default: the catalog's).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@with_account_options
@pass_app
def check(
    app: App, /, providers: tuple[str, ...], gpus: tuple[str, ...], as_json: bool, **flags: Any
) -> None:
    """Per cloud: are credentials present and valid, what GPU quota is left, what to fix.

    One read-only call per cloud tells whether its credentials are valid, and a few more read
    its GPU quotas in the catalog's regions; nothing is created."""
    from cloudtrain.check import check as check_cloud
    from cloudtrain.provision.registry import account_keys

    clouds = list(dict.fromkeys(providers)) or registry.checked()
    rows = {p: machines(p, gpus) for p in clouds}  # bad input: exit 2 before any call
    given = account_options(flags, clouds)
    wanted = ", ".join(gpus)

    def one(provider: str) -> CloudCheck:
        options = {k: v for k, v in given.items() if k in account_keys(provider)}
        return check_cloud(provider, rows[provider], options, wanted=wanted)

    with ThreadPoolExecutor(max_workers=len(clouds)) as pool:
        checks = list(pool.map(one, clouds))
    usable = [c.provider for c in checks if c.usable]
    if as_json:
        data = {"clouds": [c.to_json() for c in checks], "usable": usable}
        click.echo(json.dumps(data, indent=2))
    else:
        show(app, checks, bool(gpus))
    ok = len(usable) == len(checks) if providers else bool(usable)
    if not ok:
        click.get_current_context().exit(EXIT_NOT_USABLE)


def show(app: App, checks: Sequence[CloudCheck], room: bool) -> None:
    """The tables, then what to fix."""
    app.out.print(summary_table(checks))
    for c in checks:
        if c.quotas:
            app.out.print(quota_table(c))
            if room:
                app.out.print(room_table(c))
    fixes = [(c.provider, f) for c in checks for f in c.findings]
    if fixes:
        app.out.print("what to fix:", markup=False)
        for provider, f in fixes:
            line = f"  {provider}: {f.problem}" + (f"\n      → {f.fix}" if f.fix else "")
            app.out.print(line, markup=False, soft_wrap=True)
    elif all(c.usable for c in checks):
        app.out.print("nothing to fix", markup=False)


COMMANDS = (check,)
