"""What clusters cost: node spans in, money out. Pure: no state, no clock, no catalog.

::

    cost = Σ  price per node-hour × the hours a span billed inside the window [since, until]
    a span bills from its start to its end (`until` while it is open), never past `bills_until`

Figures go by cluster (every incarnation of a name: clusters already down too), by provider,
or by job: a job's share is the node-hours of the nodes it ran on (``detail["ran_on"]``, the
node indexes of its current attempt; every node of its cluster for a record without it) while
it ran (from its start to its end, `until` while it runs). Jobs that share nodes at the same
time are each charged the whole of them, so the jobs' figures may add up to more than the
clusters'.

Amounts are `Decimal`, exact (to 28 digits) until `money` rounds one, half to even, to the
cent, for display only: a total is the rounded sum of its exact parts. A figure with a spot
span in it is an estimate (the price recorded at ``up``; the cloud's spot price moves); one
with a span of unknown price is `unpriced` (its node-hours count, its cost is left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cloudtrain.spans import SpanRecord
    from cloudtrain.state import JobRecord

__all__ = ["BY", "Figure", "Report", "billed_seconds", "money", "report", "spent"]

#: What a report may be grouped by.
BY = ("cluster", "job", "provider")
CENT = Decimal("0.01")
HOUR_S = Decimal(3600)


def money(amount: Decimal) -> Decimal:
    """`amount` to the cent, half to even (``0.125`` → ``0.12``, ``0.135`` → ``0.14``)."""
    return amount.quantize(CENT, rounding=ROUND_HALF_EVEN)


def _exact(value: float) -> Decimal:
    """A float as the decimal it was written as (``3.6`` → ``Decimal("3.6")``)."""
    return Decimal(repr(value))


@dataclass(frozen=True)
class Figure:
    """What one cluster, job or provider (`name`) cost in a window."""

    name: str
    node_hours: Decimal
    #: exact USD; `money` rounds it for display
    cost: Decimal
    #: the distinct prices per node-hour it billed at, lowest first
    prices: tuple[Decimal, ...]
    #: a spot price is in it
    estimate: bool
    #: some of its node-hours had no known price (not in `cost`)
    unpriced: bool
    #: the cluster: a cluster's figure's own name, a job's cluster (None by provider)
    cluster: str | None = None
    #: the provider, when only one is in it
    provider: str | None = None


@dataclass(frozen=True)
class Report:
    """The figures of a window, most expensive first, and their total."""

    by: str
    since: float
    until: float
    rows: tuple[Figure, ...]
    total: Figure


@dataclass
class _Tally:
    seconds: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)
    prices: set[Decimal] = field(default_factory=set)
    estimate: bool = False
    unpriced: bool = False
    providers: set[str] = field(default_factory=set)

    def add(self, span: SpanRecord, seconds: Decimal) -> None:
        self.seconds += seconds
        self.providers.add(span.provider)
        self.estimate |= span.spot
        if span.price_per_hour is None:
            self.unpriced = True
            return
        price = _exact(span.price_per_hour)
        self.prices.add(price)
        self.cost += price * seconds / HOUR_S

    def figure(self, name: str, cluster: str | None = None) -> Figure:
        return Figure(
            name=name,
            node_hours=self.seconds / HOUR_S,
            cost=self.cost,
            prices=tuple(sorted(self.prices)),
            estimate=self.estimate,
            unpriced=self.unpriced,
            cluster=cluster,
            provider=next(iter(self.providers)) if len(self.providers) == 1 else None,
        )


def billed_seconds(span: SpanRecord, start: float, end: float) -> Decimal:
    """The seconds `span` billed between `start` and `end` (an open span bills until `end`)."""
    stop = min(
        _exact(end),
        _exact(span.ended_at if span.ended_at is not None else end),
        _exact(span.bills_until if span.bills_until is not None else end),
    )
    return max(Decimal(0), stop - max(_exact(span.started_at), _exact(start)))


def _touches(span: SpanRecord, since: float, until: float) -> bool:
    """Whether the span billed at any moment of [since, until] (a moment counts)."""
    ends = min(
        span.ended_at if span.ended_at is not None else until,
        span.bills_until if span.bills_until is not None else until,
    )
    return span.started_at <= until and ends >= since


def spent(
    spans: Iterable[SpanRecord], until: float, name: str = "", made_at: float | None = None
) -> Figure:
    """What `spans` cost from their start until `until`: what cluster `name` cost so far.
    With `made_at` (its record's ``created_at``), only the spans of that cluster, not of
    earlier ones of its name (they all ended before it was made)."""
    tally = _Tally()
    for span in spans:
        if made_at is None or span.started_at >= made_at:
            tally.add(span, billed_seconds(span, span.started_at, until))
    return tally.figure(name, name or None)


def report(
    spans: Sequence[SpanRecord],
    *,
    by: str,
    since: float,
    until: float,
    jobs: Sequence[JobRecord] = (),
) -> Report:
    """The figures of [since, until] by cluster, provider or job (of `jobs`); `ValueError` for
    another `by`. A cluster or provider is in it when one of its spans billed in the window, a
    job when it ran in it."""
    if by not in BY:
        raise ValueError(f"by {by!r}: give one of {', '.join(BY)}")
    if until < since:
        raise ValueError(f"the window ends ({until}) before it starts ({since})")
    shown = [s for s in spans if _touches(s, since, until)]
    tallies: dict[str, _Tally] = {}
    owners: dict[str, str] = {}
    if by == "job":
        for job in jobs:
            if job.started_at is None or job.started_at > until:
                continue
            ended = job.ended_at if job.ended_at is not None else until
            if ended < since:
                continue
            tally = tallies[job.id] = _Tally()
            owners[job.id] = job.cluster
            ran_on = job.detail.get("ran_on")
            start, end = max(since, job.started_at), min(until, ended)
            for span in shown:
                if span.cluster == job.cluster and (ran_on is None or span.index in ran_on):
                    tally.add(span, billed_seconds(span, start, end))
    else:
        for span in shown:
            key = span.cluster if by == "cluster" else span.provider
            tallies.setdefault(key, _Tally()).add(span, billed_seconds(span, since, until))
    if by == "cluster":
        owners = {name: name for name in tallies}
    rows = sorted(
        (tally.figure(name, owners.get(name)) for name, tally in tallies.items()),
        key=lambda f: (-f.cost, f.name),
    )
    total = _Tally()
    for tally in tallies.values():
        total.seconds += tally.seconds
        total.cost += tally.cost
        total.prices |= tally.prices
        total.estimate |= tally.estimate
        total.unpriced |= tally.unpriced
        total.providers |= tally.providers
    return Report(by, since, until, tuple(rows), total.figure("total"))
