"""`up`'s fixed cost on AWS: the per-region resources made at once (and cleaned when one of
them fails), the plan's reads cached a day per region and caller, and nothing imported that
the provider does not use. Behaviour only (calls, cleanup), never timing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import access
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.providers.aws._client import Clients
from cloudtrain.providers.aws.provider import AwsProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.aws.standin import StandIn, assert_empty, put_dlami_parameter, register_dlami

REGIONS = ("us-east-1", "us-west-2")
CIDR = "203.0.113.7/32"
#: the plan's read-only calls, which a warm cache makes unnecessary
PLAN_READS = ("DescribeInstanceTypeOfferings", "GetParameter", "DescribeImages")
Make = Callable[..., AwsProvider]


@pytest.fixture
def make(aws: StandIn, tmp_path: Path) -> Make:
    """Providers over the stand-in sharing one home; each region has the DLAMI published."""
    for region in REGIONS:
        image = register_dlami(aws.client("ec2", region))
        put_dlami_parameter(aws.client("ssm", region), image)

    def build(clients: Clients | None = None, **options: Any) -> AwsProvider:
        options = {"poll_s": 0.01, "regions": REGIONS, "owner": "tester", **options}
        if clients is not None:
            options["clients"] = clients
        return AwsProvider(ProviderContext(home=tmp_path / "home", options=options))

    return build


def a100(cluster_id: str = "0123456789ab") -> ClusterSpec:
    """Two p4d nodes: a security group, a key pair and a placement group."""
    res = Resources(accelerator="A100", count=8, region="us-east-1")
    return ClusterSpec("exp1", "aws", 2, res, ssh_cidr=CIDR, cluster_id=cluster_id)


def hold(
    until: threading.Event, seen: list[bool] | None = None, *, most_s: float = 10
) -> Callable[..., None]:
    """A botocore ``before-send`` handler that holds the request until `until` is set
    (`most_s` at most; `seen` records whether it was), then lets it go (returns None)."""

    def handler(**_: Any) -> None:
        set_in_time = until.wait(most_s)
        if seen is not None:
            seen.append(set_in_time)

    return handler


def reads(aws: StandIn, since: int = 0) -> list[str]:
    return [c.action for c in aws.app.calls(service=None)[since:] if c.action in PLAN_READS]


def everywhere_empty(aws: StandIn, cluster: str = "exp1") -> None:
    for region in REGIONS:
        assert_empty(aws.client("ec2", region), cluster)


# -- the per-region resources, at once -------------------------------------------------------


def test_the_security_group_waits_for_the_key_pair_only_when_made_at_once(
    make: Make, aws: StandIn
) -> None:
    """The security group's creation is held until the key pair's import has been sent: made
    one after the other, the group would come first and the import never (the hold gives up
    after 10 s and says so)."""
    sent = threading.Event()
    overlapped: list[bool] = []
    clients = Clients()
    clients.hooks.append(("before-send.ec2.ImportKeyPair", lambda **_: sent.set()))
    clients.hooks.append(("before-send.ec2.CreateSecurityGroup", hold(sent, overlapped)))
    provider = make(clients)
    provider.apply(provider.plan(a100()))
    assert overlapped == [True]
    provider.terminate("exp1")
    everywhere_empty(aws)


CREATIONS = ["ImportKeyPair", "CreatePlacementGroup", "CreateSecurityGroup"]


@pytest.mark.parametrize("failing", [*CREATIONS, "AuthorizeSecurityGroupIngress"])
def test_one_failed_creation_leaves_nothing_of_the_others(
    make: Make, aws: StandIn, failing: str
) -> None:
    """One of the concurrent creations fails; the others are sent after its failure was
    answered (the worst order), and every one of them is answered before the attempt's
    cleanup starts (each is held until the cleanup's first call, 2 s at most: a cleanup that
    did not wait would release them and come first). The stand-in is empty after, and no
    instance was asked for."""
    aws.app.add_fault(failing, "InvalidParameterValue", "injected", status=400)
    failed, cleaning = threading.Event(), threading.Event()
    order: list[str] = []
    clients = Clients()
    clients.hooks.append((f"needs-retry.ec2.{failing}", lambda **_: failed.set()))

    def clean_starts(**_: Any) -> None:
        if failed.is_set() and not cleaning.is_set():  # DescribeInstances: `clean`'s first call
            order.append("clean")
            cleaning.set()

    clients.hooks.append(("before-send.ec2.DescribeInstances", clean_starts))
    others = set(CREATIONS) - {failing}
    if failing == "AuthorizeSecurityGroupIngress":  # the group itself is made before its rules
        others -= {"CreateSecurityGroup"}
    for other in others:
        clients.hooks.append((f"before-send.ec2.{other}", hold(cleaning, most_s=2)))
        clients.hooks.append(
            (f"needs-retry.ec2.{other}", lambda other=other, **_: order.append(other))
        )
    provider = make(clients)
    with pytest.raises(ProviderError, match="InvalidParameterValue"):
        provider.apply(provider.plan(a100()))
    assert sorted(order) == sorted([*others, "clean"])
    assert order[-1] == "clean", "every creation was answered before the cleanup began"
    assert "RunInstances" not in {c.action for c in aws.app.calls()}
    everywhere_empty(aws)


# -- the plan's reads, cached ------------------------------------------------------------------


def test_a_second_up_reads_neither_offerings_nor_the_image(make: Make, aws: StandIn) -> None:
    first = make()
    first.apply(first.plan(a100()))
    assert sorted(set(reads(aws))) == sorted(PLAN_READS)
    first.terminate("exp1")
    since = len(aws.app.calls(service=None))
    second = make()  # as a new process would be: new clients, the same home
    plan = second.plan(a100("ba9876543210"))  # `up` after `down` is a new incarnation
    second.apply(plan)
    assert reads(aws, since) == []
    runs = aws.app.calls("RunInstances")
    assert runs[-1].params["ImageId"] == runs[0].params["ImageId"] == plan.offers[0].extra["image"]
    assert plan.offers[0].zones == first.plan(a100()).offers[0].zones
    second.terminate("exp1")
    everywhere_empty(aws)


def test_another_endpoint_reads_again(make: Make, aws: StandIn, monkeypatch: Any) -> None:
    make().plan(a100())
    since = len(aws.app.calls(service=None))
    # the same server by another name: another endpoint as far as any client can tell
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws.url.replace("127.0.0.1", "localhost"))
    make().plan(a100())
    assert reads(aws, since)
    since = len(aws.app.calls(service=None))
    make().plan(a100())  # that endpoint's own answers are cached in turn
    assert reads(aws, since) == []


def test_another_profile_or_account_reads_again(
    make: Make, aws: StandIn, monkeypatch: Any, tmp_path: Path
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[a]\naws_access_key_id = AKIAAAAAAAAAAAAAAAAA\naws_secret_access_key = x\n"
        "[b]\naws_access_key_id = AKIAAAAAAAAAAAAAAAAA\naws_secret_access_key = x\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    for who in ("a", "b"):  # the same key under two profiles: each reads for itself
        since = len(aws.app.calls(service=None))
        make(profile=who).plan(a100())
        assert reads(aws, since), who
    since = len(aws.app.calls(service=None))
    make(profile="a").plan(a100())
    make(profile="b").plan(a100())
    assert reads(aws, since) == []
    # another access key (another account, or another user of it): its own reads
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIABBBBBBBBBBBBBBBB")
    make().plan(a100())
    since = len(aws.app.calls(service=None))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIACCCCCCCCCCCCCCCC")
    make().plan(a100())
    assert reads(aws, since)


def cache_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "home" / "cache" / "aws").glob("*.json"))


@pytest.mark.parametrize("damage", ["garbage", "stale", "wrong shape", "other version"])
def test_a_corrupt_or_stale_cache_is_read_again_and_replaced(
    make: Make, aws: StandIn, tmp_path: Path, damage: str
) -> None:
    good = make().plan(a100())
    (path,) = cache_files(tmp_path)  # one region asked: one file
    data = json.loads(path.read_text())
    if damage == "garbage":
        path.write_bytes(b"\x00{not json")
    elif damage == "stale":
        for entry in data["entries"].values():
            entry["at"] -= 24 * 3600 + 1
        path.write_text(json.dumps(data))
    elif damage == "wrong shape":
        data["entries"] = {name: {"at": e["at"], "value": 7} for name, e in data["entries"].items()}
        path.write_text(json.dumps(data))
    else:
        path.write_text(json.dumps({**data, "version": 0}))
    since = len(aws.app.calls(service=None))
    again = make().plan(a100())
    assert sorted(set(reads(aws, since))) == sorted(PLAN_READS)
    assert again.offers == good.offers
    since = len(aws.app.calls(service=None))
    make().plan(a100())
    assert reads(aws, since) == [], "the damaged file was replaced"


def test_an_image_that_is_gone_drops_the_region_s_answers(make: Make, aws: StandIn) -> None:
    provider = make()
    plan = provider.plan(a100())
    aws.app.add_fault("RunInstances", "InvalidAMIID.NotFound", "no such image", status=400)
    with pytest.raises(ProviderError, match="InvalidAMIID"):
        provider.apply(plan)
    everywhere_empty(aws)
    since = len(aws.app.calls(service=None))
    make().plan(a100())
    assert "DescribeImages" in reads(aws, since)


# -- imports -------------------------------------------------------------------------------------


def test_the_provider_imports_no_sdk_and_no_ssh_until_used() -> None:
    code = (
        "import sys, cloudtrain.providers.aws.provider\n"
        "print(sorted(m for m in ('boto3', 'botocore', 'jinja2', 'cloudtrain.executors.ssh',"
        " 'concurrent.futures') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# -- a new cluster's resources, made without a look first ---------------------------------------


def test_a_new_cluster_s_resources_are_made_without_a_look_first(make: Make, aws: StandIn) -> None:
    """`holders` saw no group of the name: the group, key pair and placement group are created
    at once (no describe of each, no default VPC read); a second `up` of the complete cluster
    looks first and creates nothing."""
    provider = make()
    plan = provider.plan(a100())
    since = len(aws.app.calls(service=None))
    provider.apply(plan)
    made = [c.action for c in aws.app.calls(service=None)[since:] if c.region == "us-east-1"]
    assert not {"DescribeVpcs", "DescribeKeyPairs", "DescribePlacementGroups"} & set(made)
    assert made.count("DescribeSecurityGroups") == 1, "only `holders`' own"
    assert {"CreateSecurityGroup", "ImportKeyPair", "CreatePlacementGroup"} <= set(made)
    since = len(aws.app.calls(service=None))
    make().apply(plan)
    again = [c.action for c in aws.app.calls(service=None)[since:]]
    assert not [a for a in again if a.startswith(("Create", "Import", "Run", "Authorize"))]
    provider.terminate("exp1")
    everywhere_empty(aws)


def made_meanwhile(aws: StandIn, cluster_id: str, home: Path) -> Callable[..., None]:
    """A ``before-send`` handler for the first CreateSecurityGroup: another `up` of the cluster
    incarnation `cluster_id` makes its group first (after this one's `holders` saw none), and
    when it is this one's incarnation, its key pair and placement group too (this one's may be
    made already: that `up` then finds them)."""
    done: list[bool] = []

    def handler(**_: Any) -> None:
        if done:
            return
        done.append(True)
        from cloudtrain.providers.aws import _resources as res

        ec2 = aws.client("ec2", "us-east-1")
        scope = res.Scope("exp1", "tester", cluster_id)
        res.ensure_security_group(ec2, scope, CIDR)
        if cluster_id == a100().cluster_id:
            res.ensure_key_pair(ec2, scope, access.cluster_key(home, "exp1")[1])
            res.ensure_placement_group(ec2, scope)

    return handler


def test_resources_made_meanwhile_by_the_same_cluster_are_used(
    make: Make, aws: StandIn, tmp_path: Path
) -> None:
    clients = Clients()
    clients.hooks.append(
        (
            "before-send.ec2.CreateSecurityGroup",
            made_meanwhile(aws, str(a100().cluster_id), tmp_path / "other"),
        )
    )
    provider = make(clients)
    nodes = provider.apply(provider.plan(a100()))
    assert len(nodes) == 2
    ec2 = aws.client("ec2", "us-east-1")
    named = [{"Name": "group-name", "Values": ["cloudtrain-exp1"]}]
    assert len(ec2.describe_security_groups(Filters=named)["SecurityGroups"]) == 1
    assert len(ec2.describe_key_pairs()["KeyPairs"]) == 1
    assert len(aws.app.calls("RunInstances")) == 1
    provider.terminate("exp1")
    everywhere_empty(aws)


def test_another_incarnation_s_resources_made_meanwhile_stop_the_up(
    make: Make, aws: StandIn, tmp_path: Path
) -> None:
    """The name was taken between `holders` and the create: the error says so, no instance is
    asked for, and nothing of this incarnation is left (the other's is its own)."""
    clients = Clients()
    clients.hooks.append(
        (
            "before-send.ec2.CreateSecurityGroup",
            made_meanwhile(aws, "feedfeedfeed", tmp_path / "other"),
        )
    )
    provider = make(clients)
    with pytest.raises(ConfigError, match="taken on aws just now"):
        provider.apply(provider.plan(a100()))
    assert not aws.app.calls("RunInstances")
    make(owner="tester").terminate("exp1", "feedfeedfeed")
    everywhere_empty(aws)


def test_a_region_without_a_default_vpc_says_so_and_leaves_nothing(
    make: Make, aws: StandIn
) -> None:
    """EC2 answers a group made with no ``VpcId`` in a region with no default VPC this way
    (moto always has one: the answer is injected)."""
    aws.app.add_fault(
        "CreateSecurityGroup", "VPCIdNotSpecified", "No default VPC for this user", status=400
    )
    provider = make()
    with pytest.raises(ProviderError, match="no default VPC; create one"):
        provider.apply(provider.plan(a100()))
    assert not aws.app.calls("RunInstances")
    everywhere_empty(aws)
