"""The state of the ARM stand-in: resources by id, long-running operations, SKUs and faults.

Pure (no HTTP): `standin.py` serves it. Ids are matched case-insensitively, as ARM does, and
kept as first written. What it models, because the provider relies on it:

- **resource groups** own everything under their id; deleting one deletes all of it;
- **VMs** make their NIC and public IP from ``networkInterfaceConfigurations`` (the
  ``networkApiVersion`` form) and an OS disk; deleting a VM deletes each of them only when its
  ``deleteOption`` is ``Delete`` (ARM's default, ``Detach``, leaves them);
- a VM whose **allocation fails** is kept with ``provisioningState: Failed`` (its NIC and IP
  too) until it is deleted; the error arrives in the ``Azure-AsyncOperation`` status;
- a size the region (or zone) does not offer, by ``skus``/``restrict``, is a 409
  ``SkuNotAvailable``, as ARM answers it;
- each location's **compute usages** (vCPU quotas by family, `USAGES`), set by `set_usage`.
"""

from __future__ import annotations

import base64
import ipaddress
import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SIZES = (
    "Standard_ND40rs_v2",
    "Standard_ND96asr_v4",
    "Standard_NC24ads_A100_v4",
    "Standard_NC48ads_A100_v4",
    "Standard_NC96ads_A100_v4",
    "Standard_ND96amsr_A100_v4",
)
#: Compute usages every location starts with: usage name → (localized name, limit), current
#: usage 0, in vCPUs. Plausible for a subscription granted GPU quota (a new one has 0 in the
#: GPU families); static: VMs made do not count against them. `Store.set_usage` changes one.
USAGES = {
    "cores": ("Total Regional vCPUs", 350),
    "lowPriorityCores": ("Total Regional Low-priority vCPUs", 100),
    "standardNDSv2Family": ("Standard NDSv2 Family vCPUs", 40),
    "standardNDASv4_A100Family": ("Standard NDASv4_A100 Family vCPUs", 96),
    "StandardNCADSA100v4Family": ("Standard NCADS_A100_v4 Family vCPUs", 96),
    "standardNDAMSv4_A100Family": ("Standard NDAMSv4_A100 Family vCPUs", 96),
    "standardNCSv3Family": ("Standard NCSv3 Family vCPUs", 0),
}
#: Codes that arrive in the finished operation (the PUT itself was accepted).
ASYNC_CODES = frozenset(
    {"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest"}
)
#: Resource types whose PUT/DELETE are long-running operations in ARM.
LRO_TYPES = frozenset(
    {
        "virtualmachines",
        "virtualnetworks",
        "networksecuritygroups",
        "networkinterfaces",
        "publicipaddresses",
    }
)
CUSTOM_DATA_MAX = 87380  # base64 characters: 64 KiB before encoding


class ArmError(Exception):
    """An ARM error document: ``{"error": {"code", "message"}}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass
class Fault:
    """An injected error: `code` for requests matching every given field, `times` times."""

    code: str
    message: str
    status: int = 409
    method: str | None = "PUT"
    kind: str | None = "virtualmachines"
    region: str | None = None
    zone: str | None = None
    times: int | None = None

    def matches(self, method: str, kind: str, region: str | None, zone: str | None) -> bool:
        return (
            (self.method is None or self.method == method)
            and (self.kind == kind.lower() if self.kind is not None else True)
            and (self.kind is not None or kind == "*")
            and (self.region is None or self.region == region)
            and (self.zone is None or self.zone == zone)
            and (self.times is None or self.times > 0)
        )


@dataclass
class Operation:
    """A long-running operation: finishes on its second poll with `error` or success."""

    id: str
    resource_id: str
    error: tuple[str, str] | None = None
    polls: int = 0

    @property
    def done(self) -> bool:
        return self.polls >= 2


@dataclass
class Store:
    subscription: str
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, Operation] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    #: location -> size -> zones the subscription may use (None: the location is restricted;
    #: a size missing: not offered there)
    skus: dict[str, dict[str, list[str] | None]] = field(default_factory=dict)
    addresses: Iterator[int] = field(default_factory=lambda: itertools.count(4))
    #: sizes without accelerated networking (ARM refuses to enable it on them)
    no_accelerated_networking: set[str] = field(default_factory=set)
    #: location → usage name → [current, limit], for what `set_usage` changed (else `USAGES`)
    usages: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    #: a fault mode: VMs are made without the managed identity they ask for, and answered with
    #: no ``identity`` (an older API version, or a policy that strips it)
    omit_identity: bool = False

    # -- compute usages -----------------------------------------------------------------

    def set_usage(self, location: str, name: str, limit: int, current: int = 0) -> None:
        """One usage of `location` (a name of `USAGES`); with the stand-in's lock held."""
        if name not in USAGES:
            raise ValueError(f"the stand-in serves the usages {sorted(USAGES)} only")
        self.usage(location)[name] = [current, limit]

    def usage(self, location: str) -> dict[str, list[int]]:
        """`location`'s usages, the defaults until `set_usage` changes one."""
        return self.usages.setdefault(
            location.lower(), {n: [0, limit] for n, (_, limit) in USAGES.items()}
        )

    def usage_list(self, location: str) -> list[dict[str, Any]]:
        """``usage.list(location)`` as ARM writes it."""
        return [
            {
                "unit": "Count",
                "currentValue": current,
                "limit": limit,
                "name": {"value": name, "localizedValue": USAGES[name][0]},
            }
            for name, (current, limit) in self.usage(location).items()
        ]

    # -- resources ----------------------------------------------------------------------

    def get(self, rid: str) -> dict[str, Any] | None:
        return self.resources.get(rid.lower())

    def put(self, rid: str, resource: dict[str, Any]) -> dict[str, Any]:
        resource["id"] = rid
        self.resources[rid.lower()] = resource
        return resource

    def child(self, rid: str) -> dict[str, Any] | None:
        """A resource, or a child kept inside its parent (a VNet's subnet)."""
        found = self.get(rid)
        if found is not None or "/subnets/" not in rid.lower():
            return found
        parent = self.get(rid[: rid.lower().rindex("/subnets/")]) or {}
        subnets = (parent.get("properties") or {}).get("subnets") or []
        return next((s for s in subnets if s["id"].lower() == rid.lower()), None)

    def delete(self, rid: str) -> dict[str, Any] | None:
        return self.resources.pop(rid.lower(), None)

    def under(self, prefix: str) -> list[dict[str, Any]]:
        """Resources whose id starts with `prefix` + '/', in creation order."""
        start = prefix.lower().rstrip("/") + "/"
        return [r for key, r in self.resources.items() if key.startswith(start)]

    def of_type(self, rtype: str, prefix: str = "") -> list[dict[str, Any]]:
        found = self.under(prefix) if prefix else list(self.resources.values())
        return [r for r in found if str(r.get("type", "")).lower() == rtype.lower()]

    def fault(self, method: str, kind: str, region: str | None, zone: str | None) -> Fault | None:
        for rule in self.faults:
            if rule.matches(method, kind, region, zone):
                if rule.times is not None:
                    rule.times -= 1
                return rule
        return None

    # -- operations ---------------------------------------------------------------------

    def start(self, resource_id: str, error: tuple[str, str] | None = None) -> Operation:
        op = Operation(uuid.uuid4().hex, resource_id, error)
        self.operations[op.id] = op
        return op

    def poll(self, op_id: str) -> dict[str, Any]:
        op = self.operations.get(op_id)
        if op is None:
            raise ArmError(404, "NotFound", f"operation {op_id} not found")
        op.polls += 1
        if op.done:
            self.finish(op)
        if not op.done:
            return {"name": op.id, "status": "InProgress"}
        if op.error:
            code, message = op.error
            return {"name": op.id, "status": "Failed", "error": {"code": code, "message": message}}
        return {"name": op.id, "status": "Succeeded"}

    def finish(self, op: Operation) -> None:
        """Settle the resource the operation made: Succeeded, or Failed (kept, as ARM does)."""
        op.polls = max(op.polls, 2)
        resource = self.get(op.resource_id)
        if resource is not None and resource["properties"]["provisioningState"] == "Creating":
            state = "Failed" if op.error else "Succeeded"
            resource["properties"]["provisioningState"] = state
            if not op.error and resource["type"] == "Microsoft.Compute/virtualMachines":
                self._os_disk(resource)

    def settle(self, rid: str) -> None:
        """A read of a resource sees the end of its operation (nobody may poll it: a crash)."""
        for op in list(self.operations.values()):
            if op.resource_id.lower() == rid.lower() and not op.done:
                self.finish(op)

    # -- virtual machines ---------------------------------------------------------------

    def create_vm(self, rid: str, body: dict[str, Any], group: str) -> Operation:
        """Validate a VM PUT the way ARM does, make its NIC, IP and disk; the operation
        finishes with the injected async fault, if any."""
        props = body.get("properties") or {}
        location = str(body.get("location", "")).lower()
        zones = body.get("zones") or []
        zone = zones[0] if zones else None
        size = str((props.get("hardwareProfile") or {}).get("vmSize", ""))
        offered = self.skus.get(location, {})
        zones_ok = offered.get(size)
        if zones_ok is None or (zone is not None and zone not in zones_ok):
            where = f"zone '{zone}' of " if zone else ""
            raise ArmError(
                409,
                "SkuNotAvailable",
                f"The requested VM size {size} is currently "
                f"not available in {where}location '{location}'.",
            )
        self._check_vm(props)
        for config in props["networkProfile"]["networkInterfaceConfigurations"]:
            accelerated = config["properties"].get("enableAcceleratedNetworking")
            if accelerated and size in self.no_accelerated_networking:
                raise ArmError(
                    400,
                    "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
                    f"VM size {size} is not compatible with accelerated networking",
                )
        rule = self.fault("PUT", "virtualMachines", location, zone)
        if rule is not None and rule.code not in ASYNC_CODES:
            raise ArmError(rule.status, rule.code, rule.message)
        nics = [
            self._nic(group, body, config)
            for config in props["networkProfile"]["networkInterfaceConfigurations"]
        ]
        props["networkProfile"]["networkInterfaces"] = nics
        props["provisioningState"] = "Creating"
        props["vmId"] = str(uuid.uuid4())
        name = rid.rsplit("/", 1)[1]
        self.put(rid, {**body, "name": name, "type": "Microsoft.Compute/virtualMachines"})
        error = (rule.code, rule.message) if rule is not None else None
        return self.start(rid, error)

    def _check_vm(self, props: dict[str, Any]) -> None:
        os_profile = props.get("osProfile") or {}
        linux = os_profile.get("linuxConfiguration") or {}
        if not os_profile.get("adminUsername"):
            raise ArmError(400, "InvalidParameter", "osProfile.adminUsername is required")
        if not os_profile.get("adminPassword") and not linux.get("disablePasswordAuthentication"):
            raise ArmError(
                400,
                "InvalidParameter",
                "adminPassword is required unless disablePasswordAuthentication is true",
            )
        if not (linux.get("ssh") or {}).get("publicKeys"):
            raise ArmError(400, "InvalidParameter", "no SSH public key")
        custom = str(os_profile.get("customData", ""))
        if len(custom) > CUSTOM_DATA_MAX:
            raise ArmError(400, "InvalidParameter", "customData is too long")
        base64.b64decode(custom, validate=True)
        network = props.get("networkProfile") or {}
        if not network.get("networkApiVersion") or not network.get(
            "networkInterfaceConfigurations"
        ):
            raise ArmError(
                400, "InvalidParameter", "networkInterfaceConfigurations need networkApiVersion"
            )
        for ref in (
            (props.get("proximityPlacementGroup") or {}).get("id"),
            *(
                ip["properties"]["subnet"]["id"]
                for c in network["networkInterfaceConfigurations"]
                for ip in c["properties"]["ipConfigurations"]
            ),
        ):
            if ref and self.child(ref) is None:
                raise ArmError(400, "InvalidResourceReference", f"{ref} not found")

    def _nic(self, group: str, vm: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The NIC (and public IP) a VM makes from one of its interface configurations."""
        base = f"{group}/providers/Microsoft.Network"
        cprops = config["properties"]
        ip_configs = []
        for ipc in cprops["ipConfigurations"]:
            ip_props: dict[str, Any] = {
                "privateIPAddress": self._private(ipc["properties"]["subnet"]["id"]),
                "subnet": ipc["properties"]["subnet"],
            }
            pub = ipc["properties"].get("publicIPAddressConfiguration")
            if pub:
                address = next(self.addresses)
                pip = self.put(
                    f"{base}/publicIPAddresses/{pub['name']}",
                    {
                        "name": pub["name"],
                        "type": "Microsoft.Network/publicIPAddresses",
                        "location": vm["location"],
                        "sku": pub.get("sku"),
                        "tags": vm.get("tags"),
                        "properties": {
                            "ipAddress": f"198.18.{address // 250}.{address % 250 + 1}",
                            "publicIPAllocationMethod": pub["properties"].get(
                                "publicIPAllocationMethod", "Dynamic"
                            ),
                            "deleteOption": pub["properties"].get("deleteOption", "Detach"),
                            "provisioningState": "Succeeded",
                        },
                    },
                )
                ip_props["publicIPAddress"] = {"id": pip["id"]}
            ip_configs.append({"name": ipc["name"], "properties": ip_props})
        nic = self.put(
            f"{base}/networkInterfaces/{config['name']}",
            {
                "name": config["name"],
                "type": "Microsoft.Network/networkInterfaces",
                "location": vm["location"],
                "tags": vm.get("tags"),
                "properties": {
                    "ipConfigurations": ip_configs,
                    "enableAcceleratedNetworking": bool(cprops.get("enableAcceleratedNetworking")),
                    "networkSecurityGroup": cprops.get("networkSecurityGroup"),
                    "provisioningState": "Succeeded",
                },
            },
        )
        return {
            "id": nic["id"],
            "properties": {
                "primary": bool(cprops.get("primary")),
                "deleteOption": cprops.get("deleteOption", "Detach"),
            },
        }

    def _private(self, subnet_id: str) -> str:
        """The subnet's next free address (Azure keeps the first four)."""
        taken = {
            ipc["properties"]["privateIPAddress"]
            for nic in self.of_type("Microsoft.Network/networkInterfaces")
            for ipc in nic["properties"]["ipConfigurations"]
        }
        subnet = self.child(subnet_id) or {}
        network = ipaddress.ip_network(
            subnet.get("properties", {}).get("addressPrefix", "10.0.0.0/24")
        )
        hosts = itertools.islice(network.hosts(), 3, None)
        return next(str(a) for a in hosts if str(a) not in taken)

    def _os_disk(self, vm: dict[str, Any]) -> None:
        disk = vm["properties"]["storageProfile"]["osDisk"]
        name = disk.get("name") or f"{vm['name']}_OsDisk_1"
        group = vm["id"].split("/providers/")[0]
        made = self.put(
            f"{group}/providers/Microsoft.Compute/disks/{name}",
            {
                "name": name,
                "type": "Microsoft.Compute/disks",
                "location": vm["location"],
                "properties": {
                    "diskSizeGB": disk.get("diskSizeGB"),
                    "provisioningState": "Succeeded",
                },
            },
        )
        disk["managedDisk"] = {**(disk.get("managedDisk") or {}), "id": made["id"]}

    def delete_vm(self, rid: str) -> None:
        """Delete a VM and, where their deleteOption says Delete, its NICs, IPs and disk."""
        vm = self.delete(rid)
        if vm is None:
            return
        props = vm["properties"]
        disk = props["storageProfile"]["osDisk"]
        if disk.get("deleteOption") == "Delete" and (disk.get("managedDisk") or {}).get("id"):
            self.delete(disk["managedDisk"]["id"])
        for ref in props["networkProfile"].get("networkInterfaces", []):
            if ref["properties"].get("deleteOption") != "Delete":
                continue
            nic = self.delete(ref["id"])
            for ipc in (nic or {}).get("properties", {}).get("ipConfigurations", []):
                pip = self.get((ipc["properties"].get("publicIPAddress") or {}).get("id", "-"))
                if pip is not None and pip["properties"].get("deleteOption") == "Delete":
                    self.delete(pip["id"])
