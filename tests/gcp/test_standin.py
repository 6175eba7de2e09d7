"""The stand-in itself: the GCE rules it enforces, so that tests passing against it mean
something (each rule here is one a careless provider would break on the real API)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from tests.gcp.gce import DEFAULT_RULES, IMPLIED_DENY, admits, verdict
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
    resource: compute_v1.BulkInsertInstanceResource = (
        compute_v1.BulkInsertInstanceResource.from_json(json.dumps(body))
    )
    return resource


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


def firewall(name: str, priority: int, **fields: Any) -> compute_v1.Firewall:
    body = {"name": name, "network": "global/networks/default", "priority": priority, **fields}
    rule: compute_v1.Firewall = compute_v1.Firewall.from_json(json.dumps(body))
    return rule


def test_the_default_network_has_its_standard_rules(gcp: StandIn) -> None:
    rules = list(client(gcp, compute_v1.FirewallsClient).list(project=PROJECT))
    assert sorted((r.name, r.priority, r.direction) for r in rules) == [
        (name, 65534, "INGRESS") for name in sorted(DEFAULT_RULES)
    ]
    assert gcp.is_empty()  # none of them is cloudtrain's
    assert verdict(gcp.gce, "default", [], "192.0.2.1", "tcp", 22) == (True, "default-allow-ssh")
    assert verdict(gcp.gce, "default", [], "192.0.2.1", "tcp", 3389) == (True, "default-allow-rdp")
    assert verdict(gcp.gce, "default", [], "192.0.2.1", "icmp") == (True, "default-allow-icmp")
    assert verdict(gcp.gce, "default", [], "10.200.0.3", "udp", 53) == (
        True,
        "default-allow-internal",
    )
    assert verdict(gcp.gce, "default", [], "192.0.2.1", "tcp", 8080) == (False, IMPLIED_DENY)
    assert verdict(gcp.gce, "other-network", [], "10.200.0.3", "tcp", 22) == (False, IMPLIED_DENY)


def test_rules_are_evaluated_as_gce_does(gcp: StandIn) -> None:
    rules = client(gcp, compute_v1.FirewallsClient)
    for rule in (
        firewall("allow-web", 500, targetTags=["web"], allowed=[{"IPProtocol": "tcp"}]),
        firewall("deny-web", 500, targetTags=["web"], denied=[{"IPProtocol": "6"}]),
        firewall(
            "allow-ssh-early",
            400,
            sourceRanges=["192.0.2.0/24"],
            allowed=[{"IPProtocol": "tcp", "ports": ["20-23"]}],
        ),
        firewall(
            "from-db", 300, targetTags=["app"], sourceTags=["db"], allowed=[{"IPProtocol": "all"}]
        ),
        # were either of these two honoured, every packet below would be denied
        firewall("off", 100, disabled=True, denied=[{"IPProtocol": "all"}]),
        firewall("out", 100, direction="EGRESS", denied=[{"IPProtocol": "all"}]),
    ):
        rules.insert_unary(project=PROJECT, firewall_resource=rule)
    # lowest number first, whatever the order of insertion
    assert verdict(gcp.gce, "default", ["web"], "192.0.2.9", "tcp", 22) == (True, "allow-ssh-early")
    # at equal priority a deny wins (protocol by number: 6 is tcp)
    assert verdict(gcp.gce, "default", ["web"], "198.51.100.1", "tcp", 443) == (False, "deny-web")
    # a target tag the instance lacks: the rule does not apply
    assert verdict(gcp.gce, "default", [], "198.51.100.1", "tcp", 22) == (True, "default-allow-ssh")
    # source tags: the sending instance's tags, its address aside
    assert verdict(gcp.gce, "default", ["app"], "203.0.113.5", "udp", 5432, ["db"]) == (
        True,
        "from-db",
    )
    assert verdict(gcp.gce, "default", ["app"], "203.0.113.5", "udp", 5432) == (
        False,
        IMPLIED_DENY,
    )
    assert admits(gcp.gce, "default", ["x"], "192.0.2.9", "tcp", 24) is False  # 20-23 only


def test_firewall_patches_merge_apply_when_done_and_keep_the_rules_shape(gcp: StandIn) -> None:
    rules = client(gcp, compute_v1.FirewallsClient)
    ssh = {"sourceRanges": ["192.0.2.1/32"], "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]}
    rules.insert_unary(project=PROJECT, firewall_resource=firewall("ssh", 900, **ssh))
    op = rules.patch_unary(
        project=PROJECT,
        firewall="ssh",
        firewall_resource=compute_v1.Firewall(source_ranges=["192.0.2.2/32"]),
    )
    assert gcp.gce.firewalls["ssh"]["sourceRanges"] == ["192.0.2.1/32"]  # not done yet
    client(gcp, compute_v1.GlobalOperationsClient).wait(project=PROJECT, operation=op.name)
    stored = gcp.gce.firewalls["ssh"]
    assert (stored["sourceRanges"], stored["allowed"], stored["priority"]) == (
        ["192.0.2.2/32"],
        ssh["allowed"],
        900,
    )
    for change, field in (
        (compute_v1.Firewall(network="global/networks/other"), "network"),
        (compute_v1.Firewall(direction="EGRESS"), "direction"),
        (compute_v1.Firewall(denied=[{"I_p_protocol": "all"}]), "'allowed' and 'denied'"),
    ):
        with pytest.raises(exceptions.BadRequest, match=field):
            rules.patch_unary(project=PROJECT, firewall="ssh", firewall_resource=change)
    with pytest.raises(exceptions.BadRequest, match="'allowed' and 'denied'"):
        rules.insert_unary(project=PROJECT, firewall_resource=firewall("neither", 1000))
    with pytest.raises(exceptions.NotFound):
        rules.patch_unary(
            project=PROJECT, firewall="nope", firewall_resource=compute_v1.Firewall(priority=1)
        )
