"""``cloudtrain check`` for Azure against the ARM stand-in: the real azure-identity and
azure-mgmt clients over TLS, in this process and through the CLI in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.check import CloudCheck, check
from cloudtrain.plan.catalog import load
from cloudtrain.providers.azure import _check
from tests.azure.standin import SUBSCRIPTION, StandIn
from tests.integration.conftest import Shell

A100_8 = load().find(provider="azure", accelerator="A100", count=8)  # Standard_ND96asr_v4
USAGES = f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/eastus/usages"


def quota(result: CloudCheck, name: str) -> tuple[float, float | None, bool | None]:
    found = next(q for q in result.quotas if q.name == name)
    return found.limit, found.used, found.spot


def test_valid_credentials_and_the_vcpu_quotas_left(azure: StandIn) -> None:
    with azure.lock:
        azure.store.set_usage("eastus", "standardNDASv4_A100Family", 288, current=96)
        azure.store.set_usage("eastus", "cores", 500, current=300)
        azure.store.set_usage("eastus", "lowPriorityCores", 0)

    result = check("azure", A100_8)

    assert result.valid is True
    assert result.identity == f"subscription {SUBSCRIPTION}"
    assert [q.name for q in result.quotas] == [
        "Total Regional vCPUs",
        "Total Regional Low-priority vCPUs",
        "Standard NDASv4_A100 Family vCPUs",
    ]
    assert quota(result, "Standard NDASv4_A100 Family vCPUs") == (288.0, 96.0, False)
    assert quota(result, "Total Regional vCPUs") == (500.0, 300.0, False)
    assert quota(result, "Total Regional Low-priority vCPUs") == (0.0, 0.0, True)
    # on-demand: 192 left in the family but 200 in the region → 2 nodes of 96 vCPUs; spot: none
    assert {r.spot: r.nodes for r in result.room} == {False: 2, True: 0}
    assert result.usable
    [short] = result.findings
    assert short.problem == (
        "Total Regional Low-priority vCPUs (spot) in eastus: 0 vCPUs left, the smallest machine "
        "of interest needs 96"
    )
    assert short.fix.startswith("raise it to at least 96 vCPUs: request more in the portal")
    [usages] = [c for c in azure.requests("GET") if c.path == USAGES]
    assert usages.status == 200
    assert [c.method for c in azure.requests() if c.kind != "token"] == ["GET", "GET"]


def test_refused_credentials_are_not_valid_and_say_what_to_do(azure: StandIn) -> None:
    azure.token_error = "invalid_client"
    result = check("azure", A100_8)
    assert (result.valid, result.usable) == (False, False)
    [finding] = result.findings
    assert finding.problem.startswith("NoCredentials: ")
    assert finding.fix == _check.CREDENTIALS_FIX


def test_a_forbidden_subscription_is_not_valid(azure: StandIn) -> None:
    azure.add_fault("AuthorizationFailed", status=403, method="GET", kind=None)
    result = check("azure", A100_8)
    assert result.valid is False
    [finding] = result.findings
    assert finding.problem.startswith("AuthorizationFailed: ")
    assert finding.fix == _check.CREDENTIALS_FIX
    assert not [c for c in azure.requests() if c.path == USAGES]


def test_usages_that_cannot_be_read_are_a_finding_not_a_failure(azure: StandIn) -> None:
    azure.add_raw_fault(method="GET", kind="usages", status=200, body=b"<html>oops</html>")
    result = check("azure", A100_8)
    assert (result.valid, result.usable, result.quotas) == (True, True, ())
    [finding] = result.findings
    assert finding.problem.startswith(
        "the vCPU quotas of eastus not read: DecodeError: the answer in eastus is not JSON"
    )
    assert finding.fix.startswith("retry")


def test_gpus_the_catalog_has_not_there_are_not_usable(azure: StandIn) -> None:
    result = check("azure", [], wanted="V100:1")  # NCv3 was retired
    assert (result.valid, result.offered, result.usable) == (True, False, False)
    assert result.quotas == ()
    assert result.findings[0].problem == "the catalog has no V100:1 machine on azure"


@pytest.fixture
def cli(azure: StandIn, tmp_path: Path) -> Shell:
    shell = Shell(tmp_path / "home")  # made after `azure` set the environment
    shell.env["HOME"] = str(tmp_path)  # no developer's cloud login is found
    return shell


@pytest.mark.integration
def test_cli_json_and_exit_status(cli: Shell, azure: StandIn) -> None:
    with azure.lock:
        azure.store.set_usage("eastus", "StandardNCADSA100v4Family", 48, current=24)
    done = cli("check", "--provider", "azure", "--gpus", "A100-80GB:1", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    [cloud] = data["clouds"]
    assert (cloud["valid"], cloud["usable"], data["usable"]) == (True, True, ["azure"])
    family = next(q for q in cloud["quotas"] if q["name"].startswith("Standard NCADS"))
    assert (family["limit"], family["used"], family["left"]) == (48.0, 24.0, 24.0)
    assert family["instance_types"] == ["Standard_NC24ads_A100_v4"]
    assert {(r["spot"], r["nodes"]) for r in cloud["room"]} == {(False, 1), (True, 4)}


@pytest.mark.integration
def test_cli_refused_credentials_exit_1_in_a_table(cli: Shell, azure: StandIn) -> None:
    cli.env["AZURE_CLIENT_SECRET"] = "not-the-secret"
    done = cli("check", "--provider", "azure")
    assert done.returncode == 1, done.stderr
    assert "azure: NoCredentials" in done.stdout
    assert "az login" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
