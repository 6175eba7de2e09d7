"""``cloudtrain preflight NAME [--json] [--max-mib N] [--timeout S] [--logs]``: a real all-reduce
across every node and GPU of a cluster, judged against what its network should give
(`cloudtrain.preflight`). `up` of a multi-node GPU cluster runs it at its end (`after_up`).

Exit status: 0 on PASS, `EXIT_NOT_PASSED` on WARN or FAIL; bad input (an unknown cluster, a
cluster of one rank) is 2, as for every command.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from rich.table import Table
from rich.text import Text

from cloudtrain.cli.app import App
from cloudtrain.cli.options import cluster_name

if TYPE_CHECKING:
    from cloudtrain.preflight import Report

pass_app = click.make_pass_decorator(App)

#: The exit status of a preflight that did not pass (WARN or FAIL).
EXIT_NOT_PASSED = 1
_STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):g} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    return f"{nbytes / 1024:g} KiB"


def sizes_table(report: Report) -> Table:
    """The all-reduce figures per size, as nccl-tests prints them (time per call, GB/s)."""
    peak = report.peak
    table = Table(title=f"all-reduce over {report.ranks} ranks", title_justify="left")
    for col in ("size", "time", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="right")
    for s in report.sizes:
        style = "bold" if s is peak else ""
        table.add_row(
            _size(s.nbytes),
            f"{s.seconds * 1e3:.2f} ms",
            f"{s.algbw:.2f}",
            Text(f"{s.busbw:.2f}", style=style),
        )
    return table


def lines(report: Report) -> list[str]:
    """What the table does not say: transport, stream, pairs, the expectation, the verdict."""
    out = []
    target = report.target
    where = f"{target.provider} {target.instance_type or ''}".strip()
    backend = report.backend or "?"
    out.append(
        f"cluster {target.name}: {target.num_nodes} node(s) of {where}, {report.ranks} ranks "
        f"on {backend}" + (f" (job {report.job_id})" if report.job_id else "")
    )
    by_label: dict[str, list[int]] = {}
    for node, t in sorted(report.transports.items()):
        by_label.setdefault("not said" if t is None else t.label, []).append(node)
    for label, nodes in by_label.items():
        listed = ", ".join(map(str, nodes))
        out.append(f"transport: {label} (node {listed})")
    rate = report.tcp_rate
    if rate is not None and report.tcp:
        tcp = report.tcp
        out.append(
            f"TCP stream: {rate:.2f} GB/s, node {tcp['from_node']} → node {tcp['to_node']} "
            f"({tcp['addr']}, {_size(int(tcp['bytes']))})"
        )
    for (a, b), r in sorted(report.pairs.items()):
        out.append(f"pair node {a} ↔ node {b}: {r:.2f} GB/s")
    peak, fraction = report.peak, report.fraction
    if report.expected is not None and target.num_nodes > 1:
        e = report.expected
        out.append(
            f"expected: {e.gbit_per_s:g} Gb/s = {e.gbyte_per_s:g} GB/s per node "
            f"({e.fabric}; {e.note})"
        )
    if peak is not None and fraction is not None:
        against = "the TCP stream" if report.backend == "gloo" else "the NIC rate"
        out.append(
            f"peak busbw: {peak.busbw:.2f} GB/s at {_size(peak.nbytes)}, "
            f"{fraction:.0%} of {against}"
        )
    out.extend(f"note: {n}" for n in report.notes)
    return out


def show(app: App, report: Report) -> None:
    """The report as text: the sizes' table, the other figures, the verdict and its causes."""
    if report.sizes:
        app.out.print(sizes_table(report))
    for line in lines(report):
        app.out.print(line, markup=False, soft_wrap=True)
    verdict = Text(report.verdict, style=f"bold {_STYLE.get(report.verdict, '')}")
    app.out.print(verdict)
    for cause in report.causes:
        app.out.print(f"  - {cause}", markup=False, soft_wrap=True)


def after_up(app: App, name: str) -> None:
    """The preflight at the end of `up` of cluster `name`, when it is a multi-node GPU cluster;
    prints the report (a WARN or a FAIL is said, not raised: the cluster is up either way)."""
    from cloudtrain import preflight
    from cloudtrain.errors import CloudtrainError

    record = app.state.cluster(name)
    if record is None:
        return
    spec = record.spec
    if not preflight.wanted(spec.num_nodes, spec.resources.count):
        return
    app.note(
        f"preflight: an all-reduce across the {spec.num_nodes} nodes (--no-preflight skips it)"
    )
    try:
        report = preflight.run(app.state, app.home, name)
    except CloudtrainError as exc:
        app.note(f"warning: the preflight did not run: {exc}")
        return
    show(app, report)
    if not report.passed:
        app.note(
            f"warning: the cluster is up, but its preflight says {report.verdict}; "
            f"`cloudtrain preflight {name}` runs it again"
        )


@click.command()
@click.argument("name", callback=cluster_name)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--max-mib",
    type=click.IntRange(min=1, max=1 << 16),
    help="The largest all-reduce, in MiB (default: 1024 on GPU, 64 on CPU).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=10),
    default=600.0,
    show_default=True,
    help="Seconds before a rank that still runs gives up (a hung collective fails).",
)
@click.option("--logs", is_flag=True, help="Show the job's log (NCCL's lines too) as it comes.")
@pass_app
def preflight(
    app: App, /, name: str, as_json: bool, max_mib: int | None, timeout: float, logs: bool
) -> None:
    """Prove cluster NAME's network: a real all-reduce across every node and GPU.

    Measures the bus bandwidth over message sizes (as nccl-tests does), the transport NCCL
    used, each pair of nodes alone, one TCP stream and the GPUs' health, then says PASS, or
    WARN with the likely cause (NCCL on sockets on an EFA or InfiniBand machine, a slow node)."""
    from cloudtrain import preflight as pf

    def on_line(node: int, line: str) -> None:  # beside --json's output, not in it
        app.err.print(Text(f"[node {node}] {line}"), soft_wrap=True)

    target = pf.check(app.state, name)  # bad input: exit 2 before anything starts
    if not as_json:
        app.note(f"preflight of {name}: an all-reduce across its {target.num_nodes} node(s) …")
    report = pf.run(
        app.state,
        app.home,
        name,
        (on_line if as_json else app.node_line) if logs else None,
        max_bytes=None if max_mib is None else max_mib << 20,
        timeout_s=timeout,
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        show(app, report)
    if not report.passed:
        click.get_current_context().exit(EXIT_NOT_PASSED)


COMMANDS = (preflight,)
