"""The per-cluster resource group and the network it holds, as exact ARM request bodies.

One resource group per cluster, ``cloudtrain-<cluster>``, tagged with the cluster, the owner and
the cluster id at creation: every other resource lives inside it, so deleting the group removes
everything (VMs, disks, NICs, public IPs, NSG, VNet, proximity placement group), and `terminate`
needs only the tags to find it. The group's name is the cluster's, so one subscription holds one
incarnation of a name (`Engine.apply` refuses another; only VMs made by hand could add one).
The bodies here are what the dry run prints and what the SDK sends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cloudtrain.model import TAG_CLUSTER, TAG_CLUSTER_ID, TAG_NODE, TAG_OWNER
from cloudtrain.providers.azure._client import Clients

log = logging.getLogger(__name__)

#: Azure tag names: cloudtrain's keys with '-' for ':' (the separator other tools expect here).
CLUSTER = TAG_CLUSTER.replace(":", "-")
OWNER = TAG_OWNER.replace(":", "-")
NODE = TAG_NODE.replace(":", "-")
CLUSTER_ID = TAG_CLUSTER_ID.replace(":", "-")
VNET, SUBNET, NSG, PPG = "cloudtrain-vnet", "nodes", "cloudtrain-nsg", "cloudtrain-ppg"
ADDRESS_SPACE = "10.0.0.0/16"
SUBNET_PREFIX = "10.0.0.0/20"  # 4091 usable addresses: room for the 1024-node maximum


def group_name(cluster: str) -> str:
    return f"cloudtrain-{cluster}"


def tags(cluster: str, owner: str, cluster_id: str | None, **extra: str) -> dict[str, str]:
    """The tags of every resource of the cluster (the id's only when there is one)."""
    return {
        CLUSTER: cluster,
        OWNER: owner,
        **({CLUSTER_ID: cluster_id} if cluster_id else {}),
        **extra,
    }


def holder(resource: Mapping[str, Any]) -> tuple[str, str]:
    """(owner, cluster id or "") as a resource's tags write them."""
    found = resource.get("tags") or {}
    return str(found.get(OWNER, "")), str(found.get(CLUSTER_ID, ""))


def mine(resource: Mapping[str, Any], owner: str, cluster_id: str | None) -> bool:
    """Tagged by `owner`, and with the id `cluster_id` when one is given."""
    found_owner, found_id = holder(resource)
    return found_owner == owner and cluster_id in (None, found_id)


def group_of(resource_id: str) -> str:
    """The resource group name in a resource id."""
    parts = resource_id.split("/")
    return parts[[p.lower() for p in parts].index("resourcegroups") + 1]


def group_body(location: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"location": location, "tags": dict(labels)}


def nsg_body(location: str, labels: Mapping[str, str], cidr: str) -> dict[str, Any]:
    """SSH (22/tcp) from `cidr` only, and everything within the cluster's subnet. Azure's
    default rules still deny every other inbound packet from the internet."""
    rule = {"direction": "Inbound", "access": "Allow", "sourcePortRange": "*"}
    return {
        "location": location,
        "tags": dict(labels),
        "properties": {
            "securityRules": [
                {
                    "name": "ssh-from-user",
                    "properties": {
                        **rule,
                        "priority": 100,
                        "protocol": "Tcp",
                        "sourceAddressPrefix": cidr,
                        "destinationAddressPrefix": "*",
                        "destinationPortRange": "22",
                        "description": "SSH from the cloudtrain user",
                    },
                },
                {
                    "name": "within-cluster",
                    "properties": {
                        **rule,
                        "priority": 110,
                        "protocol": "*",
                        "sourceAddressPrefix": SUBNET_PREFIX,
                        "destinationAddressPrefix": SUBNET_PREFIX,
                        "destinationPortRange": "*",
                        "description": "all traffic between the cluster's nodes",
                    },
                },
            ]
        },
    }


def vnet_body(location: str, labels: Mapping[str, str], nsg_id: str) -> dict[str, Any]:
    return {
        "location": location,
        "tags": dict(labels),
        "properties": {
            "addressSpace": {"addressPrefixes": [ADDRESS_SPACE]},
            "subnets": [
                {
                    "name": SUBNET,
                    "properties": {
                        "addressPrefix": SUBNET_PREFIX,
                        "networkSecurityGroup": {"id": nsg_id},
                    },
                }
            ],
        },
    }


def ppg_body(location: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A proximity placement group: the nodes in one datacenter, for fast all-reduce."""
    return {
        "location": location,
        "tags": dict(labels),
        "properties": {"proximityPlacementGroupType": "Standard"},
    }


def group_location(clients: Clients, cluster: str) -> str | None:
    """The location of the cluster's resource group, or None when there is none."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        group = clients.resources().resource_groups.get(group_name(cluster))
    except ResourceNotFoundError:
        return None
    return str(group.location)


def ensure_network(
    clients: Clients,
    cluster: str,
    labels: Mapping[str, str],
    location: str,
    cidr: str,
    *,
    ppg: bool,
) -> dict[str, str]:
    """Create or update the group, NSG, VNet/subnet and (`ppg`) placement group, each tagged
    `labels`; idempotent (ARM PUTs are). Returns the ids the VMs refer to: ``subnet``,
    ``nsg``, ``ppg``."""
    from azure.mgmt.compute.models import ProximityPlacementGroup
    from azure.mgmt.network.models import NetworkSecurityGroup, VirtualNetwork
    from azure.mgmt.resource.resources.models import ResourceGroup

    name = group_name(cluster)
    clients.resources().resource_groups.create_or_update(
        name, ResourceGroup(group_body(location, labels))
    )
    network = clients.network()
    nsg = network.network_security_groups.begin_create_or_update(
        name, NSG, NetworkSecurityGroup(nsg_body(location, labels, cidr))
    ).result()
    vnet = network.virtual_networks.begin_create_or_update(
        name, VNET, VirtualNetwork(vnet_body(location, labels, str(nsg.id)))
    ).result()
    ids = {"nsg": str(nsg.id), "subnet": f"{vnet.id}/subnets/{SUBNET}"}
    if ppg:
        made = clients.compute().proximity_placement_groups.create_or_update(
            name, PPG, ProximityPlacementGroup(ppg_body(location, labels))
        )
        ids["ppg"] = str(made.id)
    return ids


def odata(value: str) -> str:
    """`value` as an OData string literal: quoted, its quotes doubled. What goes in a
    ``$filter`` is a tag value (an owner is free text: ``$CLOUDTRAIN_OWNER``) or a region;
    a quote in it stays part of the value instead of ending the literal."""
    return "'" + value.replace("'", "''") + "'"


def cluster_groups(clients: Clients, key: str, value: str) -> list[dict[str, Any]]:
    """Resource groups tagged ``key=value`` (ARM filters by one tag server-side)."""
    found = clients.resources().resource_groups.list(
        filter=f"tagName eq {odata(key)} and tagValue eq {odata(value)}"
    )
    return [g.as_dict() for g in found]


def delete_group(clients: Clients, name: str, timeout_s: float) -> None:
    """Delete a resource group and everything in it; blocks until ARM says it is gone."""
    from azure.core.exceptions import ResourceNotFoundError

    from cloudtrain.errors import ProviderError

    try:
        poller = clients.resources().resource_groups.begin_delete(name)
    except ResourceNotFoundError:
        return
    poller.result(timeout=timeout_s)
    if not poller.done():  # result() returns None on timeout instead of raising
        raise ProviderError(
            "azure",
            "WaitTimeout",
            f"resource group {name} still being deleted after {timeout_s:.0f} s; "
            "run `cloudtrain down` again",
        )
