"""The VM request of one node, and which zones of a region may give a VM size.

Each VM makes its own NIC (accelerated networking, in the cluster's NSG) and Standard static
public IP through ``networkInterfaceConfigurations``, and all three — OS disk, NIC, public IP —
carry ``deleteOption: Delete``: deleting the VM (also one whose allocation failed) leaves nothing
(ARM's default, ``Detach``, would keep them and keep billing for the IP and disk).

Images: Ubuntu 24.04 LTS (its Python 3.12 installs cloudtrain) on the plain GPU sizes; on the
InfiniBand sizes (ND40rs_v2, ND96asr_v4, ND96amsr_A100_v4) Microsoft's Ubuntu-HPC 24.04 image,
which ships the Mellanox OFED/IB stack, NVIDIA driver, NCCL and the NDv4 topology file; the
bootstrap's ``nccl`` phase gives every job on them Azure's recommended IB settings
(`cloudtrain.boot.gpustack.FABRIC_NCCL`).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from cloudtrain.boot import bootstrap
from cloudtrain.boot.gpustack import FABRIC_NCCL
from cloudtrain.errors import ConfigError
from cloudtrain.model import NodeInfo, Offer
from cloudtrain.node import notices, selfstop
from cloudtrain.providers.azure import _resources as res
from cloudtrain.spec import ClusterSpec
from cloudtrain.spec.limits import Limits

UBUNTU = {
    "publisher": "Canonical",
    "offer": "ubuntu-24_04-lts",
    "sku": "server",
    "version": "latest",
}
UBUNTU_HPC = {
    "publisher": "microsoft-dsvm",
    "offer": "ubuntu-hpc",
    "sku": "2404",
    "version": "latest",
}
#: InfiniBand sizes (their NCCL settings are the bootstrap's:
#: `cloudtrain.boot.gpustack.FABRIC_NCCL`).
INFINIBAND = frozenset(FABRIC_NCCL)
NETWORK_API_VERSION = "2020-11-01"
NODE_USER = bootstrap.NODE_USER
#: provisioningState → NodeInfo.state ("failed": allocation failed; the VM must be deleted)
STATES = {
    "Succeeded": "running",
    "Creating": "pending",
    "Updating": "pending",
    "Deleting": "stopping",
    "Failed": "failed",
}


def image(size: str, requested: str | None) -> dict[str, str]:
    """The image reference: `requested` (``publisher:offer:sku:version`` or an image resource
    id) when given, else Ubuntu-HPC on InfiniBand sizes and Ubuntu 24.04 elsewhere."""
    if requested is None:
        return dict(UBUNTU_HPC if size in INFINIBAND else UBUNTU)
    if requested.lower().startswith("/subscriptions/"):
        return {"id": requested}
    parts = requested.split(":")
    if len(parts) != 4 or not all(parts):
        raise ConfigError(
            f"resources.image {requested!r} is not an Azure image: write "
            "publisher:offer:sku:version (e.g. Canonical:ubuntu-24_04-lts:server:latest) or an "
            "image resource id (/subscriptions/…)"
        )
    return dict(zip(("publisher", "offer", "sku", "version"), parts, strict=True))


#: ``customData`` takes 64 KiB before its base64.
CUSTOM_DATA_LIMIT = 64 * 1024


def user_data(shape: bootstrap.NodeShape, keys: bootstrap.NodeKeys) -> dict[str, bytes]:
    """What an Azure VM boots with, by field, before the base64 the request wraps it in."""
    doc = bootstrap.cloud_config(shape, keys)
    return {"customData": bootstrap.fit(doc, CUSTOM_DATA_LIMIT, "Azure customData")}


def custom_data(offer: Offer, keys: bootstrap.NodeKeys, limits: Limits | None = None) -> str:
    """The node's cloud-init user-data, base64 as ``customData`` takes it. Holds public keys,
    the cluster's host key (pinned by the coordinator) and the bootstrap; no cloud credential
    (a node with `limits` stops itself through its own managed identity: `_identity`)."""
    shape = bootstrap.NodeShape.of(offer, notices.SCHEDULED_EVENTS, limits, selfstop.ARM_DELETE)
    return base64.b64encode(user_data(shape, keys)["customData"]).decode()


def index_of(vm: Mapping[str, Any]) -> int:
    """The node a VM is, from its tag."""
    return int((vm.get("tags") or {}).get(res.NODE, "0"))


def vm_name(cluster: str, index: int) -> str:
    return f"{cluster}-{index}"


def vm_body(
    spec: ClusterSpec,
    offer: Offer,
    zone: str | None,
    index: int,
    *,
    owner: str,
    ids: Mapping[str, str],
    custom: str,
    public_key: str,
) -> dict[str, Any]:
    """The exact VM PUT body of node `index` (the dry run prints it)."""
    name = vm_name(spec.name, index)
    public_ip = {
        "name": f"{name}-ip",
        "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {"deleteOption": "Delete", "publicIPAllocationMethod": "Static"},
    }
    nic = {
        "name": f"{name}-nic",
        "properties": {
            "primary": True,
            "deleteOption": "Delete",
            "enableAcceleratedNetworking": bool(offer.extra.get("accelerated_networking", True)),
            "networkSecurityGroup": {"id": ids["nsg"]},
            "ipConfigurations": [
                {
                    "name": "ipconfig1",
                    "properties": {
                        "primary": True,
                        "subnet": {"id": ids["subnet"]},
                        "publicIPAddressConfiguration": public_ip,
                    },
                }
            ],
        },
    }
    user = bootstrap.NODE_USER
    props: dict[str, Any] = {
        "hardwareProfile": {"vmSize": offer.instance_type},
        "storageProfile": {
            "imageReference": dict(offer.extra["image"]),
            "osDisk": {
                "name": f"{name}-os",
                "createOption": "FromImage",
                "deleteOption": "Delete",
                "caching": "ReadWrite",
                "diskSizeGB": spec.resources.disk_gb,
                "managedDisk": {"storageAccountType": "Premium_LRS"},
            },
        },
        "osProfile": {
            "computerName": name,
            "adminUsername": user,
            "customData": custom,
            "linuxConfiguration": {
                "disablePasswordAuthentication": True,
                "provisionVMAgent": True,
                "ssh": {
                    "publicKeys": [
                        {"path": f"/home/{user}/.ssh/authorized_keys", "keyData": public_key}
                    ]
                },
            },
        },
        "networkProfile": {
            "networkApiVersion": NETWORK_API_VERSION,
            "networkInterfaceConfigurations": [nic],
        },
    }
    if "ppg" in ids:
        props["proximityPlacementGroup"] = {"id": ids["ppg"]}
    if offer.spot:
        props.update(priority="Spot", evictionPolicy="Delete", billingProfile={"maxPrice": -1})
    body: dict[str, Any] = {
        "location": offer.region,
        "tags": res.tags(spec.name, owner, spec.cluster_id, **{res.NODE: str(index)}),
        "properties": props,
    }
    if zone is not None:
        body["zones"] = [zone]
    if spec.limits:  # it deletes itself when idle or ended, as itself (`_identity`)
        body["identity"] = {"type": "SystemAssigned"}
    return body


def accelerated_networking(skus: Iterable[Mapping[str, Any]], size: str) -> bool:
    """Whether `size` supports accelerated networking (its SKU's capability; asking for it on a
    size without it is a 400 from ARM, so a size that does not say so does not get it)."""
    for sku in skus:
        if sku.get("name") == size and sku.get("resourceType") == "virtualMachines":
            caps = {c.get("name"): c.get("value") for c in sku.get("capabilities") or []}
            return str(caps.get("AcceleratedNetworkingEnabled", "False")).lower() == "true"
    return False


def sku_zones(
    skus: Iterable[Mapping[str, Any]], size: str, region: str, wanted: Sequence[str]
) -> tuple[list[str] | None, str]:
    """The zones of `wanted` (all the region has when empty) where the subscription may create
    `size`, read from ``resource_skus.list`` (availability and restrictions); ``[]`` in a region
    without zones; None and the reason when the region cannot give it."""
    found = [
        s for s in skus if s.get("name") == size and s.get("resourceType") == "virtualMachines"
    ]
    if not found:
        return None, f"{region} does not offer {size}"
    sku = found[0]
    zones: set[str] = set()
    for info in sku.get("locationInfo") or []:
        if str(info.get("location", "")).lower() == region.lower():
            zones |= set(info.get("zones") or [])
    for rule in sku.get("restrictions") or []:
        if rule.get("type") == "Location":
            return None, f"{size} is restricted in {region} ({rule.get('reasonCode')})"
        if rule.get("type") == "Zone":
            zones -= set((rule.get("restrictionInfo") or {}).get("zones") or [])
    offered = {str(z) for info in sku.get("locationInfo") or [] for z in info.get("zones") or []}
    if not offered:
        return [], ""  # a region without zones: one regional attempt
    usable = [z for z in wanted if z in zones] if wanted else sorted(zones)
    if not usable:
        where = ", ".join(wanted or sorted(offered))
        return None, f"{size} is available in no zone of {region} ({where}) for this subscription"
    return usable, ""


def plan_requests(spec: ClusterSpec, offer: Offer, owner: str) -> tuple[dict[str, Any], ...]:
    """The requests the dry run shows: those of the first offer, keys and ids as placeholders."""
    region, cluster = offer.region, spec.name
    group = res.group_name(cluster)
    labels = res.tags(cluster, owner, spec.cluster_id)
    ids = {"nsg": f"<{res.NSG} in {group}>", "subnet": f"<{res.VNET}/{res.SUBNET}>"}
    if spec.num_nodes > 1:
        ids["ppg"] = f"<{res.PPG} in {group}>"
    vm = vm_body(
        spec,
        offer,
        offer.zones[0] if offer.zones else None,
        0,
        owner=owner,
        ids=ids,
        custom="<customData>",
        public_key="ssh-ed25519 <the cluster's public key>",
    )
    vm["properties"]["osProfile"]["customData"] = (
        "<base64 cloud-init; `cloudtrain bootstrap render --provider azure --gpus "
        f"{spec.resources.gpus}` shows it>"
    )
    requests: list[dict[str, Any]] = [
        {f"PUT resourceGroups/{group}": res.group_body(region, labels)},
        {f"PUT networkSecurityGroups/{res.NSG}": res.nsg_body(region, labels, str(spec.ssh_cidr))},
        {f"PUT virtualNetworks/{res.VNET}": res.vnet_body(region, labels, ids["nsg"])},
    ]
    if spec.num_nodes > 1:
        requests.append({f"PUT proximityPlacementGroups/{res.PPG}": res.ppg_body(region, labels)})
    requests.append({f"PUT virtualMachines/{vm_name(cluster, 0)} (one per node)": vm})
    return tuple(requests)


# -- apply ----------------------------------------------------------------------------


def node_info(
    cluster: str, vm: Mapping[str, Any], nics: Mapping[str, Any], ips: Mapping[str, Any]
) -> NodeInfo:
    """A node from its VM, with its addresses from the group's NICs and public IPs (by id)."""
    props = vm.get("properties") or {}
    private = public = None
    for ref in (props.get("networkProfile") or {}).get("networkInterfaces") or []:
        nic = nics.get(str(ref.get("id", "")).lower()) or {}
        for ipc in (nic.get("properties") or {}).get("ipConfigurations") or []:
            ip_props = ipc.get("properties") or {}
            private = private or ip_props.get("privateIPAddress")
            pip = ips.get(str((ip_props.get("publicIPAddress") or {}).get("id", "")).lower())
            public = public or ((pip or {}).get("properties") or {}).get("ipAddress")
    zones = vm.get("zones") or []
    return NodeInfo(
        cluster=cluster,
        index=index_of(vm),
        node_id=str(vm["name"]),
        private_ip=private,
        public_ip=public,
        state=STATES.get(str(props.get("provisioningState")), "pending"),
        zone=zones[0] if zones else None,
        instance_type=(props.get("hardwareProfile") or {}).get("vmSize"),
        extra=MappingProxyType(
            {
                "resource_group": res.group_of(vm["id"]),
                "id": vm["id"],
                "spot": props.get("priority") == "Spot",
            }
        ),
        root=f"/home/{NODE_USER}/.cloudtrain",
        python=f"/home/{NODE_USER}/.cloudtrain/venv/bin/python",
        user=NODE_USER,
        region=vm.get("location"),
    )
