"""The AWS provider through real boto3 against the local stand-in (moto's server + shims)."""

from __future__ import annotations

import base64
import gzip
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import AuthError, CapacityError, ConfigError, ProviderError, QuotaError
from cloudtrain.executors.ssh import SshExecutor
from cloudtrain.model import Event
from cloudtrain.providers.aws._client import Clients
from cloudtrain.providers.aws._instances import compact, expand
from cloudtrain.providers.aws.provider import AwsProvider, client_token
from cloudtrain.provision.engine import Engine
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.aws.standin import StandIn, assert_empty, leftovers, put_dlami_parameter, register_dlami

REGIONS = ("us-east-1", "us-west-2", "eu-west-1")
CIDR = "203.0.113.7/32"
Make = Callable[..., AwsProvider]


@pytest.fixture
def make(aws: StandIn, tmp_path: Path) -> Make:
    """Providers over the stand-in; each region has the Deep Learning AMI published."""
    for region in REGIONS:
        image = register_dlami(aws.client("ec2", region))
        put_dlami_parameter(aws.client("ssm", region), image)

    def build(clients: Clients | None = None) -> AwsProvider:
        options: dict[str, Any] = {"poll_s": 0.01, "regions": REGIONS, "owner": "tester"}
        if clients is not None:
            options["clients"] = clients
        return AwsProvider(ProviderContext(home=tmp_path / "home", options=options))

    return build


#: the id `up` would have given these clusters' records
CLUSTER_ID = "0123456789ab"


def a100(nodes: int = 4, **resources: Any) -> ClusterSpec:
    res = Resources(accelerator="A100", count=8, **resources)
    return ClusterSpec("exp1", "aws", nodes, res, ssh_cidr=CIDR, cluster_id=CLUSTER_ID)


def v100(nodes: int = 1, **resources: Any) -> ClusterSpec:
    res = Resources(accelerator="V100", count=1, **resources)
    return ClusterSpec("small", "aws", nodes, res, ssh_cidr=CIDR, cluster_id=CLUSTER_ID)


def mutations(aws: StandIn) -> list[str]:
    """The provider's mutating calls (the fixture's RegisterImage is the test's own)."""
    reads = ("Describe", "Get", "RegisterImage")
    return [c.action for c in aws.app.calls(service=None) if not c.action.startswith(reads)]


def everywhere_empty(aws: StandIn, cluster: str) -> None:
    for region in REGIONS:
        assert_empty(aws.client("ec2", region), cluster)


def test_batch_tags_round_trip() -> None:
    assert compact([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert expand("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    assert compact(range(1000)) == "0-999"


def test_plan_reads_offerings_and_the_dlami_and_changes_nothing(make: Make, aws: StandIn) -> None:
    plan = make().plan(a100())
    assert [o.instance_type for o in plan.offers] == ["p4d.24xlarge"] * 3
    assert [o.region for o in plan.offers] == ["us-east-1", "us-west-2", "eu-west-1"]
    assert plan.offers[0].zones == ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d",
                                    "us-east-1f")  # fmt: skip
    assert plan.offers[0].extra["image"].startswith("ami-")
    assert plan.price_per_hour == pytest.approx(4 * 32.7726)
    request = plan.requests[0]["RunInstances"]
    assert request["MinCount"] == request["MaxCount"] == 4
    assert mutations(aws) == []


def test_apply_makes_a_gang_in_one_call_with_the_exact_request(make: Make, aws: StandIn) -> None:
    events: list[Event] = []
    nodes = make().apply(make().plan(a100()), events.append)
    assert [n.index for n in nodes] == [0, 1, 2, 3]
    assert {n.state for n in nodes} == {"running"}
    assert all(n.private_ip for n in nodes)
    assert {n.zone for n in nodes} == {"us-east-1a"}
    made = mutations(aws)  # the region's resources are made at once, in no fixed order
    assert sorted(made[:4]) == ["AuthorizeSecurityGroupIngress", "CreatePlacementGroup",
                                "CreateSecurityGroup", "ImportKeyPair"]  # fmt: skip
    assert made.index("CreateSecurityGroup") < made.index("AuthorizeSecurityGroupIngress")
    assert made[4:] == ["RunInstances", "AllocateAddress", "AssociateAddress"]
    run = aws.app.calls("RunInstances")[0]
    p = run.params
    assert (p["MinCount"], p["MaxCount"]) == ("4", "4")
    assert p["ClientToken"] == client_token(CLUSTER_ID, "tester", "us-east-1a", [0, 1, 2, 3])
    assert p["KeyName"] == f"cloudtrain-exp1-{CLUSTER_ID}"
    assert len(p["ClientToken"]) <= 64
    assert p["InstanceType"] == "p4d.24xlarge"
    assert p["MetadataOptions.HttpTokens"] == "required"
    assert p["InstanceInitiatedShutdownBehavior"] == "terminate"
    # no credential on a node: it stops itself by powering off, which needs none
    assert not [k for k in p if k.startswith("IamInstanceProfile")]
    assert p["BlockDeviceMapping.1.Ebs.Encrypted"] == "true"
    assert p["BlockDeviceMapping.1.Ebs.VolumeType"] == "gp3"
    assert p["BlockDeviceMapping.1.Ebs.VolumeSize"] == "200"
    assert p["Placement.AvailabilityZone"] == "us-east-1a"
    assert p["Placement.GroupName"] == "cloudtrain-exp1"
    efa = run.indexed("NetworkInterface")
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in efa] == [
        ("0", "0", "efa"), ("1", "1", "efa"), ("2", "1", "efa"), ("3", "1", "efa")
    ]  # fmt: skip
    kinds = {p[k] for k in p if k.startswith("TagSpecification.") and k.endswith("ResourceType")}
    assert kinds == {"instance", "volume", "network-interface"}
    assert "InstanceMarketOptions.MarketType" not in p
    assert [e.kind for e in events].count("attempt") == 1

    ec2 = aws.client("ec2")
    group = ec2.describe_security_groups(GroupNames=["cloudtrain-exp1"])["SecurityGroups"][0]
    rules = {
        (r["IpProtocol"], r.get("FromPort"), r.get("ToPort")): r for r in group["IpPermissions"]
    }
    assert set(rules) == {("tcp", 22, 22), ("-1", None, None)}
    assert [r["CidrIp"] for r in rules[("tcp", 22, 22)]["IpRanges"]] == [CIDR]
    assert rules[("tcp", 22, 22)]["UserIdGroupPairs"] == []
    assert [g["GroupId"] for g in rules[("-1", None, None)]["UserIdGroupPairs"]] == [
        group["GroupId"]
    ]
    assert rules[("-1", None, None)]["IpRanges"] == []


def test_multi_card_nodes_are_reached_through_the_head_s_elastic_ip(
    make: Make, aws: StandIn
) -> None:
    """p4d has 4 network cards: EC2 gives it no public IPv4, so the head gets an Elastic IP
    and the other nodes are reached through it with the same key and pinned host keys."""
    provider = make()
    nodes = provider.apply(provider.plan(a100(nodes=3)))
    (address,) = aws.client("ec2").describe_addresses(
        Filters=[{"Name": "tag:cloudtrain:cluster", "Values": ["exp1"]}]
    )["Addresses"]
    assert nodes[0].public_ip == address["PublicIp"]
    assert address["NetworkInterfaceId"] == nodes[0].extra["interface"]
    assert [n.public_ip for n in nodes[1:]] == [None, None]
    assert {n.jump for n in nodes[1:]} == {address["PublicIp"]}
    pinned = (provider.home / "keys" / "exp1" / "known_hosts").read_text().split()
    assert {address["PublicIp"], *(n.private_ip for n in nodes)} <= set(pinned)
    head, other = provider.executor(nodes[0]), provider.executor(nodes[2])
    assert isinstance(head, SshExecutor)
    assert isinstance(other, SshExecutor)
    assert head.host == address["PublicIp"]
    assert "ProxyCommand" not in " ".join(head._options)
    assert other.host == nodes[2].private_ip
    proxy = next(o for o in other._options if o.startswith("ProxyCommand="))
    assert proxy.endswith(f"-W %h:%p -- cloudtrain@{address['PublicIp']}")
    assert "StrictHostKeyChecking=yes" in proxy
    assert "known_hosts" in proxy
    assert provider.apply(provider.plan(a100(nodes=3))) == provider.describe("exp1")
    assert len(aws.app.calls("AllocateAddress")) == 1, "a second up re-uses the address"
    provider.terminate("exp1")
    everywhere_empty(aws, "exp1")


def test_secrets_stay_home_and_the_key_is_0600(make: Make, aws: StandIn, tmp_path: Path) -> None:
    make().apply(make().plan(v100()))
    keys = tmp_path / "home" / "keys" / "small"
    private = keys / "id_ed25519"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    raw = base64.b64decode(aws.app.calls("RunInstances")[0].params["UserData"])
    user_data = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
    assert user_data.startswith("#cloud-config")
    assert (keys / "id_ed25519.pub").read_text().strip() in user_data
    assert (keys / "ssh_host_ed25519_key.pub").read_text().strip() in user_data  # pinned later
    secret = "".join(private.read_text().splitlines()[1:-1])[80:140]  # the key's random part
    for leak in (secret, "testing", "AWS_SECRET"):
        assert leak not in user_data.replace("\n", "")
    every_param = " ".join(v for c in aws.app.calls(service=None) for v in c.params.values())
    assert secret not in every_param


def test_single_v100_uses_no_placement_group_and_no_efa(make: Make, aws: StandIn) -> None:
    make().apply(make().plan(v100(spot=True, disk_gb=50)))
    p = aws.app.calls("RunInstances")[0].params
    assert p["InstanceType"] == "p3.2xlarge"
    assert "Placement.GroupName" not in p
    assert not aws.app.calls("RunInstances")[0].indexed("NetworkInterface")
    assert p["SecurityGroupId.1"].startswith("sg-")
    assert p["InstanceMarketOptions.MarketType"] == "spot"
    assert p["BlockDeviceMapping.1.Ebs.VolumeSize"] == "50"
    assert "CreatePlacementGroup" not in mutations(aws)


def test_capacity_errors_fail_over_zone_by_zone_then_region(make: Make, aws: StandIn) -> None:
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f",
                 "us-west-2a"):  # fmt: skip
        aws.app.add_fault("RunInstances", "InsufficientInstanceCapacity", zone=zone)
    events: list[Event] = []
    nodes = make().apply(make().plan(a100(nodes=2)), events.append)
    assert {n.zone for n in nodes} == {"us-west-2b"}
    capacity = [e.message for e in events if e.kind == "capacity"]
    assert capacity == [
        f"{z[:-1]}/{z}: InsufficientInstanceCapacity; trying the next zone"
        for z in (
            "us-east-1a",
            "us-east-1b",
            "us-east-1c",
            "us-east-1d",
            "us-east-1f",
            "us-west-2a",
        )
    ]
    assert_empty(aws.client("ec2", "us-east-1"), "exp1")  # the failed region was cleaned


@pytest.mark.parametrize(
    "code", ["InsufficientCapacity", "Unsupported", "SpotMaxPriceTooLow",
             "InsufficientFreeAddressesInSubnet"],
)  # fmt: skip
def test_every_capacity_code_moves_on(make: Make, aws: StandIn, code: str) -> None:
    aws.app.add_fault("RunInstances", code, zone="us-east-1a", status=400)
    nodes = make().apply(make().plan(v100()))
    assert nodes[0].zone == "us-east-1b"


def test_no_capacity_anywhere_says_so_and_leaves_nothing(make: Make, aws: StandIn) -> None:
    aws.app.add_fault("RunInstances", "InsufficientInstanceCapacity")
    with pytest.raises(CapacityError) as err:
        make().apply(make().plan(a100(nodes=2)))
    assert "us-east-1/us-east-1a: InsufficientInstanceCapacity" in str(err.value)
    assert "eu-west-1/eu-west-1c: InsufficientInstanceCapacity" in str(err.value)
    assert str(err.value).count("InsufficientInstanceCapacity") == 12
    everywhere_empty(aws, "exp1")


@pytest.mark.parametrize(
    ("code", "error", "hint"),
    [
        ("VcpuLimitExceeded", QuotaError, "L-417A185B"),
        ("MaxSpotInstanceCountExceeded", QuotaError, "L-7212CCBC"),
        ("UnauthorizedOperation", AuthError, "sts get-caller-identity"),
        ("AuthFailure", AuthError, "Check the credentials"),
    ],
)
def test_quota_and_auth_errors_stop_at_once_and_leave_nothing(
    make: Make, aws: StandIn, code: str, error: type[Exception], hint: str
) -> None:
    aws.app.add_fault("RunInstances", code, status=400)
    with pytest.raises(error, match=hint):
        make().apply(make().plan(a100(nodes=2)))
    assert len(aws.app.calls("RunInstances")) == 1
    everywhere_empty(aws, "exp1")


def test_resume_creates_only_what_is_missing(make: Make, aws: StandIn) -> None:
    provider = make()
    plan = provider.plan(a100(nodes=4))
    first = provider.apply(plan)
    aws.client("ec2").terminate_instances(InstanceIds=[first[1].node_id, first[3].node_id])
    again = provider.apply(plan)
    assert [n.index for n in again] == [0, 1, 2, 3]
    assert {n.node_id for n in again} >= {first[0].node_id, first[2].node_id}
    second = aws.app.calls("RunInstances")[1].params
    assert (second["MinCount"], second["MaxCount"]) == ("2", "2")
    assert second["Placement.AvailabilityZone"] == first[0].zone
    assert provider.apply(plan) == provider.describe("exp1")  # complete: no call
    assert len(aws.app.calls("RunInstances")) == 2
    with pytest.raises(ConfigError, match="has 4 nodes, more than the 2 asked for"):
        provider.apply(provider.plan(a100(nodes=2)))


def test_terminate_finds_everything_by_tag_and_is_idempotent(make: Make, aws: StandIn) -> None:
    make().apply(make().plan(a100(nodes=2)))
    fresh = make()  # no state: only the cloud's tags
    assert [n.index for n in fresh.describe("exp1")] == [0, 1]
    assert fresh.clusters() == ["exp1"]
    fresh.terminate("exp1")
    everywhere_empty(aws, "exp1")
    assert fresh.describe("exp1") == []
    assert fresh.clusters() == []
    fresh.terminate("exp1")


class Crash(Exception):
    """Stands for the process dying right after a call succeeded."""


MUTATING = ["CreateSecurityGroup", "AuthorizeSecurityGroupIngress", "ImportKeyPair",
            "CreatePlacementGroup", "RunInstances", "AllocateAddress",
            "AssociateAddress"]  # fmt: skip


AFTER_THE_NODES = ("RunInstances", "AllocateAddress", "AssociateAddress")


@pytest.mark.parametrize("how", ["raised", "killed"])
@pytest.mark.parametrize("operation", MUTATING)
def test_a_crash_after_any_mutating_call_leaves_nothing_down_cannot_find(
    make: Make, aws: StandIn, operation: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash of an unmapped kind right after each mutating call: an exception (the
    attempt's cleanup runs in `finally`) or a kill (it does not): `terminate` from a fresh
    provider, with no local state, leaves the stand-in empty."""
    clients = Clients()

    def crash(**_: Any) -> None:
        raise Crash(operation)

    clients.hooks.append((f"after-call.ec2.{operation}", crash))
    if how == "killed":  # no `finally` runs in a killed process: the attempt's cleanup neither
        monkeypatch.setattr(Engine, "_clean", lambda *_: None)
    with pytest.raises(Crash):
        make(clients).apply(make().plan(a100(nodes=2)))
    left = any(leftovers(aws.client("ec2"), "exp1").values())
    if how == "killed" or operation in AFTER_THE_NODES:
        assert left, "the crash left something for `down` to find"
    else:
        assert not left, "the failed attempt cleaned up after itself"
    make().terminate("exp1")
    everywhere_empty(aws, "exp1")
    made = [m for m in mutations(aws) if m in MUTATING]
    if operation in AFTER_THE_NODES:
        assert made[-1] == operation, "the crash came right after the call under test"
    else:  # the region's resources are made at once: the crash stops the nodes being asked
        assert operation in made
        assert "RunInstances" not in made


def test_nodes_of_a_stand_in_are_never_sent_ssh(
    make: Make, aws: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the test tier's CLOUDTRAIN_SSH_LOOPBACK_ONLY, a provider pointed at an endpoint
    on this machine still refuses SSH to the addresses the stand-in invents (moto's 54.x)."""
    monkeypatch.delenv("CLOUDTRAIN_SSH_LOOPBACK_ONLY")
    provider = make()
    (node,) = provider.apply(provider.plan(v100()))
    assert node.public_ip
    assert not node.public_ip.startswith("127.")
    with pytest.raises(ProviderError, match="endpoint is a local stand-in"):
        provider.executor(node).run(["true"])
    provider.terminate("small")
