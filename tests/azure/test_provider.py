"""The azure provider through the real SDK clients (azure-identity, azure-mgmt-*) against the
local ARM stand-in over HTTPS: plans, exact requests, failover, errors, resume, teardown."""

from __future__ import annotations

import base64
import dataclasses
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import AuthError, CapacityError, ConfigError, ProviderError, QuotaError
from cloudtrain.model import Event
from cloudtrain.plan import catalog
from cloudtrain.providers.azure._client import Clients
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.provision.engine import Engine
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.spec.limits import Limits
from tests.azure.standin import CLIENT_ID, CLIENT_SECRET, TENANT, StandIn

CIDR = "203.0.113.7/32"
Make = Callable[..., AzureProvider]


def two_regions() -> catalog.Catalog:
    """The shipped catalog plus a dearer westus2 copy of every azure row (region failover)."""
    shipped = catalog.load()
    west = tuple(
        dataclasses.replace(r, region="westus2", ondemand_usd_per_hour=r.ondemand_usd_per_hour + 1)
        for r in shipped.rows
        if r.provider == "azure"
    )
    return catalog.Catalog(rows=shipped.rows + west, prices_read_on=shipped.prices_read_on)


@pytest.fixture
def make(azure: StandIn, tmp_path: Path) -> Make:
    def build(clients: Clients | None = None, **options: Any) -> AzureProvider:
        opts: dict[str, Any] = {"poll_s": 0, "owner": "tester", **options}
        if clients is not None:
            opts["clients"] = clients
        return AzureProvider(ProviderContext(home=tmp_path / "home", options=opts))

    return build


def spec(gpus: str = "A100:8", nodes: int = 2, **resources: Any) -> ClusterSpec:
    name, _, count = gpus.partition(":")
    res = Resources(accelerator=name, count=int(count), **resources)
    return ClusterSpec("exp1", "azure", nodes, res, ssh_cidr=CIDR)


def vm_puts(azure: StandIn) -> list[dict[str, Any]]:
    return [c.body for c in azure.requests("PUT", "virtualMachines") if c.status < 300]


@pytest.mark.parametrize(
    ("gpus", "size"),
    [
        ("V100-32GB:8", "Standard_ND40rs_v2"),
        ("A100:8", "Standard_ND96asr_v4"),
        ("A100-80GB:1", "Standard_NC24ads_A100_v4"),
        ("A100-80GB:2", "Standard_NC48ads_A100_v4"),
        ("A100-80GB:4", "Standard_NC96ads_A100_v4"),
        ("A100-80GB:8", "Standard_ND96amsr_A100_v4"),
    ],
)
def test_plan_maps_gpus_to_sizes_and_changes_nothing(
    make: Make, azure: StandIn, gpus: str, size: str
) -> None:
    plan = make().plan(spec(gpus))
    assert [(o.region, o.instance_type, o.zones) for o in plan.offers] == [
        ("eastus", size, ("1", "2", "3"))
    ]
    assert plan.requests[-1]["PUT virtualMachines/exp1-0 (one per node)"]["properties"][
        "hardwareProfile"
    ] == {"vmSize": size}
    assert [c.method for c in azure.requests() if c.kind != "token"] == ["GET"]  # the SKU list
    assert azure.requests()[-1].query["$filter"] == "location eq 'eastus'"
    assert azure.leftovers() == {}


def test_retired_v100_is_refused_before_any_call_with_the_alternatives(
    make: Make, azure: StandIn
) -> None:
    with pytest.raises(ConfigError) as err:
        make().plan(spec("V100:1", nodes=1))
    message = str(err.value)
    assert "retired Standard_NC6s_v3 (V100:1) on 2025-09-30" in message
    assert "V100:1 on aws (p3.2xlarge) or gcp" in message
    assert "A100-80GB:1 on azure (Standard_NC24ads_A100_v4)" in message
    assert azure.requests() == []


def test_no_subscription_is_a_config_error_before_any_call(
    make: Make, azure: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID")
    with pytest.raises(ConfigError, match=r"--subscription ID .* AZURE_SUBSCRIPTION_ID"):
        make().plan(spec())
    assert azure.requests() == []
    assert make(subscription=azure.store.subscription).plan(spec()).offers


def test_an_http_endpoint_is_refused(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_AZURE_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="must be an https:// URL"):
        make().plan(spec())


def test_sku_restrictions_narrow_zones_and_skip_regions(make: Make, azure: StandIn) -> None:
    azure.restrict("Standard_ND96asr_v4", "eastus", zones=["1", "3"])
    assert make().plan(spec()).offers[0].zones == ("2",)
    with pytest.raises(ConfigError, match=r"available in no zone of eastus \(3\)"):
        make().plan(spec(zone="3"))
    azure.restrict("Standard_ND96asr_v4", "eastus")
    with pytest.raises(ConfigError, match=r"restricted in eastus \(NotAvailableForSubscription"):
        make().plan(spec())
    plan = make(catalog=two_regions()).plan(spec())
    assert [o.region for o in plan.offers] == ["westus2"]
    assert azure.leftovers() == {}


def test_a_region_with_a_quote_is_one_odata_literal(make: Make, azure: StandIn) -> None:
    shipped = catalog.load()
    odd = tuple(
        dataclasses.replace(r, region="east'us") for r in shipped.rows if r.provider == "azure"
    )
    with pytest.raises(ConfigError, match="east'us does not offer Standard_ND96asr_v4"):
        make(catalog=catalog.Catalog(rows=odd, prices_read_on=shipped.prices_read_on)).plan(
            spec(region="east'us")
        )
    assert azure.requests()[-1].query["$filter"] == "location eq 'east''us'"


def test_apply_sends_the_exact_requests(make: Make, azure: StandIn, tmp_path: Path) -> None:
    events: list[Event] = []
    nodes = make().apply(make().plan(spec(spot=True, disk_gb=300)), events.append)
    assert [(n.index, n.state, n.zone) for n in nodes] == [(0, "running", "1"), (1, "running", "1")]
    assert all(n.private_ip and n.public_ip for n in nodes)
    assert azure.mutations() == [
        "PUT resourceGroups/cloudtrain-exp1",
        "PUT networkSecurityGroups/cloudtrain-nsg",
        "PUT virtualNetworks/cloudtrain-vnet",
        "PUT proximityPlacementGroups/cloudtrain-ppg",
        "PUT virtualMachines/exp1-0",
        "PUT virtualMachines/exp1-1",
    ]
    group = azure.resource("resourceGroups/cloudtrain-exp1")
    assert group["tags"] == {"cloudtrain-cluster": "exp1", "cloudtrain-owner": "tester"}
    vm = vm_puts(azure)[1]
    props = vm["properties"]
    assert vm["zones"] == ["1"]
    assert vm["tags"] == {
        "cloudtrain-cluster": "exp1",
        "cloudtrain-owner": "tester",
        "cloudtrain-node": "1",
    }
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert props["storageProfile"]["osDisk"]["diskSizeGB"] == 300
    assert props["storageProfile"]["imageReference"]["offer"] == "ubuntu-hpc"  # InfiniBand
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic["properties"]["deleteOption"] == "Delete"
    assert nic["properties"]["enableAcceleratedNetworking"] is True
    pip = nic["properties"]["ipConfigurations"][0]["properties"]["publicIPAddressConfiguration"]
    assert pip["properties"] == {"deleteOption": "Delete", "publicIPAllocationMethod": "Static"}
    assert pip["sku"]["name"] == "Standard"
    assert (props["priority"], props["evictionPolicy"], props["billingProfile"]) == (
        "Spot",
        "Delete",
        {"maxPrice": -1},
    )
    assert props["proximityPlacementGroup"]["id"].endswith("/cloudtrain-ppg")
    linux = props["osProfile"]["linuxConfiguration"]
    assert props["osProfile"]["adminUsername"] == "cloudtrain"
    assert linux["disablePasswordAuthentication"] is True
    public = (tmp_path / "home/keys/exp1/id_ed25519.pub").read_text().strip()
    assert [k["keyData"] for k in linux["ssh"]["publicKeys"]] == [public]
    rules = azure.resource("networkSecurityGroups/cloudtrain-nsg")["properties"]["securityRules"]
    assert [
        (
            r["name"],
            r["properties"]["priority"],
            r["properties"]["protocol"],
            r["properties"]["sourceAddressPrefix"],
            r["properties"]["destinationPortRange"],
        )
        for r in rules
    ] == [
        ("ssh-from-user", 100, "Tcp", CIDR, "22"),
        ("within-cluster", 110, "*", "10.0.0.0/20", "*"),
    ]
    assert all(r["properties"]["access"] == "Allow" for r in rules)
    subnet = azure.resource("virtualNetworks/cloudtrain-vnet")["properties"]["subnets"][0]
    assert subnet["properties"]["networkSecurityGroup"]["id"].endswith("/cloudtrain-nsg")
    assert [e.kind for e in events].count("attempt") == 1
    known = (tmp_path / "home/keys/exp1/known_hosts").read_text()
    assert all(str(n.public_ip) in known and str(n.private_ip) in known for n in nodes)


def test_a_single_a100_80gb_gets_plain_ubuntu_no_ppg_no_spot(make: Make, azure: StandIn) -> None:
    make().apply(make().plan(spec("A100-80GB:1", nodes=1)))
    props = vm_puts(azure)[0]["properties"]
    assert props["hardwareProfile"]["vmSize"] == "Standard_NC24ads_A100_v4"
    assert props["storageProfile"]["imageReference"] == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    assert "proximityPlacementGroup" not in props
    assert "priority" not in props
    assert "proximityPlacementGroups" not in azure.leftovers()
    custom = base64.b64decode(props["osProfile"]["customData"]).decode()
    assert "CT_NCCL_ENV=''" in custom  # no fabric: no NCCL settings of its own


def test_accelerated_networking_only_where_the_sku_says_so(make: Make, azure: StandIn) -> None:
    azure.store.no_accelerated_networking.add("Standard_ND40rs_v2")
    make().apply(make().plan(spec("V100-32GB:8", nodes=1)))
    nic = vm_puts(azure)[0]["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic["properties"]["enableAcceleratedNetworking"] is False


def test_custom_data_holds_the_bootstrap_and_no_secret(
    make: Make, azure: StandIn, tmp_path: Path
) -> None:
    make().apply(make().plan(spec()))
    keys = tmp_path / "home" / "keys" / "exp1"
    private = keys / "id_ed25519"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    custom = base64.b64decode(vm_puts(azure)[0]["properties"]["osProfile"]["customData"]).decode()
    assert custom.startswith("#cloud-config")
    assert (keys / "id_ed25519.pub").read_text().strip() in custom
    assert (keys / "ssh_host_ed25519_key.pub").read_text().strip() in custom
    assert "NCCL_TOPO_FILE=/opt/microsoft/ndv4-topo.xml" in custom  # IB size: the nccl phase
    secret = "".join(private.read_text().splitlines()[1:-1])[80:140]  # the key's random part
    tokens = list(azure.tokens)
    every_body = " ".join(str(c.body) for c in azure.requests() if c.kind != "token")
    for leak in (secret, CLIENT_SECRET, *tokens):
        assert leak not in custom.replace("\n", "")
        assert leak not in every_body


def test_capacity_errors_fail_over_zone_by_zone_then_region(make: Make, azure: StandIn) -> None:
    azure.add_fault("ZonalAllocationFailed", region="eastus", zone="1")
    azure.add_fault("SkuNotAvailable", region="eastus", zone="2")  # a 409 on the PUT itself
    azure.add_fault("OverconstrainedAllocationRequest", region="eastus", zone="3")
    azure.add_fault("AllocationFailed", region="westus2", zone="1")
    events: list[Event] = []
    provider = make(catalog=two_regions())
    nodes = provider.apply(provider.plan(spec()), events.append)
    assert {(n.region, n.zone) for n in nodes} == {("westus2", "2")}
    assert [e.message for e in events if e.kind in ("attempt", "capacity")] == [
        "eastus/1: creating 2 × Standard_ND96asr_v4",
        "eastus/1: ZonalAllocationFailed; trying the next zone",
        "eastus/2: creating 2 × Standard_ND96asr_v4",
        "eastus/2: SkuNotAvailable; trying the next zone",
        "eastus/3: creating 2 × Standard_ND96asr_v4",
        "eastus/3: OverconstrainedAllocationRequest; trying the next zone",
        "westus2/1: creating 2 × Standard_ND96asr_v4",
        "westus2/1: AllocationFailed; trying the next zone",
        "westus2/2: creating 2 × Standard_ND96asr_v4",
    ]
    deletes = [m for m in azure.mutations() if m.startswith("DELETE")]
    assert deletes.count("DELETE virtualMachines/exp1-0") == 3  # Failed VMs too; the 409: none
    assert "DELETE resourceGroups/cloudtrain-exp1" in deletes  # eastus, before westus2
    left = azure.leftovers()
    assert sorted(left["virtualMachines"]) == ["exp1-0", "exp1-1"]
    assert sorted(left["networkInterfaces"]) == ["exp1-0-nic", "exp1-1-nic"]  # no orphans
    assert azure.resource("resourceGroups/cloudtrain-exp1")["location"] == "westus2"


def test_no_capacity_anywhere_says_so_and_leaves_nothing(make: Make, azure: StandIn) -> None:
    azure.add_fault("ZonalAllocationFailed")
    with pytest.raises(CapacityError) as err:
        make().apply(make().plan(spec()))
    assert str(err.value) == (
        "azure: NoCapacity: no zone had 2 × Standard_ND96asr_v4: eastus/1: ZonalAllocationFailed; "
        "eastus/2: ZonalAllocationFailed; eastus/3: ZonalAllocationFailed; nothing of the "
        "cluster was left behind"
    )
    assert azure.leftovers() == {}


@pytest.mark.parametrize(
    ("code", "status", "error", "hint", "message"),
    [
        ("QuotaExceeded", 409, QuotaError, "The quota: standardNDASv4_A100Family Cores", None),
        ("OperationNotAllowed", 409, QuotaError, "The quota: Total Regional Cores", None),
        ("AuthorizationFailed", 403, AuthError, "Check the credentials", None),
        (
            "OperationNotAllowed",
            409,
            ProviderError,
            "VM deallocating",
            "Not allowed: VM deallocating",
        ),
    ],
)
def test_quota_and_auth_errors_stop_at_once_and_leave_nothing(
    make: Make,
    azure: StandIn,
    code: str,
    status: int,
    error: type[Exception],
    hint: str,
    message: str | None,
) -> None:
    azure.add_fault(code, status=status, message=message)
    with pytest.raises(error, match=hint) as err:
        make().apply(make().plan(spec(nodes=3)))
    assert type(err.value) is error  # a non-quota OperationNotAllowed is no QuotaError
    assert ("Usage + quotas" in str(err.value)) == (error is QuotaError)
    assert len(azure.requests("PUT", "virtualMachines")) == 1  # no second VM, no other zone
    assert azure.leftovers() == {}


def test_a_bad_credential_or_token_is_an_auth_error(
    make: Make, azure: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "wrong")
    with pytest.raises(AuthError, match="AADSTS7000215"):
        make().plan(spec())
    for name in ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID"):
        monkeypatch.delenv(name)
    with pytest.raises(AuthError, match="NoCredentials: DefaultAzureCredential failed"):
        make().plan(spec())  # the whole default chain, none of it leaving this machine
    monkeypatch.setenv("AZURE_CLIENT_ID", CLIENT_ID)
    monkeypatch.setenv("AZURE_TENANT_ID", TENANT)
    monkeypatch.setenv("AZURE_CLIENT_SECRET", CLIENT_SECRET)
    azure.add_fault("AuthenticationFailed", status=401, method=None, kind=None)
    with pytest.raises(AuthError, match="AuthenticationFailed"):
        make().plan(spec())


def test_resume_remakes_a_failed_vm_and_only_what_is_missing(make: Make, azure: StandIn) -> None:
    provider = make()
    plan = provider.plan(spec(nodes=4))
    first = provider.apply(plan)
    with azure.lock:
        azure.store.delete_vm(str(first[1].extra["id"]))
        azure.resource("virtualMachines/exp1-3")["properties"]["provisioningState"] = "Failed"
    assert [n.state for n in provider.describe("exp1")] == ["running", "running", "failed"]
    before = len(azure.mutations())
    again = provider.apply(plan)
    assert [n.index for n in again] == [0, 1, 2, 3]
    assert azure.mutations()[before:] == [
        "DELETE virtualMachines/exp1-3",
        "PUT resourceGroups/cloudtrain-exp1",
        "PUT networkSecurityGroups/cloudtrain-nsg",
        "PUT virtualNetworks/cloudtrain-vnet",
        "PUT proximityPlacementGroups/cloudtrain-ppg",
        "PUT virtualMachines/exp1-1",
        "PUT virtualMachines/exp1-3",
    ]
    assert {n.zone for n in again} == {first[0].zone}
    assert provider.apply(plan) == provider.describe("exp1")  # complete: no call
    assert len(azure.requests("PUT", "virtualMachines")) == 6
    with pytest.raises(ConfigError, match="has 4 nodes, more than the 2 asked for"):
        provider.apply(provider.plan(spec(nodes=2)))


def test_describe_terminate_and_clusters_work_from_tags_alone(make: Make, azure: StandIn) -> None:
    make().apply(make().plan(spec()))
    azure.page_size = 1  # every list is paged: the SDK follows nextLink
    fresh = make()  # no state: only the cloud's tags
    assert [n.index for n in fresh.describe("exp1")] == [0, 1]
    assert fresh.clusters() == ["exp1"]
    assert make(owner="someone-else").clusters() == []
    fresh.terminate("exp1")
    assert azure.leftovers() == {}
    assert fresh.describe("exp1") == []
    assert fresh.clusters() == []
    fresh.terminate("exp1")
    fresh.terminate("never-existed")


def test_a_removed_node_takes_its_disk_nic_address_and_role_assignment(
    make: Make, azure: StandIn
) -> None:
    """`remove_nodes` (a cancelled recovery's): the VM and everything made for it alone go,
    its role assignment too (it would outlive the VM); the other node, the group, its network
    and the cluster's self-stop role stay."""
    prov = make()
    prov.apply(prov.plan(dataclasses.replace(spec("A100-80GB:1"), limits=Limits(idle_minutes=5))))
    before = azure.leftovers()
    assert len(before["roleAssignments"]) == 2
    prov.remove_nodes("exp1", None, [1])
    assert [n.index for n in prov.describe("exp1")] == [0]
    after = azure.leftovers()
    gone = {kind: sorted(set(names) - set(after.get(kind, []))) for kind, names in before.items()}
    assert {kind: len(names) for kind, names in gone.items() if names} == {
        "virtualMachines": 1, "disks": 1, "networkInterfaces": 1, "publicIPAddresses": 1,
        "roleAssignments": 1,
    }  # fmt: skip
    assert all("exp1-1" in name for kind, names in gone.items() if kind != "roleAssignments"
               for name in names)  # fmt: skip
    prov.terminate("exp1")
    assert azure.leftovers() == {}


def test_every_request_goes_to_the_configured_endpoint(make: Make, azure: StandIn) -> None:
    sent: list[str] = []
    clients = Clients(poll_s=0)
    clients.request_hooks.append(lambda request: sent.append(request.http_request.url))
    provider = make(clients)
    azure.add_fault("ZonalAllocationFailed", zone="1")  # polling and deleting, too
    provider.apply(provider.plan(spec()))
    provider.terminate("exp1")
    assert sent
    assert all(url.startswith(azure.base + "/") for url in sent)
    arm = [c for c in azure.requests() if c.kind != "token"]
    assert len(arm) == len(sent)
    assert {c.host for c in azure.requests()} == {f"127.0.0.1:{azure.port}"}
    assert any(c.kind == "operation" for c in arm)


class Crash(BaseException):
    """Stands for the process dying right after a call succeeded (no cleanup runs)."""


CLEAN = [
    "PUT resourceGroups/cloudtrain-exp1",
    "PUT networkSecurityGroups/cloudtrain-nsg",
    "PUT virtualNetworks/cloudtrain-vnet",
    "PUT proximityPlacementGroups/cloudtrain-ppg",
    "PUT virtualMachines/exp1-0",
    "PUT virtualMachines/exp1-1",
]
FAILOVER = [
    *CLEAN,
    "DELETE virtualMachines/exp1-0",
    "DELETE virtualMachines/exp1-1",
    "PUT virtualMachines/exp1-0",
    "PUT virtualMachines/exp1-1",
]
CRASH_POINTS = [("clean", k) for k in range(1, len(CLEAN) + 1)] + [
    ("failover", k) for k in range(1, len(FAILOVER) + 1)
]


@pytest.mark.parametrize("scenario", ["clean", "failover"])
def test_the_crash_points_are_every_mutating_call(
    make: Make, azure: StandIn, scenario: str
) -> None:
    if scenario == "failover":
        azure.add_fault("ZonalAllocationFailed", zone="1")
    make().apply(make().plan(spec()))
    assert azure.mutations() == (FAILOVER if scenario == "failover" else CLEAN)


@pytest.mark.parametrize("how", ["raised", "killed"])
@pytest.mark.parametrize(("scenario", "k"), CRASH_POINTS)
def test_a_crash_after_any_mutating_call_leaves_nothing_down_cannot_find(
    make: Make, azure: StandIn, scenario: str, k: int, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash of an unmapped kind right after each mutating call, as an exception (the
    attempt's cleanup runs in `finally`: what is left is a half-made cluster at most) or a
    kill (no cleanup runs); then `terminate` with no local state leaves the stand-in empty."""
    if how == "killed":
        monkeypatch.setattr(Engine, "_clean", lambda *_: None)
    if scenario == "failover":
        azure.add_fault("ZonalAllocationFailed", zone="1")
    seen: list[str] = []

    def crash(response: Any) -> None:
        request = response.http_request
        if request.method in ("PUT", "DELETE") and response.http_response.status_code < 300:
            seen.append(f"{request.method} {request.url}")
            if len(seen) == k:
                raise Crash(seen[-1])

    clients = Clients(poll_s=0)
    clients.response_hooks.append(crash)
    with pytest.raises(Crash):
        make(clients).apply(make().plan(spec()))
    if how == "killed":
        assert azure.leftovers(), "the crash left something"
    make().terminate("exp1")
    assert azure.leftovers() == {}


def test_ssh_is_opened_to_the_callers_address_or_to_the_world_only_when_asked(
    make: Make, azure: StandIn, monkeypatch: pytest.MonkeyPatch, my_ip_url: str
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_PUBLIC_IP_URL", my_ip_url)
    plan = make().plan(dataclasses.replace(spec(nodes=1), ssh_cidr=None))
    assert plan.spec.ssh_cidr == "198.51.100.9/32"
    events: list[Event] = []
    make().apply(
        make().plan(dataclasses.replace(spec(nodes=1), ssh_cidr="0.0.0.0/0")), events.append
    )
    assert Event("warning", "SSH is open to the whole internet (0.0.0.0/0), as asked") in events
    rules = azure.resource("networkSecurityGroups/cloudtrain-nsg")["properties"]["securityRules"]
    assert rules[0]["properties"]["sourceAddressPrefix"] == "0.0.0.0/0"


def test_infiniband_sizes_get_their_nccl_settings_through_the_bootstrap(tmp_path: Path) -> None:
    import re
    import subprocess

    from cloudtrain.boot.bootstrap import NodeKeys
    from cloudtrain.model import Offer
    from cloudtrain.providers.azure import _instances as inst
    from tests.conftest import require_tool

    def doc(size: str) -> bytes:
        offer = Offer("azure", "eastus", ("1",), size, 1.0, accelerator="A100", accelerator_count=8)
        return base64.b64decode(inst.custom_data(offer, NodeKeys.placeholders()))

    ib, plain = doc("Standard_ND96asr_v4").decode(), doc("Standard_X").decode()
    setting = re.compile(r"CT_NCCL_ENV=('[^']*')")
    same = [setting.sub("", d).replace(size, "SIZE") for d, size in
            ((ib, "Standard_ND96asr_v4"), (plain, "Standard_X"))]  # fmt: skip
    assert same[0] == same[1], "the settings are the only difference"
    found = setting.search(ib)
    assert found is not None
    assert "NCCL_IB_DISABLE=0" in found.group(1)
    assert "NCCL_IB_PCI_RELAXED_ORDERING=1" in found.group(1)
    path = tmp_path / "user-data"
    path.write_bytes(doc("Standard_ND96asr_v4"))
    checked = subprocess.run(
        [require_tool("cloud-init"), "schema", "--config-file", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
