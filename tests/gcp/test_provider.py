"""The GCP provider through the real google-cloud-compute client against the local stand-in."""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import AuthError, CapacityError, ConfigError, QuotaError
from cloudtrain.model import Event
from cloudtrain.providers.gcp._client import Clients
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.provision.engine import Engine
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.gcp.standin import StandIn

CIDR = "203.0.113.7/32"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")
MUTATING = (
    "instances.bulkInsert",
    "instances.delete",
    "firewalls.insert",
    "firewalls.delete",
    "resourcePolicies.insert",
    "resourcePolicies.delete",
)
Make = Callable[..., GcpProvider]


@pytest.fixture
def make(gcp: StandIn, tmp_path: Path) -> Make:
    def build(clients: Clients | None = None, **options: Any) -> GcpProvider:
        opts: dict[str, Any] = {"poll_s": 0.01, "owner": "tester@host.example", **options}
        if clients is not None:
            opts["clients"] = clients
        return GcpProvider(ProviderContext(home=tmp_path / "home", options=opts))

    return build


def a100(nodes: int = 2, **resources: Any) -> ClusterSpec:
    return ClusterSpec(
        "exp1", "gcp", nodes, Resources(accelerator="A100", count=8, **resources), ssh_cidr=CIDR
    )


def v100(nodes: int = 1, extra: dict[str, Any] | None = None, **resources: Any) -> ClusterSpec:
    return ClusterSpec(
        "small",
        "gcp",
        nodes,
        Resources(accelerator="V100", count=1, **resources),
        ssh_cidr=CIDR,
        extra=extra or {},
    )


def mutations(gcp: StandIn) -> list[str]:
    return [c.name for c in gcp.calls() if c.name in MUTATING]


def bulk(gcp: StandIn, n: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = gcp.calls("instances.bulkInsert")[n].body
    return body


def metadata(body: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in body["instanceProperties"]["metadata"]["items"]}


@pytest.mark.parametrize(
    ("gpus", "machine", "attached", "zones"),
    [
        (
            "V100:1",
            "n1-highmem-8",
            [{"acceleratorType": "nvidia-tesla-v100", "acceleratorCount": 1}],
            ZONES,
        ),
        (
            "V100:8",
            "n1-highmem-64",
            [{"acceleratorType": "nvidia-tesla-v100", "acceleratorCount": 8}],
            ZONES,
        ),
        ("A100:8", "a2-highgpu-8g", None, ZONES),
        ("A100:16", "a2-megagpu-16g", None, ZONES),
        ("A100-80GB:8", "a2-ultragpu-8g", None, ("us-central1-a", "us-central1-c")),
    ],
)
def test_plan_shapes_from_the_catalog_and_changes_nothing(
    make: Make, gcp: StandIn, gpus: str, machine: str, attached: Any, zones: tuple[str, ...]
) -> None:
    name, _, count = gpus.partition(":")
    spec = ClusterSpec("c1", "gcp", 1, Resources(accelerator=name, count=int(count)), ssh_cidr=CIDR)
    plan = make().plan(spec)
    assert plan.offers[0].zones == zones
    body = plan.requests[-1]["instances.bulkInsert"]
    props = body["instanceProperties"]
    assert props["machineType"] == machine
    assert props.get("guestAccelerators") == attached
    assert props["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert metadata(body)["user-data"].startswith("<")  # elided in the dry run
    assert mutations(gcp) == []
    assert {c.name for c in gcp.calls()} == {"acceleratorTypes.aggregatedList"}


def test_plan_keeps_only_zones_that_offer_the_accelerator(make: Make, gcp: StandIn) -> None:
    del gcp.gce.zones["us-central1-b"]["nvidia-tesla-v100"]
    gcp.gce.zones["us-central1-f"]["nvidia-tesla-v100"] = 4  # too few cards for V100:8
    assert make().plan(v100()).offers[0].zones == (
        "us-central1-a",
        "us-central1-c",
        "us-central1-f",
    )
    spec = ClusterSpec("c1", "gcp", 1, Resources(accelerator="V100", count=8), ssh_cidr=CIDR)
    assert make().plan(spec).offers[0].zones == ("us-central1-a", "us-central1-c")
    for zone in ZONES:
        gcp.gce.zones[zone].pop("nvidia-tesla-v100", None)
    with pytest.raises(ConfigError, match="nvidia-tesla-v100 × 1 in no catalog zone"):
        make().plan(v100())


def test_bad_max_hours_is_refused_before_any_call(make: Make, gcp: StandIn) -> None:
    with pytest.raises(ConfigError, match="max_hours 'soon': give hours between"):
        make().plan(v100(extra={"max_hours": "soon"}))
    assert gcp.calls() == []


def test_multi_node_a100_gang_in_one_call_with_the_exact_request(make: Make, gcp: StandIn) -> None:
    events: list[Event] = []
    nodes = make().apply(make().plan(a100()), events.append)
    assert [n.index for n in nodes] == [0, 1]
    assert {n.state for n in nodes} == {"running"}
    assert all(n.private_ip and n.public_ip for n in nodes)
    assert {n.zone for n in nodes} == {"us-central1-a"}
    assert {n.instance_type for n in nodes} == {"a2-highgpu-8g"}
    assert mutations(gcp) == [
        "firewalls.insert",
        "firewalls.insert",
        "firewalls.insert",
        "resourcePolicies.insert",
        "instances.bulkInsert",
    ]
    body = bulk(gcp)
    assert (body["count"], body["minCount"]) == ("2", "2")
    assert sorted(body["perInstanceProperties"]) == ["cloudtrain-exp1-0", "cloudtrain-exp1-1"]
    props = body["instanceProperties"]
    assert props["labels"] == {
        "cloudtrain-cluster": "exp1",
        "cloudtrain-owner": "tester_40host_2eexample",
    }
    assert props["tags"]["items"] == ["cloudtrain-exp1"]
    assert props["networkInterfaces"][0]["nicType"] == "GVNIC"
    assert props["networkInterfaces"][0]["accessConfigs"] == [
        {"type": "ONE_TO_ONE_NAT", "name": "External NAT"}
    ]
    assert props["resourcePolicies"] == ["cloudtrain-exp1"]
    assert props["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": True}
    disk = props["disks"][0]
    assert (disk["boot"], disk["autoDelete"], disk["initializeParams"]["diskSizeGb"]) == (
        True,
        True,
        "200",
    )
    assert "serviceAccounts" not in props  # no credentials on the nodes
    meta = metadata(body)
    assert meta["enable-oslogin"] == "FALSE"
    assert meta["ssh-keys"].startswith("cloudtrain:ssh-ed25519 ")
    assert meta["user-data"].startswith("#cloud-config")
    assert meta["startup-script"].startswith("#!/bin/bash")
    policy = gcp.calls("resourcePolicies.insert")[0]
    assert policy.path.endswith("/regions/us-central1/resourcePolicies")
    assert policy.body["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    ssh, internal, _deny = (c.body for c in gcp.calls("firewalls.insert"))
    assert ssh["sourceRanges"] == [CIDR]
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh["targetTags"] == ["cloudtrain-exp1"]
    assert "sourceTags" not in ssh
    assert internal["sourceTags"] == internal["targetTags"] == ["cloudtrain-exp1"]
    assert internal["allowed"] == [{"IPProtocol": "all"}]
    assert "sourceRanges" not in internal
    assert [e.kind for e in events].count("attempt") == 1


def test_single_spot_v100_with_max_hours(make: Make, gcp: StandIn) -> None:
    spec = v100(extra={"max_hours": 2.5}, spot=True, disk_gb=50)
    node = make().apply(make().plan(spec))[0]
    assert node.extra["spot"] is True
    assert node.extra["guest_accelerators"] == "nvidia-tesla-v100:1"
    props = bulk(gcp)["instanceProperties"]
    assert props["machineType"] == "n1-highmem-8"
    assert props["guestAccelerators"] == [
        {"acceleratorType": "nvidia-tesla-v100", "acceleratorCount": 1}
    ]
    assert props["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "9000"},
    }
    assert props["disks"][0]["initializeParams"]["diskSizeGb"] == "50"
    assert "nicType" not in props["networkInterfaces"][0]
    assert "resourcePolicies" not in props
    assert "resourcePolicies.insert" not in mutations(gcp)


def test_secrets_stay_home(make: Make, gcp: StandIn, tmp_path: Path) -> None:
    make().apply(make().plan(v100()))
    keys = tmp_path / "home" / "keys" / "small"
    private = keys / "id_ed25519"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    meta = metadata(bulk(gcp))
    assert (keys / "id_ed25519.pub").read_text().strip() in meta["ssh-keys"]
    secret = "".join(private.read_text().splitlines()[1:-1])[80:140]
    account_key = "".join(gcp.private_key.splitlines()[1:-1])[80:140]
    sent = " ".join(str(c.body) + str(c.query) for c in gcp.calls())
    for leak in (secret, account_key, "PRIVATE KEY-----\\n" + account_key[:10]):
        assert leak not in sent
    assert "BEGIN PRIVATE KEY" not in sent  # the service account's PKCS8 key


def test_every_request_polling_included_goes_to_the_endpoint(
    make: Make, gcp: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    import requests

    sent: list[str] = []
    real = requests.Session.send

    def record(self: requests.Session, request: requests.PreparedRequest, **kw: Any) -> Any:
        sent.append(str(request.url))
        return real(self, request, **kw)

    monkeypatch.setattr(requests.Session, "send", record)
    make().apply(make().plan(a100()))
    make().terminate("exp1")
    assert sent
    assert all(url.startswith(f"{gcp.url}/") for url in sent)
    polls = {c.name for c in gcp.calls() if "Operations" in c.name}
    assert polls == {"zoneOperations.wait", "regionOperations.wait", "globalOperations.wait"}
    assert {c.host for c in gcp.calls()} == {gcp.url.removeprefix("http://")}
    assert len(sent) == len(gcp.calls())


CAPACITY = [
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "UNSUPPORTED_OPERATION",
]


@pytest.mark.parametrize("code", CAPACITY)
@pytest.mark.parametrize("in_operation", [False, True], ids=["in-answer", "in-operation"])
def test_capacity_errors_move_to_the_next_zone(
    make: Make, gcp: StandIn, code: str, in_operation: bool
) -> None:
    gcp.add_fault("instances.bulkInsert", code, zone="us-central1-a", in_operation=in_operation)
    gcp.add_fault("instances.bulkInsert", code, zone="us-central1-b", in_operation=not in_operation)
    events: list[Event] = []
    nodes = make().apply(make().plan(a100()), events.append)
    assert {n.zone for n in nodes} == {"us-central1-c"}
    assert [e.message for e in events if e.kind in ("attempt", "capacity")] == [
        "us-central1/us-central1-a: creating 2 × a2-highgpu-8g",
        f"us-central1/us-central1-a: {code}; trying the next zone",
        "us-central1/us-central1-b: creating 2 × a2-highgpu-8g",
        f"us-central1/us-central1-b: {code}; trying the next zone",
        "us-central1/us-central1-c: creating 2 × a2-highgpu-8g",
    ]
    assert gcp.leftovers("exp1")["instances"] == ["cloudtrain-exp1-0", "cloudtrain-exp1-1"]


def test_what_a_failed_gang_left_in_a_zone_is_deleted(make: Make, gcp: StandIn) -> None:
    gcp.add_fault(
        "instances.bulkInsert",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        zone="us-central1-a",
        in_operation=True,
        partial=1,
    )
    nodes = make().apply(make().plan(a100()))
    assert {n.zone for n in nodes} == {"us-central1-b"}
    assert len(gcp.calls("instances.delete")) == 1
    assert [k for k in gcp.gce.instances if k[0] == "us-central1-a"] == []


def test_no_capacity_anywhere_says_so_and_leaves_nothing(make: Make, gcp: StandIn) -> None:
    gcp.add_fault("instances.bulkInsert", "ZONE_RESOURCE_POOL_EXHAUSTED", in_operation=True)
    with pytest.raises(CapacityError) as err:
        make().apply(make().plan(a100()))
    assert str(err.value) == (
        "gcp: NoCapacity: no zone had 2 × a2-highgpu-8g: "
        + "; ".join(f"us-central1/{z}: ZONE_RESOURCE_POOL_EXHAUSTED" for z in ZONES)
        + "; nothing of the cluster was left behind"
    )
    assert gcp.is_empty()


@pytest.mark.parametrize("in_operation", [False, True], ids=["in-answer", "in-operation"])
def test_quota_errors_stop_at_once_name_the_quota_and_leave_nothing(
    make: Make, gcp: StandIn, in_operation: bool
) -> None:
    gcp.add_fault(
        "instances.bulkInsert",
        "QUOTA_EXCEEDED",
        in_operation=in_operation,
        quota="GPUS_ALL_REGIONS",
    )
    with pytest.raises(QuotaError, match="Raise the GPUS_ALL_REGIONS quota") as err:
        make().apply(make().plan(a100()))
    assert err.value.code == "QUOTA_EXCEEDED"
    assert len(gcp.calls("instances.bulkInsert")) == 1
    assert gcp.is_empty()


def test_a_quota_error_on_the_firewall_also_leaves_nothing(make: Make, gcp: StandIn) -> None:
    gcp.add_fault("firewalls.insert", "QUOTA_EXCEEDED", quota="FIREWALLS", times=1)
    gcp.calls()
    with pytest.raises(QuotaError, match="FIREWALLS"):
        make().apply(make().plan(v100()))
    assert gcp.calls("instances.bulkInsert") == []
    assert gcp.is_empty()


@pytest.mark.parametrize(
    ("call", "status", "code"),
    [
        ("instances.bulkInsert", 403, "forbidden"),
        ("firewalls.insert", 403, "forbidden"),
        ("*", 401, "authError"),
    ],
)
def test_auth_errors_stop_at_once(
    make: Make, gcp: StandIn, call: str, status: int, code: str
) -> None:
    plan = make().plan(v100())
    gcp.add_fault(call, code, status=status)
    with pytest.raises(AuthError, match="Check the credentials"):
        make().apply(plan)
    gcp.faults.clear()
    assert gcp.is_empty()


def test_missing_credentials_and_project_are_clear_errors(
    make: Make, gcp: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT")
    assert make().clients.project == "standin-project"  # the credentials' own project
    assert make(project="other").clients.project == "other"
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    assert make().clients.project == "from-env"
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("HOME", str(Path(gcp.credentials_file).parent / "nohome"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(Path(gcp.credentials_file).parent / "nogcloud"))
    with pytest.raises(AuthError, match="gcloud auth application-default login"):
        make().plan(v100())


def test_no_project_anywhere_is_a_config_error_before_any_call(
    make: Make, gcp: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.auth.credentials import AnonymousCredentials

    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT")
    clients = Clients(credentials=AnonymousCredentials())  # credentials that name no project
    with pytest.raises(ConfigError, match="no GCP project: pass --project"):
        make(clients).plan(v100())
    assert gcp.calls() == []


def test_resume_creates_only_what_is_missing(make: Make, gcp: StandIn) -> None:
    provider = make()
    plan = provider.plan(a100(nodes=4))
    first = provider.apply(plan)
    for index in (1, 3):
        gcp.delete_instance(f"cloudtrain-exp1-{index}")
    again = provider.apply(plan)
    assert [n.index for n in again] == [0, 1, 2, 3]
    assert {n.node_id for n in again} >= {first[0].node_id, first[2].node_id}
    second = bulk(gcp, 1)
    assert sorted(second["perInstanceProperties"]) == ["cloudtrain-exp1-1", "cloudtrain-exp1-3"]
    assert gcp.calls("instances.bulkInsert")[1].zone == "us-central1-a"
    assert provider.apply(plan) == provider.describe("exp1")  # complete: no call
    assert len(gcp.calls("instances.bulkInsert")) == 2
    with pytest.raises(ConfigError, match="has 4 nodes, more than the 2 asked for"):
        provider.apply(provider.plan(a100(nodes=2)))


def test_terminate_finds_everything_by_label_and_is_idempotent(make: Make, gcp: StandIn) -> None:
    make().apply(make().plan(a100(nodes=5)))  # 5 nodes: more than one page of every list
    fresh = make()  # no state: only the cloud's labels and names
    assert [n.index for n in fresh.describe("exp1")] == [0, 1, 2, 3, 4]
    assert fresh.clusters() == ["exp1"]
    assert make(owner="someone-else").clusters() == []
    fresh.terminate("exp1")
    assert gcp.is_empty()
    assert fresh.describe("exp1") == []
    assert fresh.clusters() == []
    fresh.terminate("exp1")


class Crash(Exception):
    """Stands for the process dying right after a call succeeded."""


CRASH_POINTS = [
    ("apply", "firewalls.insert", 1),
    ("apply", "firewalls.insert", 2),
    ("apply", "firewalls.insert", 3),
    ("apply", "resourcePolicies.insert", 1),
    ("apply", "instances.bulkInsert", 1),
    ("terminate", "instances.delete", 1),
    ("terminate", "instances.delete", 2),
    ("terminate", "firewalls.delete", 1),
    ("terminate", "firewalls.delete", 2),
    ("terminate", "firewalls.delete", 3),
    ("terminate", "resourcePolicies.delete", 1),
]


@pytest.mark.parametrize("how", ["raised", "killed"])
@pytest.mark.parametrize(("verb", "call", "nth"), CRASH_POINTS)
def test_a_crash_after_any_mutating_call_leaves_nothing_down_cannot_find(
    make: Make,
    gcp: StandIn,
    verb: str,
    call: str,
    nth: int,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash of an unmapped kind right after each mutating call, as an exception (the
    attempt's cleanup runs in `finally`) or a kill (it does not); then `terminate` from a
    fresh provider with no local state leaves the stand-in empty."""
    if how == "killed":
        monkeypatch.setattr(Engine, "_clean", lambda *_: None)
    clients = Clients()
    seen: list[str] = []

    def crash(name: str) -> None:
        seen.append(name)
        if name == call and seen.count(name) == nth:
            raise Crash(name)

    clients.hooks.append(crash)
    if verb == "apply":
        with pytest.raises(Crash):
            make(clients).apply(make().plan(a100()))
    else:
        make().apply(make().plan(a100()))
        with pytest.raises(Crash):
            make(clients).terminate("exp1")
    if how == "raised" and verb == "apply" and call != "instances.bulkInsert":
        assert gcp.is_empty(), "the failed attempt cleaned up after itself"
    else:
        assert not gcp.is_empty(), "the crash left something"
        assert mutations(gcp)[-1] == call, "the crash came right after the call under test"
    make().terminate("exp1")
    assert gcp.is_empty()


def test_ssh_is_opened_to_the_callers_address_or_to_the_world_only_when_asked(
    make: Make, gcp: StandIn, monkeypatch: pytest.MonkeyPatch, my_ip_url: str
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_PUBLIC_IP_URL", my_ip_url)
    plan = make().plan(dataclasses.replace(v100(), ssh_cidr=None))
    make().apply(plan)
    assert gcp.calls("firewalls.insert")[0].body["sourceRanges"] == ["198.51.100.9/32"]
    make().terminate("small")

    events: list[Event] = []
    make().apply(make().plan(dataclasses.replace(v100(), ssh_cidr="0.0.0.0/0")), events.append)
    assert gcp.calls("firewalls.insert")[3].body["sourceRanges"] == ["0.0.0.0/0"]
    warnings = [e.message for e in events if e.kind == "warning"]
    assert warnings == ["SSH is open to the whole internet (0.0.0.0/0), as asked"]
