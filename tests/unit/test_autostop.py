"""The user's side of clusters that stop themselves: limits resolved at `up`, and which clusters
the next command may settle (never one an `up` is making). What one cost so far, its deadline
included, is tests/unit/test_cost.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import autostop
from cloudtrain.records import ClusterStatus
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
    spec = ClusterSpec("c", "local", 1, limits=Limits(idle_minutes=5))
    state.put_cluster(spec, status=ClusterStatus(status))
    if intent:
        state.begin_intent("c", "apply", {})
    record = state.cluster("c")
    assert record is not None
    assert autostop.may_have_stopped(state, record) is settles
    without = ClusterSpec("d", "local", 1)
    state.put_cluster(without, status=ClusterStatus.UP)
    plain = state.cluster("d")
    assert plain is not None
    assert not autostop.may_have_stopped(state, plain), "no limits: nothing stops by itself"


def test_a_budget_must_buy_one_minute_of_the_cluster() -> None:
    from cloudtrain.errors import SpecError
    from cloudtrain.spec.limits import refuse_spent_budget

    with pytest.raises(SpecError) as refused:
        refuse_spent_budget(0.01, 1998.0, "2 node(s) at $999.00/h")
    assert str(refused.value) == (
        "--max-cost 0.01: a budget must pay for at least one minute of the cluster (2 node(s) "
        "at $999.00/h: $33.3000), the least a cloud bills a started node; give at least 33.30"
    )
    assert refused.value.field == "max_cost"
    refuse_spent_budget(33.30, 1998.0, "")  # a minute exactly
    with pytest.raises(SpecError, match=r"give at least 0\.01$"):
        refuse_spent_budget(0.0001, 0.5, "")  # under a cent: rounded up to one


def test_a_node_keeps_its_deadline_on_its_boot_clock_and_its_own_clock_after_a_reboot(
    tmp_path: Path,
) -> None:
    """`autostop --ends-in` is converted once, when it comes: asking again (an agent that
    starts again) does not move it; a policy from another boot falls back to the node's own
    wall clock as it was converted then."""
    import json
    import subprocess
    import sys
    import time

    from cloudtrain.node import agent

    def ask(*flags: str) -> dict[str, object]:
        done = subprocess.run([sys.executable, "-m", "cloudtrain.node", "autostop", "--root",
                               str(tmp_path), *flags], capture_output=True, text=True,
                              check=True)  # fmt: skip
        return dict(json.loads(done.stdout))

    told = ask("--ends-in", "30", "--why", "lifetime")
    assert 28 < float(str(told["stops_in"])) <= 30
    time.sleep(1)
    later = ask()
    assert float(str(later["stops_in"])) <= float(str(told["stops_in"])) - 1, "not anew"
    policy = agent.read_policy(tmp_path)
    assert policy is not None
    assert policy["boot_id"] == agent.boot_id()
    policy["boot_id"], policy["ends_boot"] = "another boot", 1e9
    (tmp_path / "agent" / agent.POLICY).write_text(json.dumps(policy))
    rebooted = ask()
    assert 26 < float(str(rebooted["stops_in"])) <= 29, "the wall clock of its own, converted"
    assert float(str(ask("--ends-in", "0", "--why", "budget")["stops_in"])) <= 0, "due at once"
