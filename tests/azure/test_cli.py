"""The CLI end to end against the ARM stand-in, as a user runs it: a subprocess whose
DefaultAzureCredential gets a client-secret token from the stand-in (AZURE_AUTHORITY_HOST) and
whose clients reach ARM at CLOUDTRAIN_AZURE_ENDPOINT, over TLS trusted via REQUESTS_CA_BUNDLE."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.azure.standin import CLIENT_SECRET, StandIn
from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration
CIDR = ["--ssh-cidr", "203.0.113.7/32"]


def up(gpus: str, nodes: int = 2) -> list[str]:
    # --no-setup: the stand-in's VMs are records, not machines; no bootstrap runs on them.
    return [
        "up",
        "--provider",
        "azure",
        "--gpus",
        gpus,
        "--nodes",
        str(nodes),
        "--name",
        "exp1",
        "--no-setup",
        *CIDR,
    ]


@pytest.fixture
def cli(azure: StandIn, tmp_path: Path) -> Iterator[Shell]:
    shell = Shell(tmp_path / "home")  # made after `azure` set the environment
    shell.env["CLOUDTRAIN_AZURE_POLL_S"] = "0"  # LROs: ARM's "Retry-After: 0" means 30 s
    yield shell
    assert azure.leftovers() == {}


@pytest.mark.parametrize(
    ("gpus", "size", "price"),
    [
        ("A100-80GB:1", "Standard_NC24ads_A100_v4", "$7.35/h"),
        ("A100:8", "Standard_ND96asr_v4", "$54.39/h"),
        ("V100-32GB:8", "Standard_ND40rs_v2", "$44.06/h"),  # Azure's only V100 left
    ],
)
def test_up_status_down_leave_the_cloud_empty(
    cli: Shell, azure: StandIn, gpus: str, size: str, price: str
) -> None:
    dry = cli(*up(gpus), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert size in dry.stdout
    assert '"deleteOption": "Delete"' in dry.stdout
    assert "nothing was created" in dry.stdout
    assert not azure.mutations()

    made = cli(*up(gpus))
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"cluster exp1 is up: 2 node(s), {price}" in made.stdout
    assert f"eastus/1: creating 2 × {size}" in made.stderr
    status = cli("status", "--json", "--refresh")
    cluster = json.loads(status.stdout)["clusters"][0]
    assert [n["index"] for n in cluster["nodes"]] == [0, 1]
    assert cluster["status"] == "up"
    assert all(n["public_ip"] and n["private_ip"] for n in cluster["nodes"])

    state = b"".join(p.read_bytes() for p in cli.home.glob("state.db*"))
    logs = (made.stdout + made.stderr + dry.stdout + dry.stderr).encode()
    for secret in (b"PRIVATE KEY", CLIENT_SECRET.encode(), *(t.encode() for t in azure.tokens)):
        assert secret not in state
        assert secret not in logs

    again = cli(*up(gpus))  # idempotent: nothing new
    assert again.returncode == 0, again.stderr
    assert len(azure.requests("PUT", "virtualMachines")) == 2

    down = cli("down", "exp1")
    assert down.returncode == 0, down.stderr
    assert "cluster exp1 is down" in down.stdout
    assert not (cli.home / "keys" / "exp1").exists()


def test_down_finds_the_cluster_by_tag_when_the_state_is_lost(cli: Shell, azure: StandIn) -> None:
    assert cli(*up("A100-80GB:1")).returncode == 0
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (cli.home / name).unlink(missing_ok=True)
    down = cli("down", "exp1", "--provider", "azure")
    assert down.returncode == 0, down.stderr
    assert "cluster exp1 is down" in down.stdout


def test_capacity_failover_is_printed_and_no_capacity_exits_3(cli: Shell, azure: StandIn) -> None:
    azure.add_fault("ZonalAllocationFailed", zone="1")
    azure.add_fault("SkuNotAvailable", zone="2")
    made = cli(*up("A100:8"))
    assert made.returncode == 0, made.stderr
    assert "eastus/1: ZonalAllocationFailed; trying the next zone" in made.stderr
    assert "eastus/2: SkuNotAvailable; trying the next zone" in made.stderr
    assert "eastus/3: creating 2 × Standard_ND96asr_v4" in made.stderr
    assert cli("down", "exp1").returncode == 0

    azure.add_fault("AllocationFailed")
    failed = cli(*up("A100:8"))
    assert failed.returncode == 3, failed.stderr
    assert "no zone had 2 × Standard_ND96asr_v4: eastus/1: ZonalAllocationFailed" in failed.stderr
    assert "eastus/3: AllocationFailed" in failed.stderr
    assert json.loads(cli("status", "--json").stdout)["clusters"] == []


def test_quota_error_exits_3_naming_the_quota_and_leaves_nothing(
    cli: Shell, azure: StandIn
) -> None:
    azure.add_fault("QuotaExceeded")
    failed = cli(*up("A100:8"))
    assert failed.returncode == 3, failed.stderr
    assert "standardNDASv4_A100Family Cores" in failed.stderr
    assert azure.leftovers() == {}


def test_retired_v100_exits_2_before_any_call(cli: Shell, azure: StandIn) -> None:
    refused = cli(*up("V100:1", nodes=1))
    assert refused.returncode == 2
    assert "retired Standard_NC6s_v3 (V100:1) on 2025-09-30" in refused.stderr
    assert azure.requests() == []


def test_the_subscription_comes_from_the_flag_and_is_kept_for_down(
    cli: Shell, azure: StandIn
) -> None:
    del cli.env["AZURE_SUBSCRIPTION_ID"]
    missing = cli(*up("A100-80GB:1", nodes=1))
    assert missing.returncode == 2
    assert "--subscription ID" in missing.stderr
    assert azure.requests() == []
    made = cli(*up("A100-80GB:1", nodes=1), "--subscription", azure.store.subscription)
    assert made.returncode == 0, made.stderr
    down = cli("down", "exp1")  # the subscription recorded by `up`
    assert down.returncode == 0, down.stderr
