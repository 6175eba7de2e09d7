"""``cloudtrain check`` for GCP against the GCE stand-in: the real google-cloud-compute clients
(``projects.get``, ``regions.get``), in this process and through the CLI in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.check import GLOBAL, CloudCheck, check
from cloudtrain.plan.catalog import load
from cloudtrain.providers.gcp import _check
from tests.gcp.standin import ACCOUNT, PROJECT, StandIn
from tests.integration.conftest import Shell

A100 = load().find(provider="gcp", accelerator="A100")


def quota(result: CloudCheck, region: str, name: str) -> tuple[float, float | None, bool | None]:
    found = next(q for q in result.quotas if q.region == region and q.name == name)
    return found.limit, found.used, found.spot


def test_valid_credentials_and_the_gpu_quotas_left(gcp: StandIn) -> None:
    with gcp.lock:
        gcp.gce.set_quota("GPUS_ALL_REGIONS", 24, 4)
        gcp.gce.set_quota("NVIDIA_A100_GPUS", 16, 10, region="us-central1")
        gcp.gce.set_quota("PREEMPTIBLE_NVIDIA_A100_GPUS", 0, region="us-central1")

    result = check("gcp", A100)

    assert result.valid is True
    assert result.identity == f"project {PROJECT} ({ACCOUNT})"
    assert [(q.region, q.name) for q in result.quotas] == [
        (GLOBAL, "GPUS_ALL_REGIONS"),
        ("us-central1", "NVIDIA_A100_GPUS"),
        ("us-central1", "PREEMPTIBLE_NVIDIA_A100_GPUS"),
    ]
    assert quota(result, GLOBAL, "GPUS_ALL_REGIONS") == (24.0, 4.0, None)
    assert quota(result, "us-central1", "NVIDIA_A100_GPUS") == (16.0, 10.0, False)
    assert quota(result, "us-central1", "PREEMPTIBLE_NVIDIA_A100_GPUS") == (0.0, 0.0, True)
    on_demand = {r.row.instance_type: r.nodes for r in result.room if not r.spot}
    # 6 left in the region (20 in the project): 6 × 1 GPU, 3 × 2, 1 × 4, none of 8 or 16
    assert on_demand == {
        "a2-highgpu-1g": 6,
        "a2-highgpu-2g": 3,
        "a2-highgpu-4g": 1,
        "a2-highgpu-8g": 0,
        "a2-megagpu-16g": 0,
    }
    assert all(r.nodes == 0 for r in result.room if r.spot)
    assert result.usable
    [short] = result.findings
    assert short.problem.startswith("PREEMPTIBLE_NVIDIA_A100_GPUS (spot) in us-central1: 0 GPUs")
    assert "console.cloud.google.com/iam-admin/quotas?project=standin-project" in short.fix
    asked = [c.name for c in gcp.calls() if c.name != "oauth.token"]
    assert asked == ["projects.get", "regions.get"]
    assert gcp.calls("regions.get")[0].path == f"/compute/v1/projects/{PROJECT}/regions/us-central1"


def test_refused_credentials_are_not_valid_and_say_what_to_do(gcp: StandIn) -> None:
    gcp.add_fault("projects.get", "forbidden", status=403)
    result = check("gcp", A100)
    assert (result.valid, result.usable) == (False, False)
    [finding] = result.findings
    assert finding.problem.startswith(f"FORBIDDEN: GET {gcp.url}/compute/v1/projects/{PROJECT}: ")
    assert "forbidden: not allowed (in project standin-project)" in finding.problem
    assert finding.fix == _check.CREDENTIALS_FIX
    assert gcp.calls("regions.get") == []


def test_a_garbled_answer_is_not_valid_and_worth_a_retry(gcp: StandIn) -> None:
    gcp.add_raw_fault("projects.get", status=200, body=b'{"kind": "compute#proj', length=60)
    result = check("gcp", A100)
    assert result.valid is False
    [finding] = result.findings
    assert finding.fix.startswith("retry")


def test_a_region_that_cannot_be_read_is_a_finding_not_a_failure(gcp: StandIn) -> None:
    gcp.add_fault("regions.get", "forbidden", status=403)
    result = check("gcp", A100)
    assert (result.valid, result.usable) == (True, True)
    assert [q.name for q in result.quotas] == ["GPUS_ALL_REGIONS"]
    [finding] = result.findings
    assert finding.problem.startswith("the GPU quotas of us-central1 not read: FORBIDDEN")
    assert finding.fix == "allow compute.regions.get"


@pytest.fixture
def cli(gcp: StandIn, tmp_path: Path) -> Shell:
    shell = Shell(tmp_path / "home")  # made after `gcp` set the environment
    shell.env["HOME"] = str(tmp_path)  # no developer's cloud login is found
    return shell


@pytest.mark.integration
def test_cli_json_table_and_exit_status(cli: Shell, gcp: StandIn) -> None:
    with gcp.lock:
        gcp.gce.set_quota("NVIDIA_A100_80GB_GPUS", 8, 0, region="us-central1")
    done = cli("check", "--provider", "gcp", "--gpus", "A100-80GB:8", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    [cloud] = data["clouds"]
    assert data["usable"] == ["gcp"]
    assert cloud["identity"] == f"project {PROJECT} ({ACCOUNT})"
    assert cloud["room"] == [
        {
            "instance_type": "a2-ultragpu-8g",
            "gpus": "A100-80GB:8",
            "region": "us-central1",
            "spot": False,
            "nodes": 1,
        }
    ]

    with gcp.lock:
        gcp.gce.set_quota("GPUS_ALL_REGIONS", 0)
    table = cli("check", "--provider", "gcp", "--gpus", "A100-80GB:8")
    assert table.returncode == 1, table.stderr  # no room anywhere: not usable
    assert "gcp quotas" in table.stdout
    assert (
        "gcp: GPUS_ALL_REGIONS in every region: 0 GPUs left, the smallest machine of "
        "interest needs 8" in table.stdout
    )


@pytest.mark.integration
def test_cli_absent_credentials_exit_1_without_a_call(cli: Shell, gcp: StandIn) -> None:
    del cli.env["GOOGLE_APPLICATION_CREDENTIALS"]
    done = cli("check", "--provider", "gcp")
    assert done.returncode == 1
    assert "gcp: no credentials found" in done.stdout
    assert gcp.calls() == []
