"""Two owners in one subscription, and a cluster whose VMs are all gone: through the real
azure-mgmt clients against the ARM stand-in."""

from __future__ import annotations

import pytest

from cloudtrain.errors import ConfigError
from tests.azure import test_provider
from tests.azure.standin import StandIn
from tests.azure.test_provider import Make, spec

make = test_provider.make  # the fixture


def test_a_second_owner_is_refused_and_cannot_touch_the_first(make: Make, azure: StandIn) -> None:
    alice, bob = make(owner="alice"), make(owner="bob")
    alice.apply(alice.plan(spec()))
    before = azure.leftovers()
    with pytest.raises(ConfigError, match=r"'exp1' is taken on azure by another owner \(alice\)"):
        bob.apply(bob.plan(spec()))
    assert bob.describe("exp1") == []
    assert bob.clusters() == []
    assert bob.leftovers("exp1") == []
    bob.terminate("exp1")
    assert azure.leftovers() == before, "alice's resource group is untouched"
    assert [n.index for n in alice.describe("exp1")] == [0, 1]
    alice.terminate("exp1")
    assert azure.leftovers() == {}


def test_a_group_left_without_vms_is_found_and_removed(make: Make, azure: StandIn) -> None:
    provider = make()
    provider.apply(provider.plan(spec()))
    compute = provider.clients.compute()
    for node in provider.describe("exp1"):
        compute.virtual_machines.begin_delete("cloudtrain-exp1", node.node_id).result()
    fresh = make()
    assert fresh.describe("exp1") == []
    assert fresh.clusters() == ["exp1"]
    assert fresh.leftovers("exp1") == ["resource group cloudtrain-exp1"]
    fresh.terminate("exp1")
    assert azure.leftovers() == {}


def test_an_owner_with_a_quote_is_one_odata_literal_in_every_filter(
    make: Make, azure: StandIn
) -> None:
    """The owner is free text (``$CLOUDTRAIN_OWNER``, ``user@host``): its quote is doubled in
    the tag ``$filter``, never pasted in to end the literal."""
    provider = make(owner="o'brien@host")
    provider.apply(provider.plan(spec()))
    assert provider.clusters() == ["exp1"]
    assert azure.requests("GET", "resourceGroups")[-1].query["$filter"] == (
        "tagName eq 'cloudtrain-owner' and tagValue eq 'o''brien@host'"
    )
    assert make(owner="o").clusters() == []
    assert provider.leftovers("exp1") == ["resource group cloudtrain-exp1"]
    provider.terminate("exp1")
    assert azure.leftovers() == {}
