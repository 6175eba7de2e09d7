"""The cluster id through the real azure-mgmt clients against the ARM stand-in: every resource
made carries it, and `describe`/`terminate`/`leftovers` with an id keep to that incarnation.

The resource group's name is the cluster's (``cloudtrain-<cluster>``), so cloudtrain never
makes two incarnations of a name in one subscription (`apply` refuses the second). A second one
is made here the two ways it could still exist: a VM of it inside the first's group (by hand, or
the SDK as here), or a whole second group of the name (the provider's own hooks, with the group
name patched: what a hand-made copy would look like)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from cloudtrain.boot.bootstrap import NodeKeys
from cloudtrain.errors import ConfigError
from cloudtrain.model import ignore_event
from cloudtrain.providers.azure import _instances as inst
from cloudtrain.providers.azure import _resources as res
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.spec import ClusterSpec
from tests.azure import test_provider
from tests.azure.standin import StandIn
from tests.azure.test_provider import Make, spec, two_regions

make = test_provider.make  # the fixture
ID_A, ID_B = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


def of(cluster_id: str | None, nodes: int = 2) -> ClusterSpec:
    return dataclasses.replace(spec(nodes=nodes), cluster_id=cluster_id)


def tagged(azure: StandIn, suffix: str) -> dict[str, str]:
    return dict(azure.resource(suffix)["tags"])


def vm_of(provider: AzureProvider, incarnation: ClusterSpec, index: int) -> None:
    """A VM of `incarnation` made through the SDK inside the cluster's group (its network)."""
    from azure.mgmt.compute.models import VirtualMachine

    offer = provider.plan(incarnation).offers[0]
    group = res.group_name(incarnation.name)
    network = provider.clients.network()
    ids = {
        "nsg": str(network.network_security_groups.get(group, res.NSG).id),
        "subnet": f"{network.virtual_networks.get(group, res.VNET).id}/subnets/{res.SUBNET}",
    }
    body = inst.vm_body(
        incarnation, offer, offer.zones[0], index, owner=provider.owner, ids=ids,
        custom=inst.custom_data(offer, NodeKeys.placeholders()), public_key="ssh-ed25519 AAAA",
    )  # fmt: skip
    name = inst.vm_name(incarnation.name, index)
    provider.clients.compute().virtual_machines.begin_create_or_update(
        group, name, VirtualMachine(body)
    ).result()


def test_every_resource_made_carries_the_id_also_after_a_failed_region(
    make: Make, azure: StandIn
) -> None:
    azure.add_fault("ZonalAllocationFailed", region="eastus")  # eastus' group is cleaned
    provider = make(catalog=two_regions())
    plan = provider.plan(of(ID_A))
    labels = {"cloudtrain-cluster": "exp1", "cloudtrain-owner": "tester"}
    mine = {**labels, "cloudtrain-cluster-id": ID_A}
    assert plan.requests[0]["PUT resourceGroups/cloudtrain-exp1"]["tags"] == mine  # the dry run
    nodes = provider.apply(plan)
    assert {n.region for n in nodes} == {"westus2"}
    assert "DELETE resourceGroups/cloudtrain-exp1" in azure.mutations()
    for suffix in (
        "resourceGroups/cloudtrain-exp1",
        "networkSecurityGroups/cloudtrain-nsg",
        "virtualNetworks/cloudtrain-vnet",
        "proximityPlacementGroups/cloudtrain-ppg",
    ):
        assert tagged(azure, suffix) == mine, suffix
    for index in (0, 1):
        assert tagged(azure, f"virtualMachines/exp1-{index}") == {
            **mine,
            "cloudtrain-node": str(index),
        }
    assert provider.holders("exp1") == {("tester", ID_A)}
    assert [n.index for n in provider.describe("exp1", ID_A)] == [0, 1]


def test_a_vm_of_another_incarnation_in_the_group_is_left_with_the_group(
    make: Make, azure: StandIn
) -> None:
    provider = make()
    provider.apply(provider.plan(of(ID_A)))
    vm_of(provider, of(ID_B), 2)
    assert provider.holders("exp1") == {("tester", ID_A), ("tester", ID_B)}
    assert [(n.index, n.node_id) for n in provider.describe("exp1", ID_A)] == [
        (0, "exp1-0"),
        (1, "exp1-1"),
    ]
    assert [n.node_id for n in provider.describe("exp1", ID_B)] == ["exp1-2"]
    assert [n.index for n in provider.describe("exp1")] == [0, 1, 2]
    provider.terminate("exp1", ID_A)
    left = azure.leftovers()
    assert left["virtualMachines"] == ["exp1-2"], "b's VM, and the group it lives in, stay"
    assert left["resourceGroups"] == ["cloudtrain-exp1"]
    assert [n.node_id for n in provider.describe("exp1", ID_B)] == ["exp1-2"]
    assert provider.describe("exp1", ID_A) == []
    assert provider.leftovers("exp1", ID_A) == ["resource group cloudtrain-exp1"]
    provider.terminate("exp1")  # every incarnation
    assert azure.leftovers() == {}


def test_two_groups_of_one_name_terminate_by_id_keeps_the_other(
    make: Make, azure: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = make()
    provider.apply(provider.plan(of(ID_A)))
    b = of(ID_B, nodes=1)
    offer = provider.plan(b).offers[0]
    keys = NodeKeys.placeholders()
    with monkeypatch.context() as patch:  # b in a group cloudtrain would not name so
        patch.setattr(res, "group_name", lambda cluster: f"cloudtrain-{cluster}-b")
        prepared = provider.prepare(b, offer, keys, ignore_event)
        provider.create(b, offer, offer.zones[0], [0], keys, prepared)
    assert tagged(azure, "resourceGroups/cloudtrain-exp1-b")["cloudtrain-cluster-id"] == ID_B
    assert [(n.index, n.extra["resource_group"]) for n in provider.describe("exp1", ID_A)] == [
        (0, "cloudtrain-exp1"),
        (1, "cloudtrain-exp1"),
    ]
    assert [n.extra["resource_group"] for n in provider.describe("exp1", ID_B)] == [
        "cloudtrain-exp1-b"
    ]
    assert provider.leftovers("exp1", ID_B) == ["resource group cloudtrain-exp1-b"]
    theirs = {k: v for k, v in azure.store.resources.items() if "/cloudtrain-exp1-b" in k}
    provider.terminate("exp1", ID_A)
    assert azure.store.resources == theirs, "only b's group and what it holds are left"
    assert [n.index for n in provider.describe("exp1")] == [0]
    provider.terminate("exp1")
    assert azure.leftovers() == {}


def test_apply_under_another_id_of_this_owner_is_refused_before_any_write(
    make: Make, azure: StandIn
) -> None:
    provider = make()
    provider.apply(provider.plan(of(ID_B)))
    before = copy.deepcopy(azure.store.resources)
    writes = len(azure.mutations())
    with pytest.raises(ConfigError, match=rf"another cluster of owner tester \(id {ID_B}\)"):
        provider.apply(provider.plan(of(ID_A)))
    assert azure.store.resources == before
    assert len(azure.mutations()) == writes
    assert provider.describe("exp1", ID_A) == []
    assert provider.leftovers("exp1", ID_A) == []
    provider.terminate("exp1", ID_A)  # nothing of a: nothing goes
    assert azure.store.resources == before


def test_terminate_without_an_id_removes_every_incarnation(make: Make, azure: StandIn) -> None:
    provider = make()
    provider.apply(provider.plan(of(ID_A)))
    vm_of(provider, of(ID_B), 2)
    vm_of(provider, of(None), 3)  # and one of an older version, without an id
    assert provider.holders("exp1") == {("tester", ID_A), ("tester", ID_B), ("tester", "")}
    assert provider.leftovers("exp1") == ["resource group cloudtrain-exp1"]
    provider.terminate("exp1")
    assert azure.leftovers() == {}
    assert provider.holders("exp1") == set()


def test_a_cluster_of_an_older_version_is_found_only_without_an_id(
    make: Make, azure: StandIn
) -> None:
    provider = make()
    provider.apply(provider.plan(of(None)))
    assert "cloudtrain-cluster-id" not in tagged(azure, "resourceGroups/cloudtrain-exp1")
    assert "cloudtrain-cluster-id" not in tagged(azure, "virtualMachines/exp1-0")
    assert provider.holders("exp1") == {("tester", "")}
    assert [n.index for n in provider.describe("exp1")] == [0, 1]
    assert provider.describe("exp1", "0123456789ab") == []
    assert provider.leftovers("exp1", "0123456789ab") == []
    before = copy.deepcopy(azure.store.resources)
    provider.terminate("exp1", "0123456789ab")
    assert azure.store.resources == before
    with pytest.raises(ConfigError, match=r"another cluster of owner tester \(id none\)"):
        provider.apply(provider.plan(of("0123456789ab")))
    assert azure.store.resources == before
    provider.terminate("exp1")
    assert azure.leftovers() == {}
