"""`cloudtrain cost [--since 30d] [--by cluster|job|provider] [--json]`: what clusters cost,
clusters already down included, from their nodes' spans at the price recorded at ``up``
(`cloudtrain.cost`). Amounts are rounded to the cent, half to even, here only; a figure with
a spot price in it is marked an estimate."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from cloudtrain.cli.app import App
from cloudtrain.cli.options import SINCE_HELP, parse_since
from cloudtrain.cost import BY, money

if TYPE_CHECKING:
    from cloudtrain.cost import Figure, Report

pass_app = click.make_pass_decorator(App)

#: The window `cost` reports when no --since is given.
DEFAULT_SINCE = "30d"
_NUMBERS = ("node-hours", "$/node-h", "cost (USD)")
_COLUMNS = {
    "cluster": ("cluster", "provider", "status"),
    "job": ("job", "cluster", "status"),
    "provider": ("provider",),
}


def price_text(price: Decimal) -> str:
    """``3.60``, ``0.9183``: cents at least, every digit the price was recorded with."""
    return f"{price:,.2f}" if price == money(price) else f"{price.normalize():,f}"


def prices_text(figure: Figure) -> str:
    """``3.60``; ``3.06-4.10`` when it billed at several prices; ``-`` when none is known."""
    if not figure.prices:
        return "-"
    low, high = figure.prices[0], figure.prices[-1]
    return price_text(low) if low == high else f"{price_text(low)}-{price_text(high)}"


def note(figure: Figure) -> str:
    """``estimate (spot)``, ``some price unknown``, both, or nothing."""
    said = ["estimate (spot)"] if figure.estimate else []
    return ", ".join(said + (["some price unknown"] if figure.unpriced else []))


def _labels(rep: Report, figure: Figure, statuses: Mapping[str, str]) -> list[str]:
    """The cells before the numbers: what the row is, and where it ran."""
    status = statuses.get(figure.name, "down" if rep.by == "cluster" else "-")
    if rep.by == "cluster":
        return [figure.name, figure.provider or "-", status]
    if rep.by == "job":
        return [figure.name, figure.cluster or "-", status]
    return [figure.name]


def cost_table(rep: Report, statuses: Mapping[str, str], since_text: str) -> Table:
    """The report as a table, its total last; `statuses`: each row's status (a recorded
    cluster's, else ``down``; a job's)."""
    from cloudtrain.cli.render import money_text

    start = datetime.datetime.fromtimestamp(rep.since).strftime("%Y-%m-%d %H:%M")
    table = Table(title=f"spend since {start} ({since_text}), by {rep.by}", title_justify="left")
    columns = _COLUMNS[rep.by]
    for col in (*columns, *_NUMBERS, "note"):
        table.add_column(col, justify="right" if col in _NUMBERS else "left")
    for figure in rep.rows:
        numbers = [f"{figure.node_hours:,.3f}", prices_text(figure), money_text(figure)]
        table.add_row(*_labels(rep, figure, statuses), *numbers, note(figure))
    table.add_section()
    total = rep.total
    blanks = [""] * (len(columns) - 1)
    numbers = [f"{total.node_hours:,.3f}", "", money_text(total)]
    table.add_row("total", *blanks, *numbers, note(total), style="bold")
    if rep.by == "job":
        table.caption = "a job is charged the nodes it ran on, while it ran"
        table.caption_justify = "left"
    return table


def figure_json(figure: Figure, status: str | None) -> dict[str, Any]:
    """One figure for ``--json``: node-hours unrounded, the cost to the cent (None when no
    price is known)."""
    from cloudtrain.cli.render import money_json

    return {
        "name": figure.name,
        "cluster": figure.cluster,
        "provider": figure.provider,
        "status": status,
        "node_hours": float(figure.node_hours),
        "prices_per_node_hour": [float(p) for p in figure.prices],
        "cost": money_json(figure),
        "estimate": figure.estimate,
        "price_unknown": figure.unpriced,
    }


@click.command()
@click.option(
    "--since",
    "since_text",
    default=DEFAULT_SINCE,
    help=f"From when (default {DEFAULT_SINCE}): {SINCE_HELP}.",
)
@click.option(
    "--by",
    type=click.Choice(BY),
    default="cluster",
    help="A row per cluster name, job or provider.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def cost(app: App, since_text: str, by: str, as_json: bool) -> None:
    """What clusters cost: node-hours × the price recorded at `up`, clusters already down
    included. A spot price's figure is an estimate."""
    from cloudtrain import cost as costs

    now = time.time()
    since = parse_since(since_text, now)
    state = app.state
    jobs = state.jobs() if by == "job" else []
    rep = costs.report(state.spans(since=since), by=by, since=since, until=now, jobs=jobs)
    statuses: dict[str, str] = {}
    if by == "job":
        statuses = {j.id: j.status for j in jobs}
    elif by == "cluster":
        statuses = {c.name: c.status for c in state.clusters()}
    if as_json:
        default = "down" if by == "cluster" else None
        data = {
            "by": by,
            "since": since,
            "until": now,
            "currency": "USD",
            "rows": [figure_json(f, statuses.get(f.name, default)) for f in rep.rows],
            "total": figure_json(rep.total, None),
        }
        click.echo(json.dumps(data, indent=2))
        return
    if not rep.rows:
        app.out.print(f"no spend since {since_text}: no node billed then", markup=False)
        return
    app.out.print(cost_table(rep, statuses, since_text))


COMMANDS = (cost,)
