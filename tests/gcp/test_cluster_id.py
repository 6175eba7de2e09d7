"""The cluster id (one per incarnation of a name) on GCE: labelled on instances and disks,
written in the rules' and the policy's description, and what `describe`, `terminate`,
`leftovers` and `apply` match, through the real google-cloud-compute client against the
stand-in. A second incarnation of a name (which `apply` refuses to make) is made in the
stand-in directly, as another machine's `up` would have made it."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.gcp import _resources as res
from cloudtrain.spec import ClusterSpec
from tests.gcp import test_provider
from tests.gcp.standin import StandIn
from tests.gcp.test_provider import Make, a100, bulk, mutations

make = test_provider.make  # the fixture

ID_A, ID_B = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
OWNER = "tester_40host_2eexample"  # tester@host.example, as labels write it
RULES = ["cloudtrain-exp1-deny", "cloudtrain-exp1-internal", "cloudtrain-exp1-ssh"]
NODES = ["cloudtrain-exp1-0", "cloudtrain-exp1-1"]


def spec(cluster_id: str | None) -> ClusterSpec:
    return dataclasses.replace(a100(), cluster_id=cluster_id)


def second_incarnation(gcp: StandIn, cluster_id: str, zone: str = "us-central1-b") -> None:
    """Nodes 0 and 1 of `exp1` under `cluster_id` in `zone`, as the first bulkInsert made
    them otherwise (same owner, rules and policy: the name's resources are shared)."""
    props = copy.deepcopy(bulk(gcp)["instanceProperties"])
    labels = {**props["labels"], res.LABEL_CLUSTER_ID: cluster_id}
    props["labels"] = props["disks"][0]["initializeParams"]["labels"] = labels
    with gcp.lock:
        for name in NODES:
            gcp.gce.create_instance(zone, name, props)


def where(gcp: StandIn) -> dict[str, list[str]]:
    """Zone → the ids labelled on its instances, sorted."""
    found: dict[str, list[str]] = {}
    for (zone, _), inst in sorted(gcp.gce.instances.items()):
        found.setdefault(zone, []).append(inst["labels"].get(res.LABEL_CLUSTER_ID, ""))
    return found


def test_every_resource_carries_the_cluster_id(make: Make, gcp: StandIn) -> None:
    provider = make()
    plan = provider.plan(spec(ID_A))
    provider.apply(plan)
    labels = {
        "cloudtrain-cluster": "exp1",
        "cloudtrain-owner": OWNER,
        "cloudtrain-cluster-id": ID_A,
    }
    props = bulk(gcp)["instanceProperties"]
    assert props["labels"] == props["disks"][0]["initializeParams"]["labels"] == labels
    assert [i["labels"] for i in gcp.gce.instances.values()] == [labels, labels]
    assert [d["labels"] for d in gcp.gce.disks.values()] == [labels, labels]
    described = f"cloudtrain cluster=exp1 owner={OWNER} cluster-id={ID_A}"
    assert {gcp.gce.firewalls[n]["description"] for n in RULES} == {described}
    assert [p["description"] for p in gcp.gce.policies.values()] == [described]
    sent = [c.body["description"] for c in gcp.calls() if c.name.endswith(".insert")]
    dry = [b["description"] for r in plan.requests for k, b in r.items() if k.endswith(".insert")]
    assert sent == dry == [described] * 4  # the dry run shows what is sent
    assert provider.holders("exp1") == {(OWNER, ID_A)}
    assert provider.clusters() == ["exp1"]


def test_describe_and_terminate_of_one_incarnation_leave_the_other(
    make: Make, gcp: StandIn
) -> None:
    provider = make()
    provider.apply(provider.plan(spec(ID_A)))
    second_incarnation(gcp, ID_B)
    assert where(gcp) == {"us-central1-a": [ID_A, ID_A], "us-central1-b": [ID_B, ID_B]}
    assert {n.zone for n in provider.describe("exp1", ID_A)} == {"us-central1-a"}
    assert {n.zone for n in provider.describe("exp1", ID_B)} == {"us-central1-b"}
    assert len(provider.describe("exp1")) == 4  # no id: every incarnation
    assert provider.holders("exp1") == {(OWNER, ID_A), (OWNER, ID_B)}

    provider.terminate("exp1", ID_A)
    assert where(gcp) == {"us-central1-b": [ID_B, ID_B]}
    assert gcp.leftovers("exp1") == {
        "instances": NODES,
        "disks": NODES,
        "firewalls": RULES,  # b's nodes use the name's rules and policy: they stay
        "policies": ["cloudtrain-exp1"],
    }
    assert provider.describe("exp1", ID_A) == []
    assert provider.leftovers("exp1", ID_A) == []  # b holds them: terminate keeps them
    assert len(provider.describe("exp1", ID_B)) == 2
    provider.terminate("exp1", ID_B)
    assert gcp.leftovers("exp1") == {
        "instances": [],
        "disks": [],
        "firewalls": RULES,  # a's, as their description says: not b's to delete
        "policies": ["cloudtrain-exp1"],
    }
    assert provider.leftovers("exp1", ID_B) == []
    assert provider.leftovers("exp1") == [
        "firewall rules of cluster exp1",
        "placement policy cloudtrain-exp1 in us-central1",
    ]
    provider.terminate("exp1")  # `down exp1` with no record: every incarnation
    assert gcp.is_empty()


@pytest.mark.parametrize("held_by", ["instances", "rules and policy left"])
@pytest.mark.parametrize("other", [ID_A, None], ids=["another-id", "no-id"])
def test_apply_refuses_a_name_this_owner_holds_under_another_id(
    make: Make, gcp: StandIn, held_by: str, other: str | None
) -> None:
    make().apply(make().plan(spec(other)))
    if held_by != "instances":
        for name in NODES:
            gcp.delete_instance(name)
    before = (gcp.leftovers(), copy.deepcopy(gcp.gce.firewalls), len(mutations(gcp)))
    provider = make()
    plan = provider.plan(spec(ID_B))
    with pytest.raises(ConfigError) as err:
        provider.apply(plan)
    held = f"held on gcp by another cluster of owner tester@host.example (id {other or 'none'})"
    assert held in str(err.value)
    assert "nothing was created" in str(err.value)
    assert (gcp.leftovers(), gcp.gce.firewalls, len(mutations(gcp))) == before


def test_terminate_without_an_id_removes_every_incarnation(make: Make, gcp: StandIn) -> None:
    provider = make()
    provider.apply(provider.plan(spec(ID_A)))
    second_incarnation(gcp, ID_B)
    second_incarnation(gcp, "", zone="us-central1-c")  # one of an older version: no id
    provider.terminate("exp1")
    assert gcp.is_empty()
    assert provider.clusters() == []


def test_a_resource_without_the_id_is_found_only_without_an_id(make: Make, gcp: StandIn) -> None:
    provider = make()
    provider.apply(provider.plan(spec(None)))  # as an older version made it
    assert res.LABEL_CLUSTER_ID not in bulk(gcp)["instanceProperties"]["labels"]
    assert provider.holders("exp1") == {(OWNER, "")}
    assert [n.index for n in provider.describe("exp1")] == [0, 1]
    assert provider.describe("exp1", "0123456789ab") == []
    assert provider.leftovers("exp1", "0123456789ab") == []
    before = gcp.leftovers()
    provider.terminate("exp1", "0123456789ab")
    assert gcp.leftovers() == before, "not that incarnation's: nothing is deleted"
    for name in NODES:
        gcp.delete_instance(name)
    assert provider.leftovers("exp1", "0123456789ab") == []  # the rules have no id either
    assert provider.leftovers("exp1") == [
        "firewall rules of cluster exp1",
        "placement policy cloudtrain-exp1 in us-central1",
    ]
    provider.terminate("exp1")
    assert gcp.is_empty()


def test_descriptions_of_older_versions_still_read() -> None:
    assert res.parse_description("cloudtrain cluster=exp1 owner=alice") == ("exp1", "alice", "")
    text = res.description("exp1", "alice@host", ID_A)
    assert text == f"cloudtrain cluster=exp1 owner=alice_40host cluster-id={ID_A}"
    assert res.parse_description(text) == res.Holder("exp1", "alice_40host", ID_A)
    assert res.parse_description("one of the default network's own rules") is None
