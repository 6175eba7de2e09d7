"""The bulkInsert request of one attempt, and a node read back from its instance.

One ``instances.bulkInsert`` makes all N nodes or none (``count = minCount = N``: GCE deletes
what it made when it cannot make them all). bulkInsert gives every instance the same labels, so
a node's index lives in its **name** (``cloudtrain-<cluster>-<index>``, sent as the keys of
``perInstanceProperties``: a resume fills exactly the missing indices, which ``namePattern``
cannot). Requests are built as the API's JSON, so the dry run prints what is sent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError
from cloudtrain.model import NodeInfo, Offer
from cloudtrain.node import notices
from cloudtrain.providers.gcp import _resources as res
from cloudtrain.providers.gcp._client import last
from cloudtrain.spec import ClusterSpec

if TYPE_CHECKING:
    from google.cloud import compute_v1

#: cloudtrain's GPU name → the GCE accelerator type a zone must offer for it.
ACCELERATOR_TYPES = {
    "V100": "nvidia-tesla-v100",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
}
#: Ubuntu 24.04 (cloud-init reads the user-data; its Python 3.12 installs cloudtrain). The
#: bootstrap installs the NVIDIA driver the GPU needs.
DEFAULT_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
MAX_RUN_S = 120 * 24 * 3600  # GCE's maxRunDuration: 30 s to 120 days
STATES = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopping",
    "SUSPENDING": "stopping",
    "REPAIRING": "pending",
    "SUSPENDED": "stopped",
    "TERMINATED": "stopped",
}


@dataclass(frozen=True)
class Shape:
    """A catalog instance type as GCE takes it: the machine type, and the GPUs attached to
    it (N1 + V100) or none (A2: the GPUs come with the machine type)."""

    machine_type: str
    attached: tuple[tuple[str, int], ...]
    accelerator_type: str

    @classmethod
    def of(cls, offer: Offer) -> Shape:
        machine, _, gpus = offer.instance_type.partition("+")
        accelerator = ACCELERATOR_TYPES.get(offer.accelerator or "")
        if accelerator is None:
            raise ConfigError(
                f"gpus {offer.accelerator!r}: the gcp provider knows {', '.join(ACCELERATOR_TYPES)}"
            )
        attached: tuple[tuple[str, int], ...] = ()
        if gpus:
            count, sep, kind = gpus.partition("x")
            if not (sep and count.isdigit() and kind):
                raise ConfigError(
                    f"catalog instance_type {offer.instance_type!r}: write "
                    "MACHINE+COUNTxACCELERATOR, e.g. n1-highmem-8+1xnvidia-tesla-v100"
                )
            attached = ((kind, int(count)),)
        return cls(machine, attached, accelerator)


#: A GCE metadata value holds 256 KiB.
METADATA_LIMIT = 256 * 1024


def user_data(shape: bootstrap.NodeShape, keys: bootstrap.NodeKeys) -> dict[str, bytes]:
    """What a GCE node boots with, by metadata key: the cloud-config, and the same bootstrap
    as a startup script for images without cloud-init."""
    return {
        "user-data": bootstrap.fit(bootstrap.cloud_config(shape, keys), METADATA_LIMIT,
                                   "GCE metadata"),
        "startup-script": bootstrap.fit(bootstrap.startup_script(shape, keys), METADATA_LIMIT,
                                        "GCE metadata"),
    }  # fmt: skip


def fast_network(spec: ClusterSpec, offer: Offer) -> bool:
    """gVNIC and compact placement: multi-node A2 (A100) clusters, whose all-reduce crosses
    hosts."""
    return spec.num_nodes > 1 and offer.instance_type.startswith("a2-")


def max_run_seconds(value: object) -> int | None:
    """``max_hours`` (option or ``--max-hours``) as whole seconds, validated."""
    if value is None:
        return None
    try:
        hours = float(str(value))
    except ValueError:
        hours = -1.0
    if not math.isfinite(hours):  # inf and nan: no whole number of seconds
        hours = -1.0
    seconds = int(hours * 3600)
    if not 30 <= seconds <= MAX_RUN_S:
        raise ConfigError(
            f"max_hours {value!r}: give hours between 0.01 and {MAX_RUN_S // 3600} "
            "(GCE's maxRunDuration is 30 s to 120 days)"
        )
    return seconds


def bulk_insert_body(
    spec: ClusterSpec,
    offer: Offer,
    indices: Sequence[int],
    *,
    owner: str,
    keys: bootstrap.NodeKeys,
    image: str,
    network: str,
    max_run_s: int | None,
    policy: str | None,
) -> dict[str, Any]:
    """The exact ``BulkInsertInstanceResource`` JSON for `indices`."""
    shape = Shape.of(offer)
    labels = res.labels(spec.name, owner, spec.cluster_id)
    boot = user_data(
        bootstrap.NodeShape.of(offer, notices.GCE_METADATA, spec.limits),
        keys,
    )
    metadata = {
        "enable-oslogin": "FALSE",
        "block-project-ssh-keys": "TRUE",
        "ssh-keys": f"{bootstrap.NODE_USER}:{keys.user_public}",
        **{k: v.decode() for k, v in boot.items()},
    }
    scheduling: dict[str, Any] = {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": not offer.spot,
    }
    if offer.spot:
        scheduling.update(provisioningModel="SPOT", instanceTerminationAction="DELETE")
    if max_run_s is not None:
        scheduling.update(maxRunDuration={"seconds": max_run_s}, instanceTerminationAction="DELETE")
    nic: dict[str, Any] = {
        "network": f"global/networks/{network}",
        "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
    }
    if fast_network(spec, offer):
        nic["nicType"] = "GVNIC"
    props: dict[str, Any] = {
        "machineType": shape.machine_type,
        "labels": labels,
        "tags": {"items": [res.resource_name(spec.name)]},
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "type": "PERSISTENT",
                "initializeParams": {
                    "sourceImage": image,
                    "diskSizeGb": str(spec.resources.disk_gb),
                    "diskType": "pd-balanced",
                    "labels": labels,
                },
            }
        ],
        "networkInterfaces": [nic],
        "metadata": {"items": [{"key": k, "value": v} for k, v in metadata.items()]},
        "scheduling": scheduling,
    }
    if shape.attached:
        props["guestAccelerators"] = [
            {"acceleratorType": kind, "acceleratorCount": count} for kind, count in shape.attached
        ]
    if policy:
        props["resourcePolicies"] = [policy]
    return {
        "count": len(indices),
        "minCount": len(indices),
        "perInstanceProperties": {res.instance_name(spec.name, i): {} for i in indices},
        "instanceProperties": props,
    }


def dry_run(
    spec: ClusterSpec, offer: Offer, *, owner: str, network: str, max_run_s: int | None
) -> list[dict[str, Any]]:
    """The requests the first attempt sends, in order, for ``--dry-run`` (keys are
    placeholders; the user-data is elided: `cloudtrain bootstrap render` shows it)."""
    fast = fast_network(spec, offer)
    requests: list[dict[str, Any]] = [
        {"firewalls.insert": body}
        for body in res.firewall_bodies(
            spec.name, owner, str(spec.ssh_cidr), network, spec.cluster_id
        )
    ]
    if fast:
        policy = {"region": offer.region, **res.policy_body(spec.name, owner, spec.cluster_id)}
        requests.append({"resourcePolicies.insert": policy})
    body = bulk_insert_body(
        spec,
        offer,
        range(spec.num_nodes),
        owner=owner,
        keys=bootstrap.NodeKeys.placeholders(),
        image=str(offer.extra["image"]),
        network=network,
        max_run_s=max_run_s,
        policy=res.resource_name(spec.name) if fast else None,
    )
    for item in body["instanceProperties"]["metadata"]["items"]:
        if item["key"] in ("user-data", "startup-script"):
            item["value"] = (
                f"<{len(item['value'])} bytes; `cloudtrain bootstrap render --provider gcp "
                f"--gpus {spec.resources.gpus}` shows it>"
            )
    requests.append({"instances.bulkInsert": {"zone": offer.zones[0], **body}})
    return requests


def node_info(cluster: str, inst: compute_v1.Instance) -> NodeInfo | None:
    """The node of `inst`; None when its name is not one of the cluster's."""
    index = res.index_of(cluster, inst.name)
    if index is None:
        return None
    nic = inst.network_interfaces[0] if inst.network_interfaces else None
    nat = nic.access_configs[0].nat_i_p if nic and nic.access_configs else ""
    zone = last(inst.zone)
    gpus = ",".join(
        f"{last(a.accelerator_type)}:{a.accelerator_count}" for a in inst.guest_accelerators
    )
    return NodeInfo(
        cluster=cluster,
        index=index,
        node_id=str(inst.id or inst.name),
        private_ip=(nic.network_i_p if nic else "") or None,
        public_ip=nat or None,
        state=STATES.get(inst.status, "pending"),
        zone=zone,
        instance_type=last(inst.machine_type),
        root=bootstrap.NODE_ROOT,
        python=f"{bootstrap.NODE_ROOT}/venv/bin/python",
        user=bootstrap.NODE_USER,
        region=zone.rsplit("-", 1)[0],
        extra=MappingProxyType(
            {
                "name": inst.name,
                "spot": inst.scheduling.provisioning_model == "SPOT",
                **({"guest_accelerators": gpus} if gpus else {}),
            }
        ),
    )
