"""`cloudtrain metrics JOB`: what a job's script reported (`runtime.report`), as a table, a JSON
list or CSV; `cloudtrain plot JOB [METRIC]...`: its curves, to an image (matplotlib). The lines
are first brought up to date from the job's nodes while its cluster is up
(`Coordinator.pull_metrics`), and read from the copy kept at home after `down`."""

from __future__ import annotations

import csv
import datetime
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from cloudtrain.cli.app import App
from cloudtrain.cli.options import job_id as job_id_arg

pass_app = click.make_pass_decorator(App)


def _quoted(text: str) -> str:
    """`text` as it is when every character of it prints, else quoted as Python writes a
    string (``'a\\nb\\x1b'``), as the errors quote what they were given: a name from a
    node or the command line never moves the cursor, breaks a line or drives the terminal."""
    return text if text.isprintable() else repr(text)


def _cell(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name == "at":
        return datetime.datetime.fromtimestamp(value).strftime("%H:%M:%S")
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def table(lines: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Table:
    shown = [n for n in names if n != "rank" or any(ln.get("rank") for ln in lines)]
    grid = Table(box=None, pad_edge=False)
    for name in shown:
        grid.add_column(Text(_quoted(name)), justify="left" if name == "at" else "right")
    for line in lines:
        grid.add_row(*(Text(_cell(n, line.get(n))) for n in shown))
    return grid


def _lines(app: App, job_id: str) -> list[dict[str, Any]]:
    """The job's metrics, brought up to date from its nodes while its cluster is up."""
    from cloudtrain.errors import NotFoundError
    from cloudtrain.jobs import metrics as kept

    rec = app.state.job(job_id)
    if rec is None:
        raise NotFoundError(f"no job {job_id!r}; `cloudtrain status` lists jobs")
    if rec.status != "pending" and app.state.nodes(rec.cluster):
        coord = app.coordinator(rec.cluster)
        try:
            coord.pull_metrics(rec)
        finally:
            coord.close()
    return kept.read(app.home, job_id)


@click.command()
@click.argument("job_id", callback=job_id_arg)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of the lines.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV: a header, then one row per line.")
@pass_app
def metrics(app: App, job_id: str, as_json: bool, as_csv: bool) -> None:
    """What JOB_ID's script reported with runtime.report, step by step (kept after down)."""
    from cloudtrain.jobs import metrics as kept

    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    lines = _lines(app, job_id)
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


FORMATS = (".png", ".svg", ".pdf")


def draw(lines: Sequence[Mapping[str, Any]], names: Sequence[str], out: Path, title: str) -> None:
    """One panel per metric in `names` over the step, each attempt its own line; a recovery
    (a new attempt) a dashed line where it resumed. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(names), 1, figsize=(8, 2.6 * len(names)), sharex=True, squeeze=False
    )
    attempts = sorted({ln["attempt"] for ln in lines})
    for ax, name in zip(axes[:, 0], names, strict=True):
        for attempt in attempts:
            points = [
                (ln["step"], ln[name])
                for ln in lines
                if ln["attempt"] == attempt and ln.get(name) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=f"attempt {attempt}")
                if attempt:
                    ax.axvline(xs[0], linestyle="--", linewidth=0.8, color="grey")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        if len(attempts) > 1:
            ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


@click.command()
@click.argument("job_id", callback=job_id_arg)
@click.argument("names", nargs=-1, metavar="[METRIC]...")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The image: .png, .svg or .pdf (default: JOB_ID.png).",
)
@pass_app
def plot(app: App, job_id: str, names: tuple[str, ...], output: Path | None) -> None:
    """Draw JOB_ID's reported metrics over the steps (default: every metric) to an image.
    Needs matplotlib: pip install 'cloudtrain[plot]'."""
    from cloudtrain.errors import ConfigError
    from cloudtrain.jobs import metrics as kept

    output = output or Path(f"{job_id}.png")
    if output.suffix.lower() not in FORMATS:
        raise ConfigError(f"--output {str(output)!r}: the name must end in {', '.join(FORMATS)}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("plot needs matplotlib: pip install 'cloudtrain[plot]'") from None
    lines = _lines(app, job_id)
    reported = [n for n in kept.columns(lines) if n not in (*kept.FIELDS, "total_steps")]
    unknown = [n for n in names if n not in reported]
    if unknown:
        none = "none (a script reports them with runtime.report)"
        have = ", ".join(map(_quoted, reported)) or none
        raise ConfigError(f"metric {unknown[0]!r}: job {job_id} reported {have}")
    if not reported:
        raise ConfigError(
            f"job {job_id} reported no metrics (a script reports them with runtime.report)"
        )
    try:
        draw(lines, list(names) or reported, output, f"job {job_id}")
    except OSError as exc:  # a folder that is not there, or not ours to write in
        raise ConfigError(f"--output {str(output)!r}: {exc.strerror or exc}") from None
    app.note(f"wrote {_quoted(str(output))}")


COMMANDS = (metrics, plot)
