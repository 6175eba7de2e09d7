"""`cloudtrain metrics JOB`: what a job's script reported (`runtime.report`), as a table, JSON
lines' list or CSV. The lines are first brought up to date from the job's nodes while its
cluster is up (`Coordinator.pull_metrics`), and read from the copy kept at home after `down`."""

from __future__ import annotations

import csv
import datetime
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from cloudtrain.cli.app import App, escape_controls
from cloudtrain.cli.options import job_id as job_id_arg

pass_app = click.make_pass_decorator(App)


def _cell(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name == "at":
        return datetime.datetime.fromtimestamp(value).strftime("%H:%M:%S")
    if isinstance(value, float):
        return f"{value:.6g}"
    return escape_controls(str(value))


def table(lines: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Table:
    shown = [n for n in names if n != "rank" or any(ln.get("rank") for ln in lines)]
    grid = Table(box=None, pad_edge=False)
    for name in shown:
        grid.add_column(Text(escape_controls(name)), justify="left" if name == "at" else "right")
    for line in lines:
        grid.add_row(*(Text(_cell(n, line.get(n))) for n in shown))
    return grid


@click.command()
@click.argument("job_id", callback=job_id_arg)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of the lines.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV: a header, then one row per line.")
@pass_app
def metrics(app: App, job_id: str, as_json: bool, as_csv: bool) -> None:
    """What JOB_ID's script reported with runtime.report, step by step (kept after down)."""
    from cloudtrain.errors import NotFoundError
    from cloudtrain.jobs import metrics as kept

    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    rec = app.state.job(job_id)
    if rec is None:
        raise NotFoundError(f"no job {job_id!r}; `cloudtrain status` lists jobs")
    if rec.status != "pending" and app.state.nodes(rec.cluster):
        coord = app.coordinator(rec.cluster)
        try:
            coord.pull_metrics(rec)
        finally:
            coord.close()
    lines = kept.read(app.home, job_id)
    names = kept.columns(lines)
    if as_json:
        click.echo(json.dumps(lines))
    elif as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(lines)
    elif not lines:
        app.note(f"job {job_id} reported no metrics (a script reports them with runtime.report)")
    else:
        total = kept.latest(lines).get("total_steps")
        rows = [ln for ln in lines if set(ln) - {*kept.FIELDS, "total_steps"}]
        app.out.print(table(rows, [n for n in names if n != "total_steps"]))
        if total is not None:
            app.note(f"the script said it takes {total} steps")


COMMANDS = (metrics,)
