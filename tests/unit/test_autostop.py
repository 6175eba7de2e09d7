"""The user's side of clusters that stop themselves: limits resolved at `up`, and which clusters
the next command may settle (never one an `up` is making). What one cost so far, its deadline
included, is tests/unit/test_cost.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import autostop
from cloudtrain.spec import ClusterSpec
from cloudtrain.spec.limits import Limits
from cloudtrain.state import State


@pytest.fixture
def state(tmp_path: Path) -> Iterator[State]:
    with State.open(tmp_path / "home", clock=lambda: 1000.0) as opened:
        yield opened


def test_the_budget_ends_when_price_times_hours_reaches_it() -> None:
    limits = Limits(max_cost=10, max_hours=8).resolved(1000.0, price_per_hour=4.0)
    assert (limits.ends_at, limits.ends_why) == (1000.0 + 2.5 * 3600, "budget")
    longer = Limits(max_cost=100, max_hours=8).resolved(1000.0, price_per_hour=4.0)
    assert (longer.ends_at, longer.ends_why) == (1000.0 + 8 * 3600, "lifetime")
    assert Limits(idle_minutes=5).resolved(1000.0, 4.0).ends_at is None
    assert not Limits(ends_at=5.0), "what `up` resolved is not a limit the user asked"


@pytest.mark.parametrize(
    ("status", "intent", "settles"),
    [("up", False, True), ("provisioning", False, False), ("bootstrapping", False, False),
     ("up", True, False), ("stopped", False, True)],
)  # fmt: skip
def test_an_up_under_way_is_never_taken_for_a_stopped_cluster(
    state: State, status: str, intent: bool, settles: bool
) -> None:
    state.put_cluster(ClusterSpec("c", "local", 1, limits=Limits(idle_minutes=5)), status=status)
    if intent:
        state.begin_intent("c", "apply", {})
    record = state.cluster("c")
    assert record is not None
    assert autostop.may_have_stopped(state, record) is settles
    without = ClusterSpec("d", "local", 1)
    state.put_cluster(without, status="up")
    plain = state.cluster("d")
    assert plain is not None
    assert not autostop.may_have_stopped(state, plain), "no limits: nothing stops by itself"
