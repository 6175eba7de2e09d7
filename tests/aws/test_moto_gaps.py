"""The stand-in's indexed tag lookup (``moto_gaps.index_tag_lookups``) answers exactly what
moto's own scan answers: the same records for every resource, the same instances for every
tag filter, a second owner's instances left out the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.ec2.models.amis import AMIS
from moto.ec2.models.core import TaggedEC2Resource

from cloudtrain.providers.aws import _resources as res
from tests.aws import moto_gaps


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # mock_aws answers AWS's own URLs
    monkeypatch.setattr(TaggedEC2Resource, "get_tags", TaggedEC2Resource.get_tags)  # restored
    with mock_aws():
        yield boto3.client("ec2", region_name="us-east-1")


#: one of moto's own images (describing them all takes seconds)
IMAGE = str(AMIS[0]["ami_id"])


def launch(ec2: Any, cluster: str, owner: str, count: int) -> list[str]:
    scope = res.Scope(cluster, owner)
    out = ec2.run_instances(
        ImageId=IMAGE, InstanceType="m5.large", MinCount=count, MaxCount=count,
        TagSpecifications=[scope.tag_spec("instance", **{"cloudtrain:nodes": "0-2"}),
                           scope.tag_spec("volume")],
    )  # fmt: skip
    return [i["InstanceId"] for i in out["Instances"]]


def resources(ec2: Any) -> list[Any]:
    """Every tagged-resource object moto holds in the region that these tests make."""
    backend = moto_gaps.ec2_backend(ec2.meta.region_name)
    found: list[Any] = [*backend.all_instances(), *backend.volumes.values()]
    found += [g for groups in backend.groups.values() for g in groups.values()]
    found += list(backend.key_pairs.values())
    return found


def test_the_indexed_lookup_answers_what_the_scan_answers(ec2: Any) -> None:
    mine = launch(ec2, "c1", "me", 3)
    theirs = launch(ec2, "c1", "someone-else", 2)
    untagged = ec2.run_instances(
        ImageId=IMAGE, InstanceType="m5.large", MinCount=1, MaxCount=1
    )["Instances"][0]["InstanceId"]  # fmt: skip
    res.ensure_security_group(ec2, res.Scope("c1", "me"), "203.0.113.7/32")
    ec2.create_key_pair(KeyName="k", TagSpecifications=[res.Scope("c1", "me").tag_spec("key-pair")])
    ec2.delete_tags(Resources=[mine[0]], Tags=[{"Key": "Name"}])
    ec2.create_tags(Resources=[theirs[0]], Tags=[{"Key": "extra", "Value": "x"}])
    ec2.terminate_instances(InstanceIds=[theirs[1]])
    backend = moto_gaps.ec2_backend("us-east-1")
    tables = len(backend.tags)

    objects = resources(ec2)
    assert {o.id for o in objects} >= {*mine, *theirs, untagged}
    for obj in objects:
        assert moto_gaps._indexed_get_tags(obj) == moto_gaps.SCANNING_GET_TAGS(obj), obj.id
    assert moto_gaps._indexed_get_tags(next(o for o in objects if o.id == untagged)) == []
    assert len(backend.tags) == tables  # a lookup adds no empty table to moto's defaultdict


@pytest.mark.parametrize("owner", ["me", "someone-else", None])
def test_describes_by_tag_find_the_same_instances_either_way(ec2: Any, owner: str | None) -> None:
    launch(ec2, "c1", "me", 3)
    launch(ec2, "c1", "someone-else", 2)
    launch(ec2, "c2", "me", 1)

    def described() -> list[tuple[str, list[dict[str, str]]]]:
        return [
            (i["InstanceId"], sorted(i.get("Tags", []), key=lambda t: t["Key"]))
            for i in res.live_instances(ec2, res.Scope("c1", owner))
        ]

    moto_gaps.index_tag_lookups(False)
    scanned = described()
    moto_gaps.index_tag_lookups()
    indexed = described()
    assert indexed == scanned
    assert len(indexed) == {"me": 3, "someone-else": 2, None: 5}[owner]
    if owner is not None:
        assert all({"Key": "cloudtrain:owner", "Value": owner} in tags for _, tags in indexed)
