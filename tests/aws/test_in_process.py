"""Fast tests with moto in-process (``mock_aws``): the resource helpers, and fault injection
by a botocore event hook instead of the stand-in's middleware. No placement groups here (moto
does not serve them; the stand-in does), so the shapes are single-interface ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from moto import mock_aws

from cloudtrain import access
from cloudtrain.model import Event
from cloudtrain.providers.aws import _resources as res
from cloudtrain.providers.aws._client import Clients
from cloudtrain.providers.aws.provider import AwsProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.aws import moto_gaps

CIDR = "203.0.113.7/32"


def no_placement_groups(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
    """moto does not serve DescribePlacementGroups; in-process, there are none."""
    return AWSResponse("", 200, {}, None), {"PlacementGroups": []}


PLACEMENT_HOOK = ("before-call.ec2.DescribePlacementGroups", no_placement_groups)


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # mock_aws answers AWS's own URLs
    with mock_aws():
        moto_gaps.extend_gpu_offerings()
        moto_gaps.add_p3_instance_types()
        client = boto3.client("ec2", region_name="us-east-1")
        client.meta.events.register(*PLACEMENT_HOOK)
        yield client


def tagged(ec2: Any, kind: str, cluster: str) -> list[Any]:
    cluster_filter = [res.cluster_filter(cluster)]
    found: list[Any] = {
        "groups": lambda: ec2.describe_security_groups(Filters=cluster_filter)["SecurityGroups"],
        "keys": lambda: ec2.describe_key_pairs(Filters=cluster_filter)["KeyPairs"],
        "addresses": lambda: ec2.describe_addresses(Filters=cluster_filter)["Addresses"],
    }[kind]()
    return found


def test_per_cluster_resources_are_made_once_and_deleted_by_tag(ec2: Any, tmp_path: Path) -> None:
    group, changes = res.ensure_security_group(ec2, res.Scope("c1", "me"), CIDR)
    assert changes == []
    assert res.ensure_security_group(ec2, res.Scope("c1", "me"), CIDR) == (group, [])
    _, public = access.cluster_key(tmp_path, "c1")
    res.ensure_key_pair(ec2, res.Scope("c1", "me"), public)
    res.ensure_key_pair(ec2, res.Scope("c1", "me"), public)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    eni = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0][
        "NetworkInterfaces"
    ][0]["NetworkInterfaceId"]
    address = res.ensure_head_address(ec2, res.Scope("c1", "me"), eni)
    assert res.ensure_head_address(ec2, res.Scope("c1", "me"), eni) == address
    assert [len(tagged(ec2, k, "c1")) for k in ("groups", "keys", "addresses")] == [1, 1, 1]
    assert tagged(ec2, "groups", "other") == []
    assert res.delete_all(ec2, res.Scope("c1", "someone else"), poll_s=0.01) == []
    deleted = res.delete_all(ec2, res.Scope("c1", "me"), poll_s=0.01)
    assert deleted == [f"elastic IP {address}", f"security group {group}", "key pair cloudtrain-c1"]
    assert [len(tagged(ec2, k, "c1")) for k in ("groups", "keys", "addresses")] == [0, 0, 0]
    assert res.delete_all(ec2, res.Scope("c1", "me"), poll_s=0.01) == []


def test_the_ssh_rule_follows_the_callers_address(ec2: Any) -> None:
    group, _ = res.ensure_security_group(ec2, res.Scope("c1", "me"), CIDR)
    _, changes = res.ensure_security_group(ec2, res.Scope("c1", "me"), "198.51.100.9/32")
    assert changes == [f"SSH to security group {group} now from 198.51.100.9/32 only (was {CIDR})"]
    found = ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"][0]
    ssh = [p for p in found["IpPermissions"] if p.get("FromPort") == 22]
    assert [r["CidrIp"] for p in ssh for r in p["IpRanges"]] == ["198.51.100.9/32"]
    assert len(found["IpPermissions"]) == 2, "the rule within the group stays"
    assert res.ensure_security_group(ec2, res.Scope("c1", "me"), "198.51.100.9/32") == (group, [])


def test_a_capacity_error_from_an_event_hook_moves_to_the_next_zone(
    ec2: Any, tmp_path: Path
) -> None:
    image = moto_gaps.register_dlami(ec2)
    moto_gaps.put_dlami_parameter(boto3.client("ssm", region_name="us-east-1"), image)
    clients = Clients()

    def no_capacity_in_1a(params: dict[str, Any], **_: Any) -> None:
        if params.get("Placement", {}).get("AvailabilityZone") == "us-east-1a":
            error = {"Code": "InsufficientInstanceCapacity", "Message": "none left in 1a"}
            raise ClientError({"Error": error}, "RunInstances")

    clients.hooks += [("provide-client-params.ec2.RunInstances", no_capacity_in_1a), PLACEMENT_HOOK]
    options = {"poll_s": 0.01, "regions": ["us-east-1"], "owner": "me", "clients": clients}
    provider = AwsProvider(ProviderContext(home=tmp_path, options=options))
    spec = ClusterSpec(
        "c2", "aws", 2, Resources(accelerator="V100", count=1, region="us-east-1"), ssh_cidr=CIDR
    )
    events: list[Event] = []
    nodes = provider.apply(provider.plan(spec), events.append)
    assert {n.zone for n in nodes} == {"us-east-1b"}
    assert [e.message for e in events if e.kind == "capacity"] == [
        "us-east-1/us-east-1a: InsufficientInstanceCapacity; trying the next zone"
    ]
    provider.terminate("c2")
    assert provider.describe("c2") == []
    assert [len(tagged(ec2, k, "c2")) for k in ("groups", "keys", "addresses")] == [0, 0, 0]
