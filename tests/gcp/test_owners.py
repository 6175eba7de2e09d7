"""Two owners in one project, and a cluster whose instances are all gone: through the real
google-cloud-compute client against the GCE stand-in."""

from __future__ import annotations

import pytest

from cloudtrain.errors import ConfigError
from tests.gcp import test_provider
from tests.gcp.standin import StandIn
from tests.gcp.test_provider import Make, a100

make = test_provider.make  # the fixture


def test_a_second_owner_is_refused_and_cannot_touch_the_first(make: Make, gcp: StandIn) -> None:
    alice, bob = make(owner="alice"), make(owner="bob")
    alice.apply(alice.plan(a100()))
    before = gcp.leftovers("exp1")
    with pytest.raises(ConfigError, match=r"'exp1' is taken on gcp by another owner \(alice\)"):
        bob.apply(bob.plan(a100()))
    assert bob.describe("exp1") == []
    assert bob.clusters() == []
    assert bob.leftovers("exp1") == []
    bob.terminate("exp1")
    assert gcp.leftovers("exp1") == before, "alice's instances, rules and policy are untouched"
    assert [n.index for n in alice.describe("exp1")] == [0, 1]
    alice.terminate("exp1")
    assert gcp.is_empty()


def test_rules_and_policy_left_without_instances_are_found_and_removed(
    make: Make, gcp: StandIn
) -> None:
    provider = make()
    provider.apply(provider.plan(a100()))
    for index in (0, 1):
        gcp.delete_instance(f"cloudtrain-exp1-{index}")
    fresh = make()  # no local state: only the labels and descriptions
    assert fresh.describe("exp1") == []
    assert fresh.clusters() == ["exp1"]
    assert fresh.leftovers("exp1") == [
        "firewall rules of cluster exp1",
        "placement policy cloudtrain-exp1 in us-central1",
    ]
    fresh.terminate("exp1")
    assert gcp.is_empty()
    assert fresh.leftovers("exp1") == []
    assert fresh.clusters() == []
