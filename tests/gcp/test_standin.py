"""The stand-in itself: the GCE rules it enforces, so that tests passing against it mean
something (each rule here is one a careless provider would break on the real API)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from tests.gcp.standin import PROJECT, StandIn


def client(gcp: StandIn, cls: Any = compute_v1.InstancesClient) -> Any:
    import google.auth

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return cls(credentials=credentials, transport="rest", client_options={"api_endpoint": gcp.url})


def bulk(names: list[str], **props: Any) -> compute_v1.BulkInsertInstanceResource:
    labels = {"cloudtrain-cluster": "c1"}
    body = {
        "count": len(names),
        "minCount": len(names),
        "perInstanceProperties": {n: {} for n in names},
        "instanceProperties": {
            "machineType": "n1-highmem-8",
            "labels": labels,
            "disks": [{"boot": True, "initializeParams": {"labels": labels}}],
            **props,
        },
    }
    return compute_v1.BulkInsertInstanceResource.from_json(json.dumps(body))


def test_calls_without_a_token_it_issued_are_refused(gcp: StandIn) -> None:
    from google.auth.exceptions import RefreshError
    from google.oauth2.credentials import Credentials

    forged = compute_v1.InstancesClient(
        credentials=Credentials(token="ya29.forged"),
        transport="rest",
        client_options={"api_endpoint": gcp.url},
    )
    with pytest.raises(RefreshError):  # google-auth answers a 401 by refreshing, and cannot
        list(forged.list(project=PROJECT, zone="us-central1-a"))
    assert [c.name for c in gcp.calls()] == ["instances.list"]


def test_operations_finish_only_when_polled_and_lists_page(gcp: StandIn) -> None:
    instances = client(gcp)
    op = instances.bulk_insert_unary(
        project=PROJECT,
        zone="us-central1-a",
        bulk_insert_instance_resource_resource=bulk([f"n{i}" for i in range(5)]),
    )
    assert op.status == compute_v1.Operation.Status.RUNNING
    waited = client(gcp, compute_v1.ZoneOperationsClient).wait(
        project=PROJECT, zone="us-central1-a", operation=op.name
    )
    assert waited.status == compute_v1.Operation.Status.DONE
    request = {
        "project": PROJECT,
        "zone": "us-central1-a",
        "filter": 'labels.cloudtrain-cluster = "c1"',
    }
    assert sorted(i.name for i in instances.list(request=request)) == [f"n{i}" for i in range(5)]
    assert len(gcp.calls("instances.list")) == 3  # pages of 2
    with pytest.raises(exceptions.BadRequest, match="filter"):
        list(instances.list(request={**request, "filter": "labels.x ~ y"}))


def test_a_boot_disk_outlives_its_instance_unless_auto_delete(gcp: StandIn) -> None:
    instances = client(gcp)
    instances.bulk_insert_unary(
        project=PROJECT, zone="us-central1-a", bulk_insert_instance_resource_resource=bulk(["n0"])
    )
    op = instances.delete_unary(project=PROJECT, zone="us-central1-a", instance="n0")
    client(gcp, compute_v1.ZoneOperationsClient).wait(
        project=PROJECT, zone="us-central1-a", operation=op.name
    )
    assert gcp.leftovers("c1") == {
        "instances": [],
        "disks": ["n0"],
        "firewalls": [],
        "policies": [],
    }


def test_shapes_a_zone_cannot_give_and_unknown_policies_are_refused(gcp: StandIn) -> None:
    instances = client(gcp)
    a100_80 = bulk(["n0"], machineType="a2-ultragpu-8g")
    with pytest.raises(exceptions.BadRequest, match="nvidia-a100-80gb"):
        instances.bulk_insert_unary(
            project=PROJECT, zone="us-central1-b", bulk_insert_instance_resource_resource=a100_80
        )
    with pytest.raises(exceptions.BadRequest, match="resource policy"):
        instances.bulk_insert_unary(
            project=PROJECT,
            zone="us-central1-a",
            bulk_insert_instance_resource_resource=bulk(["n0"], resourcePolicies=["nope"]),
        )
    assert gcp.is_empty()


def test_a_policy_in_use_cannot_be_deleted(gcp: StandIn) -> None:
    policies = client(gcp, compute_v1.ResourcePoliciesClient)
    policy = compute_v1.ResourcePolicy(
        name="pg", group_placement_policy={"collocation": "COLLOCATED"}
    )
    policies.insert_unary(project=PROJECT, region="us-central1", resource_policy_resource=policy)
    client(gcp).bulk_insert_unary(
        project=PROJECT,
        zone="us-central1-a",
        bulk_insert_instance_resource_resource=bulk(["n0"], resourcePolicies=["pg"]),
    )
    with pytest.raises(exceptions.BadRequest, match="already being used"):
        policies.delete_unary(project=PROJECT, region="us-central1", resource_policy="pg")
