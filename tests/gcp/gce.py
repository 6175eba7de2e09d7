"""The state and rules of the GCE REST subset the stand-in serves (no HTTP here).

Time advances one **tick per request**: an operation answered ``RUNNING`` by the call that
made it is ``DONE`` (with its effect applied, or its ``error`` set) from the next request on,
so a client that never polls never sees it finish, and one that treats ``RUNNING`` as done is
caught. A new instance is ``PROVISIONING``, then ``STAGING``, then ``RUNNING`` (with its
external address) on successive reads. Rules a real GCE enforces and the stand-in checks too:
names unique per zone, a zone must offer the accelerator type a machine needs, resource
policies must exist in the region and cannot be deleted while an instance uses them, a boot
disk outlives its instance unless ``autoDelete`` is set, the ``filter`` syntax is parsed (an
unknown one is a 400, never silently ignored), a firewall rule has exactly one of ``allowed``
and ``denied`` and keeps its name, network and direction when patched.

The project's ``default`` network comes with its standard rules (``DEFAULT_RULES``, at 65534),
and `verdict` / `admits` evaluate ingress as GCE does, so a test can ask what reaches a node.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

ZONES = {  # zone → accelerator type → most cards per instance
    "us-central1-a": {"nvidia-tesla-v100": 8, "nvidia-tesla-a100": 16, "nvidia-a100-80gb": 8},
    "us-central1-b": {"nvidia-tesla-v100": 8, "nvidia-tesla-a100": 16},
    "us-central1-c": {"nvidia-tesla-v100": 8, "nvidia-tesla-a100": 16, "nvidia-a100-80gb": 8},
    "us-central1-f": {"nvidia-tesla-v100": 8, "nvidia-tesla-a100": 16},
    "europe-west4-a": {"nvidia-tesla-v100": 8, "nvidia-tesla-a100": 16},
}
BUILT_IN_GPUS = {
    "a2-highgpu-": "nvidia-tesla-a100",
    "a2-megagpu-": "nvidia-tesla-a100",
    "a2-ultragpu-": "nvidia-a100-80gb",
}
DEFAULT_RULES = {  # name → (what it allows, from where): the default network's own, at 65534
    "default-allow-icmp": ([{"IPProtocol": "icmp"}], "0.0.0.0/0"),
    "default-allow-internal": (
        [
            {"IPProtocol": "tcp", "ports": ["0-65535"]},
            {"IPProtocol": "udp", "ports": ["0-65535"]},
            {"IPProtocol": "icmp"},
        ],
        "10.128.0.0/9",
    ),
    "default-allow-rdp": ([{"IPProtocol": "tcp", "ports": ["3389"]}], "0.0.0.0/0"),
    "default-allow-ssh": ([{"IPProtocol": "tcp", "ports": ["22"]}], "0.0.0.0/0"),
}
#: The quotas `project_quotas` / `region_quotas` start with (metric → limit; usage 0), in GPUs
#: and vCPUs: plausible for a project that was granted GPUs (a new one has GPUS_ALL_REGIONS 0).
PROJECT_QUOTAS = {"GPUS_ALL_REGIONS": 32.0, "CPUS_ALL_REGIONS": 2400.0}
REGION_QUOTAS = {
    "CPUS": 1200.0,
    "NVIDIA_V100_GPUS": 16.0,
    "NVIDIA_A100_GPUS": 16.0,
    "NVIDIA_A100_80GB_GPUS": 8.0,
    "PREEMPTIBLE_NVIDIA_V100_GPUS": 32.0,
    "PREEMPTIBLE_NVIDIA_A100_GPUS": 16.0,
    "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS": 8.0,
}
IMPLIED_DENY = "implied-deny-ingress"  # GCE's rule at 65535: nothing else matched
PROTOCOLS = {"tcp": "6", "udp": "17", "icmp": "1", "esp": "50", "ah": "51", "sctp": "132"}
_TERM = re.compile(r'\(?\s*(labels\.[a-z0-9_-]+|name|status)\s*(=|!=)\s*"?([^"\s)]*)"?\s*\)?')


class ApiError(Exception):
    """An HTTP error answer: ``{"error": {"code", "message", "errors": [{"reason"}]}}``."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [{"domain": "global", "reason": self.reason, "message": self.message}],
            }
        }


def matches(resource: dict[str, Any], expression: str | None) -> bool:
    """GCE's ``filter``: terms ``labels.K = "V"``, ``name = "N"``, ``status != S``, ANDed."""
    if not expression:
        return True
    rest = _TERM.sub("", expression).replace("AND", "").strip()
    if rest:
        raise ApiError(400, "invalid", f"Invalid value for field 'filter': {expression!r}")
    for key, op, value in _TERM.findall(expression):
        have = (
            resource.get("labels", {}).get(key[7:])
            if key.startswith("labels.")
            else (resource.get(key))
        )
        if (have == value) != (op == "="):
            return False
    return True


@dataclass
class Operation:
    body: dict[str, Any]
    effect: Callable[[], object] | None = None
    error: dict[str, Any] | None = None


@dataclass
class Gce:
    """One project's resources. Every method is called with the stand-in's lock held."""

    project: str
    url: str
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    disks: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[str, dict[str, Any]] = field(default_factory=dict)
    policies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, Operation] = field(default_factory=dict)
    zones: dict[str, dict[str, int]] = field(
        default_factory=lambda: {z: dict(t) for z, t in ZONES.items()}
    )
    default_network: bool = True
    #: metric → [limit, usage] of the project (``projects.get``) and of each region of `zones`
    #: (``regions.get``); static: launches do not count against them
    project_quotas: dict[str, list[float]] = field(
        default_factory=lambda: {m: [v, 0.0] for m, v in PROJECT_QUOTAS.items()}
    )
    region_quotas: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {
            z.rsplit("-", 1)[0]: {m: [v, 0.0] for m, v in REGION_QUOTAS.items()} for z in ZONES
        }
    )
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _pending: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.default_network:
            for name, (allowed, source) in DEFAULT_RULES.items():
                self.add_firewall(
                    {
                        "name": name,
                        "description": "one of the default network's own rules",
                        "network": "global/networks/default",
                        "priority": 65534,
                        "sourceRanges": [source],
                        "allowed": allowed,
                    }
                )

    def link(self, *parts: str) -> str:
        return "/".join([f"{self.url}/compute/v1/projects/{self.project}", *parts])

    # -- time and operations --------------------------------------------------------------

    def tick(self) -> None:
        """One request's worth of time: every pending operation finishes."""
        pending, self._pending = self._pending, []
        for name in pending:
            op = self.operations[name]
            op.body["status"] = "DONE"
            op.body["progress"] = 100
            if op.error is not None:
                op.body.update(op.error)
            elif op.effect is not None:
                op.effect()

    def operation(
        self,
        kind: str,
        target: str,
        scope: tuple[str, str] | None,
        effect: Callable[[], object] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A new RUNNING operation in `scope` (("zones", z), ("regions", r) or None: global)."""
        name = f"operation-{next(self._ids)}"
        where = [*scope] if scope else ["global"]
        body = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "operationType": kind,
            "targetLink": target,
            "status": "RUNNING",
            "progress": 0,
            "selfLink": self.link(*where, "operations", name),
        }
        if scope:
            body[scope[0][:-1]] = self.link(*scope)
        self.operations[name] = Operation(body, effect, error)
        self._pending.append(name)
        return body

    def get_operation(self, name: str) -> dict[str, Any]:
        if name not in self.operations:
            raise ApiError(404, "notFound", f"The resource 'operations/{name}' was not found")
        return self.operations[name].body

    # -- project, regions and their quotas ------------------------------------------------

    def project_body(self) -> dict[str, Any]:
        """``projects.get``: the project with its project-wide quotas."""
        return {
            "kind": "compute#project",
            "id": "4815162342",
            "name": self.project,
            "quotas": _quotas(self.project_quotas),
            "defaultServiceAccount": f"4815162342-compute@{self.project}.iam.gserviceaccount.com",
            "selfLink": self.link(),
        }

    def set_quota(
        self, metric: str, limit: float, usage: float = 0.0, region: str | None = None
    ) -> None:
        """A quota's limit and usage: the project's (`region` None) or a region's. A test
        calls it with the stand-in's lock held (``with gcp.lock: gcp.gce.set_quota(...)``)."""
        held = self.project_quotas if region is None else self.region_quotas.setdefault(region, {})
        held[metric] = [float(limit), float(usage)]

    def region_body(self, region: str) -> dict[str, Any]:
        """``regions.get``: the region, its zones and its quotas; 404 for one it does not know."""
        if region not in self.region_quotas:
            raise ApiError(404, "notFound", f"The resource 'regions/{region}' was not found")
        return {
            "kind": "compute#region",
            "id": str(1000 + sorted(self.region_quotas).index(region)),
            "name": region,
            "status": "UP",
            "zones": [self.link("zones", z) for z in sorted(self.zones) if z.startswith(region)],
            "quotas": _quotas(self.region_quotas[region]),
            "selfLink": self.link("regions", region),
        }

    # -- firewall rules -------------------------------------------------------------------

    def add_firewall(self, body: dict[str, Any]) -> dict[str, Any]:
        """A new rule as GCE stores it: checked, defaults filled in, the network a full link."""
        name = body["name"]
        if name in self.firewalls:
            raise ApiError(
                409, "alreadyExists", f"The resource 'global/firewalls/{name}' already exists"
            )
        rule = {
            "kind": "compute#firewall",
            "id": str(next(self._ids)),
            "direction": "INGRESS",
            "priority": 1000,
            "disabled": False,
            "logConfig": {"enable": False},
            **body,
            "network": self.link("global", "networks", _last(body.get("network", "default"))),
            "selfLink": self.link("global", "firewalls", name),
        }
        check_firewall(rule)
        self.firewalls[name] = rule
        return rule

    def patch_firewall(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of rule `name` (a field left out stays; ``null`` removes it),
        applied when its operation is done."""
        rule = self.firewalls.get(name)
        if rule is None:
            raise ApiError(404, "notFound", f"The resource 'global/firewalls/{name}' was not found")
        for key in ("name", "network", "direction"):
            if key in body and _last(str(body[key])) != _last(str(rule[key])):
                raise ApiError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.{key}': '{body[key]}'. "
                    f"The {key} of a firewall rule cannot be changed.",
                )

        def merged() -> dict[str, Any]:
            fields = {**self.firewalls[name], **body, "network": rule["network"]}
            return {key: value for key, value in fields.items() if value is not None}

        check_firewall(merged())

        def patched() -> None:
            if name in self.firewalls:
                self.firewalls[name] = merged()

        return self.operation("patch", rule["selfLink"], None, patched)

    # -- instances ------------------------------------------------------------------------

    def check_shape(self, zone: str, props: dict[str, Any]) -> None:
        """Refuse what the zone cannot give, as GCE does (a 400 naming the field)."""
        if zone not in self.zones:
            raise ApiError(404, "notFound", f"The resource 'zones/{zone}' was not found")
        machine = str(props.get("machineType", "")).rsplit("/", 1)[-1]
        wanted = [
            (str(a["acceleratorType"]).rsplit("/", 1)[-1], int(a["acceleratorCount"]))
            for a in props.get("guestAccelerators", [])
        ]
        wanted += [(t, 1) for prefix, t in BUILT_IN_GPUS.items() if machine.startswith(prefix)]
        for kind, count in wanted:
            if self.zones[zone].get(kind, 0) < count:
                raise ApiError(
                    400,
                    "invalid",
                    "Invalid value for field 'resource.guest"
                    f"Accelerators[0].acceleratorType': '{kind}' in {zone}",
                )
        region = zone.rsplit("-", 1)[0]
        for policy in props.get("resourcePolicies", []):
            if (region, str(policy).rsplit("/", 1)[-1]) not in self.policies:
                raise ApiError(400, "invalid", f"The resource policy '{policy}' was not found")

    def create_instance(self, zone: str, name: str, props: dict[str, Any]) -> None:
        number = len(self.instances) + 2
        disks = []
        for i, disk in enumerate(props.get("disks", [])):
            disk_name = name if i == 0 else f"{name}-{i}"
            params = disk.get("initializeParams", {})
            self.disks[(zone, disk_name)] = {
                "name": disk_name,
                "labels": params.get("labels", {}),
                "sizeGb": params.get("diskSizeGb"),
                "users": [name],
            }
            disks.append({**disk, "source": self.link("zones", zone, "disks", disk_name)})
        nics = [
            {
                **nic,
                "name": f"nic{i}",
                "networkIP": f"10.128.{number // 250}.{number % 250}",
                "accessConfigs": [dict(a) for a in nic.get("accessConfigs", [])],
            }
            for i, nic in enumerate(props.get("networkInterfaces", []))
        ]
        machine = str(props.get("machineType", "")).rsplit("/", 1)[-1]
        self.instances[(zone, name)] = {
            **props,
            "kind": "compute#instance",
            "id": str(next(self._ids)),
            "name": name,
            "zone": self.link("zones", zone),
            "status": "PROVISIONING",
            "disks": disks,
            "networkInterfaces": nics,
            "selfLink": self.link("zones", zone, "instances", name),
            "machineType": self.link("zones", zone, "machineTypes", machine),
            "guestAccelerators": [
                {
                    **a,
                    "acceleratorType": self.link(
                        "zones",
                        zone,
                        "acceleratorTypes",
                        str(a["acceleratorType"]).rsplit("/", 1)[-1],
                    ),
                }
                for a in props.get("guestAccelerators", [])
            ],
        }

    def read(self, inst: dict[str, Any]) -> dict[str, Any]:
        """An instance as a read shows it; each read moves a new one a step towards RUNNING."""
        step = {"PROVISIONING": "STAGING", "STAGING": "RUNNING"}
        if inst["status"] in step:
            inst["status"] = step[inst["status"]]
            if inst["status"] == "RUNNING":
                for nic in inst["networkInterfaces"]:
                    for access in nic["accessConfigs"]:
                        access["natIP"] = (
                            f"34.0.{int(inst['id']) // 250 % 250}.{int(inst['id']) % 250}"
                        )
        return inst

    def delete_instance(self, zone: str, name: str) -> dict[str, Any]:
        inst = self.instances.get((zone, name))
        if inst is None:
            raise ApiError(
                404,
                "notFound",
                f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' "
                "was not found",
            )
        inst["status"] = "STOPPING"

        def gone() -> None:
            if self.instances.pop((zone, name), None) is None:
                return
            for disk in inst["disks"]:
                key = (zone, str(disk["source"]).rsplit("/", 1)[-1])
                if disk.get("autoDelete"):
                    self.disks.pop(key, None)
                elif key in self.disks:
                    self.disks[key]["users"] = []

        return self.operation("delete", inst["selfLink"], ("zones", zone), gone)

    def delete_policy(self, region: str, name: str) -> dict[str, Any]:
        if (region, name) not in self.policies:
            raise ApiError(404, "notFound", f"The resource 'resourcePolicies/{name}' was not found")
        users = [
            i["name"]
            for (z, _), i in self.instances.items()
            if z.startswith(region)
            and name in [str(p).rsplit("/", 1)[-1] for p in i.get("resourcePolicies", [])]
        ]
        if users:
            raise ApiError(
                400,
                "resourceInUseByAnotherResource",
                f"The resource_policy resource '{name}' is already being used by '{users[0]}'",
            )
        link = self.link("regions", region, "resourcePolicies", name)
        return self.operation(
            "delete",
            link,
            ("regions", region),
            lambda: self.policies.pop((region, name), None) and None,
        )


def _quotas(held: dict[str, list[float]]) -> list[dict[str, Any]]:
    return [{"metric": m, "limit": lim, "usage": use} for m, (lim, use) in sorted(held.items())]


def _last(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


def check_firewall(rule: dict[str, Any]) -> None:
    """GCE's checks of a rule's shape: a 400 naming the field."""
    if bool(rule.get("allowed")) == bool(rule.get("denied")):
        raise ApiError(
            400,
            "invalid",
            "Invalid value for field 'resource': exactly one of 'allowed' and 'denied' must be set",
        )
    if not 0 <= int(rule.get("priority", 1000)) <= 65535:
        raise ApiError(
            400, "invalid", f"Invalid value for field 'resource.priority': '{rule['priority']}'"
        )
    if rule.get("direction", "INGRESS") not in ("INGRESS", "EGRESS"):
        raise ApiError(
            400, "invalid", f"Invalid value for field 'resource.direction': '{rule['direction']}'"
        )
    for cidr in rule.get("sourceRanges", []):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ApiError(
                400, "invalid", f"Invalid value for field 'resource.sourceRanges': '{cidr}'"
            ) from None


def verdict(
    gce: Gce,
    network: str,
    target_tags: Collection[str],
    source_ip: str,
    protocol: str,
    port: int | None = None,
    source_tags: Collection[str] = (),
) -> tuple[bool, str]:
    """Whether GCE admits a packet to an instance on `network` with `target_tags`, and the
    name of the rule that decided (`IMPLIED_DENY` when none matched).

    GCE's evaluation: the network's enabled ingress rules whose ``targetTags`` include one of
    the instance's tags (or that have none), whose sources match (``sourceRanges`` contain
    `source_ip`, or ``sourceTags`` include one of `source_tags`, the tags of the sending
    instance on the same network; a rule with neither matches any source) and whose protocols
    match; the lowest priority number decides, at equal priority a deny before an allow.
    Service-account targets and sources are not modelled (such a rule never applies)."""
    matching = [
        rule
        for rule in gce.firewalls.values()
        if _applies(rule, network, set(target_tags), set(source_tags))
        and _from(rule, source_ip, set(source_tags))
        and _carries(rule.get("allowed") or rule.get("denied") or [], protocol, port)
    ]
    if not matching:
        return False, IMPLIED_DENY
    first = min(matching, key=lambda r: (int(r.get("priority", 1000)), not r.get("denied")))
    return not first.get("denied"), str(first["name"])


def admits(
    gce: Gce,
    network: str,
    target_tags: Collection[str],
    source_ip: str,
    protocol: str,
    port: int | None = None,
    source_tags: Collection[str] = (),
) -> bool:
    """`verdict`'s answer alone."""
    return verdict(gce, network, target_tags, source_ip, protocol, port, source_tags)[0]


def _applies(rule: dict[str, Any], network: str, tags: set[str], sources: set[str]) -> bool:
    targets = set(rule.get("targetTags", []))
    return (
        not rule.get("disabled")
        and rule.get("direction", "INGRESS") == "INGRESS"
        and _last(str(rule.get("network", ""))) == network
        and not rule.get("targetServiceAccounts")
        and (not targets or bool(targets & tags))
    )


def _from(rule: dict[str, Any], source_ip: str, source_tags: set[str]) -> bool:
    ranges, tags = rule.get("sourceRanges", []), set(rule.get("sourceTags", []))
    if not ranges and not tags:
        return not rule.get("sourceServiceAccounts")
    address = ipaddress.ip_address(source_ip)
    in_range = any(address in ipaddress.ip_network(r, strict=False) for r in ranges)
    return in_range or bool(tags & source_tags)


def _carries(entries: list[dict[str, Any]], protocol: str, port: int | None) -> bool:
    for entry in entries:
        name = str(entry["IPProtocol"]).lower()
        if name != "all" and name not in (protocol, PROTOCOLS.get(protocol)):
            continue
        ports = [str(p).partition("-") for p in entry.get("ports", [])]
        if not ports or (
            port is not None and any(int(lo) <= port <= int(hi or lo) for lo, _, hi in ports)
        ):
            return True
    return False
