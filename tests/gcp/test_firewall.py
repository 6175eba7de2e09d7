"""cloudtrain's firewall rules on GCE: made and changed through the real google-cloud-compute
client against the stand-in, and judged by the stand-in's model of GCE's rule evaluation
(`gce.verdict`). Whatever else the network allows (the ``default`` network lets SSH in from
anywhere), only cloudtrain's rules reach a cluster's nodes."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import ProviderError
from cloudtrain.providers.gcp._client import Clients
from cloudtrain.providers.gcp._resources import ensure_firewalls, firewall_bodies
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.gcp.gce import DEFAULT_RULES, verdict
from tests.gcp.standin import StandIn

CIDR, CALLER = "203.0.113.7/32", "203.0.113.7"
MOVED, MOVED_TO = "198.51.100.9/32", "198.51.100.9"
STRANGER = "198.51.100.20"
OWNER = "tester@host.example"
TAG = "cloudtrain-fw1"
SSH, INTERNAL, DENY = "cloudtrain-fw1-ssh", "cloudtrain-fw1-internal", "cloudtrain-fw1-deny"
MUTATING = ("firewalls.insert", "firewalls.patch", "firewalls.delete")
Make = Callable[..., GcpProvider]


@pytest.fixture
def make(gcp: StandIn, tmp_path: Path) -> Make:
    def build(clients: Clients | None = None) -> GcpProvider:
        opts: dict[str, Any] = {"poll_s": 0.01, "owner": OWNER}
        if clients is not None:
            opts["clients"] = clients
        return GcpProvider(ProviderContext(home=tmp_path / "home", options=opts))

    return build


def spec(nodes: int = 1, cidr: str = CIDR) -> ClusterSpec:
    resources = Resources(accelerator="V100", count=1, region="us-central1")
    return ClusterSpec("fw1", "gcp", nodes, resources, ssh_cidr=cidr)


def instance(gcp: StandIn, name: str) -> dict[str, Any]:
    return next(i for (_, n), i in gcp.gce.instances.items() if n == name)


def reaches(
    gcp: StandIn,
    name: str,
    source_ip: str,
    protocol: str,
    port: int | None = None,
    source_tags: Collection[str] = (),
) -> tuple[bool, str]:
    """(admitted, deciding rule) for a packet to instance `name`, from its network and tags."""
    inst = instance(gcp, name)
    network = str(inst["networkInterfaces"][0]["network"]).rsplit("/", 1)[-1]
    tags = inst.get("tags", {}).get("items", [])
    return verdict(gcp.gce, network, tags, source_ip, protocol, port, source_tags)


def rule_set(gcp: StandIn) -> dict[str, tuple[Any, ...]]:
    """Each cloudtrain rule of the stand-in as (priority, direction, action, targets, sources)."""
    return {
        name: (
            rule["priority"],
            rule["direction"],
            {k: rule[k] for k in ("allowed", "denied") if k in rule},
            rule["targetTags"],
            rule.get("sourceRanges", []) + [f"tag:{t}" for t in rule.get("sourceTags", [])],
        )
        for name, rule in sorted(gcp.gce.firewalls.items())
        if name.startswith("cloudtrain-")
    }


def mutations(gcp: StandIn) -> list[str]:
    return [c.name for c in gcp.calls() if c.name in MUTATING]


def test_up_makes_exactly_three_rules_and_leaves_the_networks_own_alone(
    make: Make, gcp: StandIn
) -> None:
    plan = make().plan(spec())
    make().apply(plan)
    assert rule_set(gcp) == {
        SSH: (900, "INGRESS", {"allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]}, [TAG], [CIDR]),
        INTERNAL: (900, "INGRESS", {"allowed": [{"IPProtocol": "all"}]}, [TAG], [f"tag:{TAG}"]),
        DENY: (999, "INGRESS", {"denied": [{"IPProtocol": "all"}]}, [TAG], ["0.0.0.0/0"]),
    }
    described = {gcp.gce.firewalls[n]["description"] for n in (SSH, INTERNAL, DENY)}
    assert described == {"cloudtrain cluster=fw1 owner=tester_40host_2eexample"}
    sent = [c.body for c in gcp.calls("firewalls.insert")]
    assert [b["name"] for b in sent] == [SSH, INTERNAL, DENY]
    assert sent[2] == {
        "name": DENY,
        "description": "cloudtrain cluster=fw1 owner=tester_40host_2eexample",
        "network": "global/networks/default",
        "direction": "INGRESS",
        "priority": 999,
        "targetTags": [TAG],
        "sourceRanges": ["0.0.0.0/0"],
        "denied": [{"IPProtocol": "all"}],
    }
    assert [r["firewalls.insert"] for r in plan.requests if "firewalls.insert" in r] == sent
    assert sorted(n for n in gcp.gce.firewalls if not n.startswith("cloudtrain-")) == sorted(
        DEFAULT_RULES
    )


def test_only_the_callers_ssh_and_the_clusters_own_traffic_reach_the_nodes(
    make: Make, gcp: StandIn
) -> None:
    # the premise: on the default network alone, anyone's SSH and 10.128/9 reach a node
    assert verdict(gcp.gce, "default", [TAG], STRANGER, "tcp", 22) == (True, "default-allow-ssh")
    assert verdict(gcp.gce, "default", [TAG], "10.128.0.5", "tcp", 8080) == (
        True,
        "default-allow-internal",
    )
    make().apply(make().plan(spec(nodes=2)))
    node0, node1 = "cloudtrain-fw1-0", "cloudtrain-fw1-1"
    peer = str(instance(gcp, node1)["networkInterfaces"][0]["networkIP"])
    assert reaches(gcp, node0, CALLER, "tcp", 22) == (True, SSH)
    assert reaches(gcp, node0, STRANGER, "tcp", 22) == (False, DENY)
    assert reaches(gcp, node0, CALLER, "tcp", 8080) == (False, DENY)  # the caller: SSH only
    assert reaches(gcp, node0, STRANGER, "tcp", 3389) == (False, DENY)
    assert reaches(gcp, node0, STRANGER, "icmp") == (False, DENY)
    assert reaches(gcp, node0, "10.128.0.5", "tcp", 22) == (False, DENY)
    assert reaches(gcp, node0, "10.128.0.5", "udp", 53, ["web"]) == (False, DENY)
    assert reaches(gcp, node0, "10.128.0.6", "tcp", 22, ["cloudtrain-other"]) == (False, DENY)
    assert reaches(gcp, node0, peer, "tcp", 29500, [TAG]) == (True, INTERNAL)
    assert reaches(gcp, node1, peer, "udp", 4791, [TAG]) == (True, INTERNAL)
    # the rest of the network is as it was
    assert verdict(gcp.gce, "default", ["web"], STRANGER, "tcp", 22) == (True, "default-allow-ssh")


def test_down_removes_all_three_rules_the_deny_last(make: Make, gcp: StandIn) -> None:
    make().apply(make().plan(spec()))
    make().terminate("fw1")
    assert gcp.is_empty("fw1")
    deleted = [c.path.rsplit("/", 1)[-1] for c in gcp.calls("firewalls.delete")]
    assert deleted == [SSH, INTERNAL, DENY]
    assert sorted(gcp.gce.firewalls) == sorted(DEFAULT_RULES)


class Crash(Exception):
    """Stands for the process dying right after a call succeeded."""


def test_a_crash_during_down_leaves_the_deny_rule_and_down_finds_it(
    make: Make, gcp: StandIn
) -> None:
    make().apply(make().plan(spec()))
    clients = Clients()
    seen: list[str] = []

    def crash(name: str) -> None:
        seen.append(name)
        if seen.count("firewalls.delete") == 2:  # the SSH and internal rules: the deny is last
            raise Crash(name)

    clients.hooks.append(crash)
    with pytest.raises(Crash):
        make(clients).terminate("fw1")
    assert DENY in gcp.gce.firewalls
    assert make().clusters() == ["fw1"]  # found by the rules' description
    make().terminate("fw1")
    assert gcp.is_empty("fw1")


def test_the_ssh_rule_follows_the_callers_address_and_a_second_call_changes_nothing(
    gcp: StandIn,
) -> None:
    clients = Clients()
    assert ensure_firewalls(clients, firewall_bodies("fw1", OWNER, CIDR, "default"), 60) == [
        f"SSH rule {SSH} created: allows tcp:22 from {CIDR} (priority 900)",
        f"internal rule {INTERNAL} created: allows all from instances tagged {TAG} (priority 900)",
        f"deny rule {DENY} created: denies all from 0.0.0.0/0 (priority 999)",
    ]
    moved = firewall_bodies("fw1", OWNER, MOVED, "default")
    assert ensure_firewalls(clients, moved, 60) == [
        f"SSH rule {SSH} now admits {MOVED} (was {CIDR})"
    ]
    (patch,) = gcp.calls("firewalls.patch")
    assert patch.path.endswith(f"/global/firewalls/{SSH}")
    assert patch.body == {"sourceRanges": [MOVED]}
    after = [c.name for c in gcp.calls()][gcp.calls().index(patch) + 1 :]
    assert after[0] == "globalOperations.wait"  # waited on, like the inserts
    assert verdict(gcp.gce, "default", [TAG], MOVED_TO, "tcp", 22) == (True, SSH)
    assert verdict(gcp.gce, "default", [TAG], CALLER, "tcp", 22) == (False, DENY)

    before = mutations(gcp)
    assert ensure_firewalls(clients, moved, 60) == []
    assert mutations(gcp) == before  # reads only


def test_an_up_from_a_new_address_moves_the_ssh_rule(make: Make, gcp: StandIn) -> None:
    make().apply(make().plan(spec(nodes=2)))
    gcp.delete_instance("cloudtrain-fw1-1")
    make().apply(make().plan(spec(nodes=2, cidr=MOVED)))
    assert reaches(gcp, "cloudtrain-fw1-0", MOVED_TO, "tcp", 22) == (True, SSH)
    assert reaches(gcp, "cloudtrain-fw1-1", CALLER, "tcp", 22) == (False, DENY)
    assert [c.body for c in gcp.calls("firewalls.patch")] == [{"sourceRanges": [MOVED]}]


def test_an_up_of_a_complete_cluster_from_a_new_address_moves_the_ssh_rule(
    make: Make, gcp: StandIn
) -> None:
    make().apply(make().plan(spec()))
    make().apply(make().plan(spec(cidr=MOVED)))
    assert reaches(gcp, "cloudtrain-fw1-0", MOVED_TO, "tcp", 22) == (True, SSH)


def test_an_older_clusters_rules_are_brought_up_to_date(gcp: StandIn) -> None:
    for body in firewall_bodies("fw1", OWNER, CIDR, "default")[:2]:  # before the deny rule
        gcp.gce.add_firewall({**body, "priority": 1000})
    assert verdict(gcp.gce, "default", [TAG], STRANGER, "tcp", 22) == (True, "default-allow-ssh")
    bodies = firewall_bodies("fw1", OWNER, CIDR, "default")
    assert ensure_firewalls(Clients(), bodies, 60) == [
        f"SSH rule {SSH} now at priority 900 (was 1000)",
        f"internal rule {INTERNAL} now at priority 900 (was 1000)",
        f"deny rule {DENY} created: denies all from 0.0.0.0/0 (priority 999)",
    ]
    assert verdict(gcp.gce, "default", [TAG], STRANGER, "tcp", 22) == (False, DENY)


def test_a_disabled_deny_rule_is_enabled_again(gcp: StandIn) -> None:
    bodies = firewall_bodies("fw1", OWNER, CIDR, "default")
    ensure_firewalls(Clients(), bodies, 60)
    gcp.gce.firewalls[DENY]["disabled"] = True  # in the console
    assert verdict(gcp.gce, "default", [TAG], STRANGER, "tcp", 22) == (True, "default-allow-ssh")
    assert ensure_firewalls(Clients(), bodies, 60) == [f"deny rule {DENY} enabled again"]
    assert gcp.calls("firewalls.patch")[0].body == {"disabled": False}
    assert verdict(gcp.gce, "default", [TAG], STRANGER, "tcp", 22) == (False, DENY)


def test_a_source_someone_added_that_a_patch_cannot_remove_is_refused(gcp: StandIn) -> None:
    bodies = firewall_bodies("fw1", OWNER, CIDR, "default")
    ensure_firewalls(Clients(), bodies, 60)
    gcp.gce.firewalls[SSH]["sourceTags"] = ["bastion"]
    with pytest.raises(ProviderError, match=f"firewall-rules delete {SSH}") as err:
        ensure_firewalls(Clients(), bodies, 60)
    assert err.value.code == "FirewallDrift"
    assert "sourceTags instances tagged bastion" in str(err.value)
    assert gcp.calls("firewalls.patch") == []
