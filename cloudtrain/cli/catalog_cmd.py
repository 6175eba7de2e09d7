"""``cloudtrain catalog show | update``: the machine catalog's prices, and reading newer ones.

``show [--provider P]... [--json]`` lists the rows with the day each row's prices were read,
and warns when they are older than `cloudtrain.plan.catalog.STALE_DAYS` days.
``update [--provider P]... [--dry-run]`` reads the prices of exactly the catalog's rows from
the clouds' public price lists (`cloudtrain.plan.prices`), prints what changed, what could
not be read (a line per cloud) and each price refused as unbelievable (`cloudtrain.plan.bounds`:
its row keeps its old price), and writes the catalog to ``$CLOUDTRAIN_HOME/catalog.csv``
(0600, atomically), which `cloudtrain.plan.catalog.load` prefers from then on. Rows not read
keep their prices and dates. It fails (exit 3) only when no price at all could be read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from cloudtrain.cli.app import App

if TYPE_CHECKING:
    from cloudtrain.plan.catalog import Catalog, InstanceType
    from cloudtrain.plan.prices import Outcome, Update

pass_app = click.make_pass_decorator(App)

_PROVIDER_HELP = "Only this provider's rows (repeatable); default: every provider in the catalog."


@click.group()
def catalog() -> None:
    """The GPU machine catalog: what each machine costs, and when that was read."""


@catalog.command()
@click.option("--provider", "providers", multiple=True, metavar="NAME", help=_PROVIDER_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def show(app: App, providers: tuple[str, ...], as_json: bool) -> None:
    """The catalog's machines and prices (USD per node-hour), with the day each was read."""
    from cloudtrain.plan import catalog as catalogs

    cat = catalogs.load()
    _known(cat, providers)
    rows = [r for r in cat.rows if not providers or r.provider in providers]
    warning = cat.staleness(rows=[r for r in rows if not r.retired] or rows)
    source = catalogs.home_path() if cat is not catalogs.shipped() else None
    if as_json:
        data = {
            "prices_read_on": catalogs.oldest(rows) if rows else cat.prices_read_on,
            "updated_file": str(source) if source else None,
            "stale": warning,
            "rows": [_row_json(r) for r in rows],
        }
        click.echo(json.dumps(data, indent=2))
    else:
        app.out.print(_rows_table(rows, source))
    if warning:
        app.note(f"warning: {warning}")


@catalog.command()
@click.option("--provider", "providers", multiple=True, metavar="NAME", help=_PROVIDER_HELP)
@click.option("--dry-run", is_flag=True, help="Read and show the changes; write nothing.")
@pass_app
def update(app: App, providers: tuple[str, ...], dry_run: bool) -> None:
    """Read the prices of the catalog's machines from the clouds' public price lists (AWS
    Price List API, Azure Retail Prices API, GCP Cloud Billing Catalog API)."""
    from cloudtrain.errors import ProviderError, StateError
    from cloudtrain.plan import catalog as catalogs
    from cloudtrain.plan import prices

    result = prices.update(catalogs.load(), providers or None)
    for outcome in result.outcomes:
        for line in _outcome_lines(outcome):
            app.out.print(line, markup=False, soft_wrap=True)
    if result.read == 0:
        names = ", ".join(o.provider for o in result.outcomes)
        raise ProviderError(names, "PricesNotRead", "no price could be read; nothing changed")
    app.out.print(_changes(result))
    if dry_run:
        app.note("dry run: nothing written")
        return
    path = catalogs.home_path()
    try:
        catalogs.save(result.catalog, path)
    except OSError as exc:
        raise StateError(f"cannot write {path}: {exc.strerror or exc}") from None
    app.note(f"wrote {path}: the prices of {result.read} rows, read on {_today(result)}")


def _known(cat: Catalog, providers: Sequence[str]) -> None:
    from cloudtrain.errors import ConfigError, suggest

    known = cat.providers()
    for name in providers:
        if name not in known:
            raise ConfigError(
                f"no catalog rows for provider {name!r}{suggest(name, known)}; "
                f"the catalog's providers: {', '.join(known)}"
            )


def _outcome_lines(outcome: Outcome) -> list[str]:
    """``aws: read 12 of 13 rows; not in the price list: p3.2xlarge (eu-west-1)``, or
    ``gcp: not read: no credentials ...``, then a line per problem."""
    name = outcome.provider
    if outcome.error is not None:
        return [f"{name}: not read: {outcome.error}"]
    line = f"{name}: read {outcome.read} of {len(outcome.asked)} rows"
    if outcome.missing:
        gone = ", ".join(f"{r.instance_type} ({r.region})" for r in outcome.missing)
        line += f"; not in the price list, kept as they were: {gone}"
    return [line] + [f"{name}: {problem}" for problem in outcome.problems]


def _changes(result: Update) -> Table | str:
    """The changed prices, old → new; a line when none changed."""
    from cloudtrain.plan.catalog import money

    if not result.changes:
        return "no price changed"
    table = Table(title="changed prices, USD per node-hour", title_justify="left")
    for column in ("provider", "instance type", "region", "on-demand", "spot"):
        table.add_column(column)
    for change in result.changes:
        old, new = change.old, change.new
        cells = []
        for before, after in (
            (old.ondemand_usd_per_hour, new.ondemand_usd_per_hour),
            (old.spot_usd_per_hour, new.spot_usd_per_hour),
        ):
            was, now = ("-" if p is None else money(p) for p in (before, after))
            cells.append(was if before == after else f"{was} → {now}")
        table.add_row(new.provider, new.instance_type, new.region, *cells)
    return table


def _today(result: Update) -> str:
    return max(r.prices_read_on for r in result.catalog.rows)


def _rows_table(rows: Sequence[InstanceType], source: object) -> Table:
    from cloudtrain.plan.catalog import money

    table = Table(caption_justify="left")
    for column in ("provider", "instance type", "gpus", "region", "on-demand $/h", "spot $/h"):
        table.add_column(column, justify="right" if "$" in column else "left")
    table.add_column("read on")
    table.add_column("status")
    for r in rows:
        spot = "-" if r.spot_usd_per_hour is None else money(r.spot_usd_per_hour)
        cells = (r.instance_type, r.gpus, r.region, money(r.ondemand_usd_per_hour), spot)
        table.add_row(r.provider, *cells, r.prices_read_on, r.status)
    table.caption = (
        f"prices updated by `cloudtrain catalog update` ({source})"
        if source
        else "prices as shipped with cloudtrain"
    )
    return table


def _row_json(row: InstanceType) -> dict[str, Any]:
    return {
        "provider": row.provider,
        "instance_type": row.instance_type,
        "accelerator": row.accelerator,
        "accelerator_count": row.accelerator_count,
        "region": row.region,
        "zones": list(row.zones),
        "ondemand_usd_per_hour": row.ondemand_usd_per_hour,
        "spot_usd_per_hour": row.spot_usd_per_hour,
        "prices_read_on": row.prices_read_on,
        "status": row.status,
    }


COMMANDS: tuple[click.Command, ...] = (catalog,)
