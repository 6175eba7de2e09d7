"""Leak checks: what a cluster left behind in the stand-in (or any EC2 endpoint).

A resource belongs to a cluster when it carries the tag ``cloudtrain:cluster=<cluster>``. moto
supports that tag, and filtering by it, on instances, security groups, key pairs
(``TagSpecifications`` on ``create_key_pair``/``import_key_pair``), volumes and network
interfaces; placement groups are the stand-in's own and are found the same way.
"""

from __future__ import annotations

from typing import Any

CLUSTER_TAG = "cloudtrain:cluster"

_LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]


def leftovers(ec2: Any, cluster: str, *, tag_key: str = CLUSTER_TAG) -> dict[str, list[str]]:
    """What still exists with tag ``tag_key=cluster``, by kind; every kind is always present.

    Kinds: ``instances`` (ids, not terminated), ``security_groups`` (ids), ``key_pairs``
    (names), ``placement_groups`` (names), ``volumes`` (ids), ``network_interfaces`` (ids),
    ``addresses`` (Elastic IP allocation ids).
    Read-only: one describe call per kind (paginated where EC2 paginates).
    """
    tagged = [{"Name": f"tag:{tag_key}", "Values": [cluster]}]

    def pages(operation: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
        paginator = ec2.get_paginator(operation)
        return [item for page in paginator.paginate(**kwargs) for item in page[key]]

    live = [*tagged, {"Name": "instance-state-name", "Values": _LIVE_STATES}]
    reservations = pages("describe_instances", "Reservations", Filters=live)
    return {
        "instances": [i["InstanceId"] for r in reservations for i in r["Instances"]],
        "security_groups": [
            g["GroupId"]
            for g in pages("describe_security_groups", "SecurityGroups", Filters=tagged)
        ],
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs(Filters=tagged)["KeyPairs"]],
        "placement_groups": [
            g["GroupName"] for g in ec2.describe_placement_groups(Filters=tagged)["PlacementGroups"]
        ],
        "volumes": [v["VolumeId"] for v in pages("describe_volumes", "Volumes", Filters=tagged)],
        "network_interfaces": [
            n["NetworkInterfaceId"]
            for n in pages("describe_network_interfaces", "NetworkInterfaces", Filters=tagged)
        ],
        "addresses": [
            a["AllocationId"] for a in ec2.describe_addresses(Filters=tagged)["Addresses"]
        ],
    }


def assert_empty(ec2: Any, cluster: str, *, tag_key: str = CLUSTER_TAG) -> None:
    """Fails the test, naming what is left, unless ``leftovers`` finds nothing."""
    left = {kind: ids for kind, ids in leftovers(ec2, cluster, tag_key=tag_key).items() if ids}
    if left:
        raise AssertionError(f"cluster {cluster!r} left resources behind: {left}")
