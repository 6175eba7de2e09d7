"""cloudtrain.cost on a recorded history: figures to the cent, by cluster, job and provider,
in a window that cuts spans, with a span still open and a spot price marked an estimate."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from cloudtrain import cost
from cloudtrain.model import NodeInfo
from cloudtrain.records import ClusterStatus
from cloudtrain.spans import SpanRecord
from cloudtrain.spec import ClusterSpec
from cloudtrain.spec.limits import Limits
from cloudtrain.state import JobRecord, State

T0 = 1_800_000_000.0
NOW = T0 + 7200


def span(
    cluster: str,
    index: int,
    start: float,
    end: float | None,
    price: float | None,
    *,
    provider: str = "aws",
    spot: bool = False,
    node_id: str | None = None,
    bills_until: float | None = None,
) -> SpanRecord:
    return SpanRecord(
        id=0,
        cluster=cluster,
        cluster_id=None,
        index=index,
        node_id=node_id or f"{cluster}-{index}",
        provider=provider,
        region=None,
        zone=None,
        instance_type=None,
        price_per_hour=price,
        spot=spot,
        started_at=start,
        ended_at=end,
        bills_until=bills_until,
        end_reason=None if end is None else "down",
    )


#: Cluster a: 2 on-demand nodes at $32.77, its node 1 replaced after 30 min (a minute without
#: it); cluster b: 1 spot node at $1.234, still running; cluster c: a node with no price.
HISTORY = [
    span("a", 0, T0, T0 + 3600, 32.77),
    span("a", 1, T0, T0 + 1800, 32.77),
    span("a", 1, T0 + 1860, T0 + 3600, 32.77, node_id="a-1-again"),
    span("b", 0, T0 + 1000, None, 1.234, provider="gcp", spot=True),
    span("c", 0, T0, T0 + 600, None, provider="local"),
]


def job(
    job_id: str, cluster: str, start: float | None, end: float | None, **detail: Any
) -> JobRecord:
    return JobRecord(
        id=job_id,
        seq=int(job_id.rsplit("-", 1)[1]),
        cluster=cluster,
        name="train",
        status="running" if end is None else "succeeded",
        created_at=T0,
        started_at=start,
        ended_at=end,
        exit_code=None,
        num_nodes=1,
        nproc_per_node=1,
        command=("t.py",),
        detail=MappingProxyType(detail),
    )


def cents(figure: cost.Figure) -> str:
    return str(cost.money(figure.cost))


def rows(report: cost.Report) -> dict[str, tuple[str, str, bool, bool]]:
    """name → (node-hours to 6 places, cost to the cent, estimate, unpriced)."""
    return {f.name: (f"{f.node_hours:.6f}", cents(f), f.estimate, f.unpriced) for f in report.rows}


def test_by_cluster_over_the_whole_history_to_the_cent() -> None:
    report = cost.report(HISTORY, by="cluster", since=T0 - 86400, until=NOW)
    assert rows(report) == {
        # 3600 + 1800 + 1740 s = 1.983333 h × 32.77 = 64.993833
        "a": ("1.983333", "64.99", False, False),
        # open: 6200 s to now = 1.722222 h × 1.234 = 2.125222; spot: an estimate
        "b": ("1.722222", "2.13", True, False),
        "c": ("0.166667", "0.00", False, True),
    }
    assert [f.name for f in report.rows] == ["a", "b", "c"], "most expensive first"
    assert report.rows[0].prices == (Decimal("32.77"),)
    assert report.rows[0].cluster == "a"
    # the total is the rounded sum of the exact figures: 64.993833 + 2.125222 = 67.119056
    assert cents(report.total) == "67.12"
    assert f"{report.total.node_hours:.6f}" == "3.872222"
    assert (report.total.estimate, report.total.unpriced) == (True, True)
    assert report.total.prices == (Decimal("1.234"), Decimal("32.77"))


def test_a_window_cuts_spans_and_leaves_out_what_ended_before_it() -> None:
    report = cost.report(HISTORY, by="cluster", since=T0 + 900, until=NOW)
    assert rows(report) == {
        # 2700 + 900 + 1740 s = 1.483333 h × 32.77 = 48.608833
        "a": ("1.483333", "48.61", False, False),
        "b": ("1.722222", "2.13", True, False),
    }
    later = cost.report(HISTORY, by="cluster", since=T0 + 3600, until=T0 + 4600)
    assert rows(later) == {
        "a": ("0.000000", "0.00", False, False),  # it ended at the window's first moment
        "b": ("0.277778", "0.34", True, False),  # 1000 s × 1.234 / 3600 = 0.342778
    }


def test_by_provider_and_the_open_span_bills_until_now() -> None:
    report = cost.report(HISTORY, by="provider", since=T0 - 1, until=T0 + 2000)
    assert rows(report) == {
        # 2000 + 1800 + 140 s = 1.094444 h × 32.77 = 35.864944
        "aws": ("1.094444", "35.86", False, False),
        # 1000 s of the open span: 0.277778 h × 1.234 = 0.342778
        "gcp": ("0.277778", "0.34", True, False),
        "local": ("0.166667", "0.00", False, True),
    }
    assert {f.name: f.provider for f in report.rows} == {
        "aws": "aws",
        "gcp": "gcp",
        "local": "local",
    }
    assert all(f.cluster is None for f in report.rows)


def test_by_job_charges_the_nodes_it_ran_on_while_it_ran() -> None:
    jobs = [
        job("a-1", "a", T0 + 600, T0 + 2400, ran_on=[0]),
        job("a-2", "a", T0 + 1700, T0 + 1900),  # an older record: every node of its cluster
        job("b-3", "b", T0 + 5000, None, ran_on=[0]),  # still running: until now
        job("a-4", "a", None, None),  # never started
        job("a-5", "a", T0 - 900, T0 - 600, ran_on=[0]),  # before the window
    ]
    report = cost.report(HISTORY, by="job", since=T0 - 300, until=NOW, jobs=jobs)
    assert rows(report) == {
        # 1800 s of node 0 × 32.77 / 3600 = 16.385 exactly: half to even is 16.38
        "a-1": ("0.500000", "16.38", False, False),
        # node 0 200 s, node 1 100 s (until it went), its replacement 40 s: 340 s = 3.094944
        "a-2": ("0.094444", "3.09", False, False),
        # 2200 s × 1.234 / 3600 = 0.754111
        "b-3": ("0.611111", "0.75", True, False),
    }
    assert {f.name: f.cluster for f in report.rows} == {"a-1": "a", "a-2": "a", "b-3": "b"}
    assert cents(report.total) == "20.23"  # 16.385 + 3.094944 + 0.754111 = 20.234056


def test_money_rounds_half_to_even_only_at_display() -> None:
    assert str(cost.money(Decimal("0.125"))) == "0.12"
    assert str(cost.money(Decimal("0.135"))) == "0.14"
    # $4.50 for 100 s is 0.125 exactly; 3600 one-second pieces at $0.36/h add up to 0.36
    assert cents(cost.spent([span("x", 0, T0, T0 + 100, 4.5)], NOW)) == "0.12"
    pieces = [span("x", i, T0 + i, T0 + i + 1, 0.36) for i in range(3600)]
    assert cost.spent(pieces, NOW).cost == Decimal("0.36")


def test_the_cost_so_far_of_a_cluster_leaves_out_earlier_ones_of_its_name() -> None:
    earlier = span("x", 0, T0, T0 + 3600, 3.6)
    now = span("x", 0, T0 + 7200, None, 3.6)
    assert cents(cost.spent([earlier, now], T0 + 9000, "x")) == "5.40"
    assert cents(cost.spent([earlier, now], T0 + 9000, "x", made_at=T0 + 7100)) == "1.80"


def test_a_span_never_bills_past_its_clusters_lifetime() -> None:
    ending = span("x", 0, T0, None, 36.0, bills_until=T0 + 100)
    assert cost.billed_seconds(ending, T0, T0 + 37) == Decimal(37)
    assert cost.billed_seconds(ending, T0, T0 + 3600) == Decimal(100)
    assert cost.billed_seconds(ending, T0 + 200, T0 + 3600) == Decimal(0)


def test_bad_grouping_or_window_is_refused() -> None:
    with pytest.raises(ValueError, match="by 'node'"):
        cost.report(HISTORY, by="node", since=T0, until=NOW)
    with pytest.raises(ValueError, match="before it starts"):
        cost.report(HISTORY, by="cluster", since=NOW, until=T0)


# -- from the state: what a cluster with a budget cost so far ---------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
def state(tmp_path: Path, clock: Clock) -> Iterator[State]:
    with State.open(tmp_path / "home", clock=clock) as opened:
        yield opened


def local_node(index: int) -> NodeInfo:
    return NodeInfo("c", index, f"c-{index}", "127.0.0.1", None, "running")


def test_the_cost_so_far_stops_at_the_deadline(state: State, clock: Clock) -> None:
    """$36/h for 2 nodes and a $1 budget: it ends 100 s after `up`, whatever the clock says."""
    limits = Limits(max_cost=1).resolved(1000.0, price_per_hour=36.0)
    spec = ClusterSpec("c", "local", 2, limits=limits)
    state.put_cluster(spec, status=ClusterStatus.UP, price_per_hour=36.0)
    state.set_nodes("c", [local_node(0), local_node(1)])
    assert cents(cost.spent(state.spans("c"), 1000.0 + 37)) == "0.37"
    assert cents(cost.spent(state.spans("c"), 1000.0 + 3600)) == "1.00"
    clock.now = 5000.0  # found gone long after: the deadline still ends what it cost
    state.set_nodes("c", [])
    assert cents(cost.spent(state.spans("c"), 9999.0)) == "1.00"
    assert [s.end_reason for s in state.spans("c")] == ["gone", "gone"]
