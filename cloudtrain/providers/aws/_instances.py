"""The RunInstances request of one attempt, and the batch tag that numbers its nodes.

One request makes all N nodes or none (``MinCount = MaxCount``). A node's index comes from the
batch tag ``cloudtrain:nodes`` (the indices one call made, e.g. ``0-3``) and its
``AmiLaunchIndex``: one tag for the whole batch keeps creation O(1) calls in N.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from cloudtrain.boot import bootstrap
from cloudtrain.model import Offer
from cloudtrain.node import notices
from cloudtrain.providers.aws import _resources as res
from cloudtrain.spec import ClusterSpec

TAG_NODES = "cloudtrain:nodes"


#: EC2 takes 16 KiB of raw ``UserData``.
USER_DATA_LIMIT = 16384


def user_data(shape: bootstrap.NodeShape, keys: bootstrap.NodeKeys) -> dict[str, bytes]:
    """What an EC2 node boots with, by request field: the cloud-config, gzipped when long."""
    doc = bootstrap.cloud_config(shape, keys)
    return {"UserData": bootstrap.fit(doc, USER_DATA_LIMIT, "EC2 UserData")}


def boot_data(spec: ClusterSpec, offer: Offer, keys: bootstrap.NodeKeys) -> bytes:
    """The ``UserData`` of `offer`'s nodes (the same for every zone and index). A node of a
    cluster with a lifetime or budget powers itself off a little after it ends even when no
    process of cloudtrain is left on it (``shutdown -h +N``; its
    ``InstanceInitiatedShutdownBehavior`` terminates it)."""
    shape = dataclasses.replace(bootstrap.NodeShape.of(offer, notices.IMDSV2, spec.limits),
                                backstop_min=bootstrap.backstop_minutes(spec.limits))  # fmt: skip
    return user_data(shape, keys)["UserData"]


def compact(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0-2,5,7-8"``."""
    parts: list[str] = []
    ordered = sorted(indices)
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def expand(text: str) -> list[int]:
    """The inverse of `compact`."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def run_request(
    spec: ClusterSpec,
    offer: Offer,
    zone: str,
    indices: Sequence[int],
    *,
    scope: res.Scope,
    sg: str,
    subnet: str,
    token: str,
    placement_group: str | None,
    keys: bootstrap.NodeKeys,
    boot: bytes | None = None,
) -> dict[str, Any]:
    """The exact RunInstances request for `indices` in `zone` (the dry run prints it);
    `boot`: its ``UserData`` when already rendered (`boot_data`)."""
    itype = offer.instance_type
    batch = {TAG_NODES: compact(indices)}
    request: dict[str, Any] = {
        "ImageId": offer.extra["image"],
        "InstanceType": itype,
        "MinCount": len(indices),
        "MaxCount": len(indices),
        "ClientToken": token,
        "KeyName": scope.key_name,
        "UserData": boot if boot is not None else boot_data(spec, offer, keys),
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [
            {
                "DeviceName": offer.extra["root_device"],
                "Ebs": {
                    "VolumeSize": spec.resources.disk_gb,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "InstanceInitiatedShutdownBehavior": "terminate",
        "Placement": {"AvailabilityZone": zone},
        "TagSpecifications": [
            scope.tag_spec("instance", **batch),
            scope.tag_spec("volume"),
        ],
    }
    efa = res.EFA_INTERFACES.get(itype, 0) if spec.num_nodes > 1 else 0
    if placement_group and efa:
        request["Placement"]["GroupName"] = placement_group
    if efa:
        request["NetworkInterfaces"] = [
            {
                "NetworkCardIndex": card,
                "DeviceIndex": 0 if card == 0 else 1,
                "InterfaceType": "efa",
                "SubnetId": subnet,
                "Groups": [sg],
                "DeleteOnTermination": True,
                **({"AssociatePublicIpAddress": True} if efa == 1 else {}),
            }
            for card in range(efa)
        ]
        request["TagSpecifications"].append(scope.tag_spec("network-interface"))
    else:
        request["SecurityGroupIds"] = [sg]
    if offer.spot:
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    return request
