"""The ARM stand-in itself, through the real SDK: it must behave like ARM where the provider's
guarantees depend on it (deleteOption, Failed VMs, error shapes, tokens, paging), or the
provider tests would prove nothing."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError

from cloudtrain.boot.bootstrap import NodeKeys
from cloudtrain.model import Offer
from cloudtrain.providers.azure import _instances as inst
from cloudtrain.providers.azure import _resources as res
from cloudtrain.providers.azure._client import Clients
from cloudtrain.spec import ClusterSpec, Resources
from tests.azure.standin import StandIn

SIZE = "Standard_NC24ads_A100_v4"


def vm_request(clients: Clients, *, zone: str = "1", delete: str = "Delete") -> Any:
    """A one-node VM request as the provider sends it, with every deleteOption = `delete`."""
    from azure.mgmt.compute.models import VirtualMachine

    spec = ClusterSpec("t", "azure", 1, Resources("A100-80GB", 1), ssh_cidr="203.0.113.7/32")
    offer = Offer(
        "azure",
        "eastus",
        ("1",),
        SIZE,
        3.6,
        accelerator="A100-80GB",
        accelerator_count=1,
        extra={"image": inst.UBUNTU},
    )
    ids = res.ensure_network(
        clients, "t", res.tags("t", "me", None), "eastus", "203.0.113.7/32", ppg=False
    )
    keys = NodeKeys.placeholders()
    body = inst.vm_body(
        spec,
        offer,
        zone,
        0,
        owner="me",
        ids=ids,
        custom=inst.custom_data(offer, keys),
        public_key="ssh-ed25519 AAAA",
    )
    props = body["properties"]
    props["storageProfile"]["osDisk"]["deleteOption"] = delete
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    nic["deleteOption"] = delete
    nic["ipConfigurations"][0]["properties"]["publicIPAddressConfiguration"]["properties"][
        "deleteOption"
    ] = delete
    return VirtualMachine(body)


@pytest.fixture
def clients(azure: StandIn) -> Clients:
    return Clients(poll_s=0)


def test_delete_option_detach_leaves_disk_nic_and_ip_behind(
    clients: Clients, azure: StandIn
) -> None:
    vms = clients.compute().virtual_machines
    vms.begin_create_or_update("cloudtrain-t", "t-0", vm_request(clients, delete="Detach")).result()
    vms.begin_delete("cloudtrain-t", "t-0").result()
    left = azure.leftovers()
    assert "virtualMachines" not in left
    assert (left["disks"], left["networkInterfaces"], left["publicIPAddresses"]) == (
        ["t-0-os"],
        ["t-0-nic"],
        ["t-0-ip"],
    )


def test_allocation_failure_keeps_a_failed_vm_and_errors_have_misleading_classes(
    clients: Clients, azure: StandIn
) -> None:
    azure.add_fault("AllocationFailed", zone="1")
    azure.add_fault("SkuNotAvailable", zone="2")
    vms = clients.compute().virtual_machines
    poller = vms.begin_create_or_update("cloudtrain-t", "t-0", vm_request(clients))
    with pytest.raises(HttpResponseError) as failed:
        poller.result()
    assert failed.value.error is not None
    assert (failed.value.status_code, failed.value.error.code) == (200, "AllocationFailed")
    vm = vms.get("cloudtrain-t", "t-0").as_dict()
    assert vm["properties"]["provisioningState"] == "Failed"
    assert azure.leftovers()["networkInterfaces"] == ["t-0-nic"]  # made before allocation
    with pytest.raises(ResourceExistsError) as sku:  # a 409: "exists" has nothing to do with it
        vms.begin_create_or_update("cloudtrain-t", "t-1", vm_request(clients, zone="2"))
    assert sku.value.error is not None
    assert sku.value.error.code == "SkuNotAvailable"
    vms.begin_delete("cloudtrain-t", "t-0").result()
    assert {"virtualMachines", "networkInterfaces", "publicIPAddresses"}.isdisjoint(
        azure.leftovers()
    )


def test_groups_filter_by_tag_page_and_delete_everything_inside(
    clients: Clients, azure: StandIn
) -> None:
    for cluster in ("a", "b", "c"):
        labels = res.tags(cluster, "me", None)
        res.ensure_network(clients, cluster, labels, "eastus", "203.0.113.7/32", ppg=True)
    azure.page_size = 1
    assert [g["name"] for g in res.cluster_groups(clients, res.OWNER, "me")] == [
        "cloudtrain-a",
        "cloudtrain-b",
        "cloudtrain-c",
    ]
    assert [g["name"] for g in res.cluster_groups(clients, res.CLUSTER, "b")] == ["cloudtrain-b"]
    res.delete_group(clients, "cloudtrain-b", timeout_s=10)
    res.delete_group(clients, "cloudtrain-b", timeout_s=10)  # gone: nothing to do
    assert not [r for r in azure.store.resources if "cloudtrain-b" in r]
    assert azure.leftovers()["proximityPlacementGroups"] == ["cloudtrain-ppg"] * 2


def test_a_filter_value_is_an_odata_literal_its_quotes_doubled(
    clients: Clients, azure: StandIn
) -> None:
    labels = res.tags("q", "o'brien@host", None)
    res.ensure_network(clients, "q", labels, "eastus", "203.0.113.7/32", ppg=False)
    found = res.cluster_groups(clients, res.OWNER, "o'brien@host")
    assert [g["name"] for g in found] == ["cloudtrain-q"]
    assert azure.requests("GET", "resourceGroups")[-1].query["$filter"] == (
        "tagName eq 'cloudtrain-owner' and tagValue eq 'o''brien@host'"
    )
    assert res.cluster_groups(clients, res.OWNER, "o'brien") == []
    groups = clients.resources().resource_groups
    with pytest.raises(HttpResponseError, match="InvalidFilter"):  # a quote pasted in: no literal
        list(groups.list(filter="tagName eq 'cloudtrain-owner' and tagValue eq 'o'brien@host'"))


def test_only_its_own_tokens_open_arm_and_only_over_tls(azure: StandIn) -> None:
    url = f"{azure.base}/subscriptions/{azure.store.subscription}/resourcegroups?api-version=1"
    context = ssl.create_default_context(cafile=str(azure.ca_file))
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(
            urllib.request.Request(url, headers={"Authorization": "Bearer made-up"}),
            context=context,
        )
    assert denied.value.code == 401
    assert json.loads(denied.value.read())["error"]["code"] == "AuthenticationFailed"
    with pytest.raises(urllib.error.URLError):  # its certificate is trusted by nobody else
        urllib.request.urlopen(url, context=ssl.create_default_context())
