"""``cloudtrain check`` for AWS against the stand-in: real boto3 calls (STS, Service Quotas, EC2)
over HTTP, in this process and through the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cloudtrain.check import CloudCheck, check
from cloudtrain.plan.catalog import load
from cloudtrain.providers.aws import _check
from cloudtrain.provision.credentials import present
from tests.aws.standin import EC2_QUOTAS, Raw, StandIn
from tests.integration.conftest import Shell

ON_DEMAND, SPOT = "L-417A185B", "L-7212CCBC"
A100_8 = load().find(provider="aws", accelerator="A100", count=8)


def quota(result: CloudCheck, region: str, code: str) -> tuple[float, float | None]:
    found = next(q for q in result.quotas if q.region == region and code in q.name)
    return found.limit, found.used


def test_valid_credentials_and_the_p_quotas_left_per_region(aws: StandIn) -> None:
    aws.app.set_service_quota(ON_DEMAND, 200, "us-east-1")
    aws.app.set_service_quota(SPOT, 0, "us-east-1")
    ec2 = aws.client("ec2", "us-east-1")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge")
    ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2, InstanceType="t3.micro")  # not P
    before = len(aws.app.calls(service=None))

    result = check("aws", A100_8)

    assert result.valid is True
    assert result.identity == "account 123456789012 (arn:aws:sts::123456789012:user/moto)"
    assert sorted({q.region for q in result.quotas}) == ["eu-west-1", "us-east-1", "us-west-2"]
    assert quota(result, "us-east-1", ON_DEMAND) == (200.0, 96.0)  # one p4d: 96 vCPUs
    assert quota(result, "us-east-1", SPOT) == (0.0, 0.0)
    assert quota(result, "us-west-2", ON_DEMAND) == (EC2_QUOTAS[ON_DEMAND][1], 0.0)
    room = {(r.row.region, r.spot): r.nodes for r in result.room}
    assert room == {
        ("us-east-1", False): 1,
        ("us-east-1", True): 0,
        ("us-west-2", False): 4,
        ("eu-west-1", False): 4,
    }
    assert result.usable
    [short] = result.findings  # the spot quota of us-east-1: nothing left for a p4d
    assert short.problem == (
        "All P Spot Instance Requests (L-7212CCBC) (spot) in us-east-1: 0 vCPUs left, the "
        "smallest machine of interest needs 96"
    )
    assert short.fix.startswith(
        "raise it to at least 96 vCPUs: request an increase in the "
        "Service Quotas console (EC2, L-7212CCBC)"
    )
    asked = aws.app.calls("GetServiceQuota", region="us-east-1", service="servicequotas")
    assert sorted(c.params["QuotaCode"] for c in asked) == [ON_DEMAND, SPOT]
    assert all(c.params["ServiceCode"] == "ec2" for c in asked)
    made = {c.action for c in aws.app.calls(service=None)[before:]}
    assert made == {"GetCallerIdentity", "DescribeInstances", "GetServiceQuota"}  # read-only


def test_no_quota_left_anywhere_is_not_usable(aws: StandIn) -> None:
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        for code in (ON_DEMAND, SPOT):
            aws.app.set_service_quota(code, 0, region)
    result = check("aws", A100_8)
    assert result.valid is True
    assert not result.usable
    assert len(result.findings) == 4  # on-demand in 3 regions, spot in us-east-1


def test_refused_credentials_are_not_valid_and_say_what_to_do(aws: StandIn) -> None:
    aws.app.add_fault(
        "GetCallerIdentity",
        "InvalidClientTokenId",
        "The security token included in the request is invalid.",
        403,
        service="sts",
    )
    result = check("aws", A100_8)
    assert (result.present, result.valid, result.usable) == (True, False, False)
    [finding] = result.findings
    assert finding.problem.startswith(
        "InvalidClientTokenId: The security token included in the request is invalid."
    )
    assert finding.fix == _check.CREDENTIALS_FIX
    assert aws.app.calls("GetServiceQuota", service="servicequotas") == []


def test_a_garbled_answer_is_not_valid_and_worth_a_retry(aws: StandIn) -> None:
    page = b"<html><head><title>502 Bad Gateway</title></head></html>"
    aws.app.add_raw_fault("GetCallerIdentity", Raw(502, page), service="sts")
    result = check("aws", A100_8)
    assert result.valid is False
    [finding] = result.findings
    assert "502 Bad Gateway" in finding.problem
    assert finding.fix.startswith("retry")


def test_a_quota_that_cannot_be_read_is_a_finding_not_a_failure(aws: StandIn) -> None:
    aws.app.add_fault(
        "GetServiceQuota",
        "AccessDeniedException",
        "User is not authorized to perform: servicequotas:GetServiceQuota",
        400,
        region="eu-west-1",
        service="servicequotas",
    )
    result = check("aws", A100_8)
    assert result.valid is True
    assert result.usable
    assert {q.region for q in result.quotas} == {"us-east-1", "us-west-2"}
    problems = [f.problem for f in result.findings]
    assert len(problems) == 2
    assert problems[0].startswith(
        "Running On-Demand P instances (L-417A185B) in eu-west-1 not read: AccessDeniedException"
    )
    assert result.findings[0].fix == "allow servicequotas:GetServiceQuota"


def test_a_missing_sdk_says_which_extra_to_install(
    aws: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    result = check("aws", A100_8)
    assert (result.valid, result.usable) == (None, False)
    [finding] = result.findings
    assert finding.problem == "boto3 not installed"
    assert finding.fix == "pip install 'cloudtrain[aws]'"


# -- the CLI, as a user runs it ------------------------------------------------------------------


@pytest.fixture
def cli(aws: StandIn, tmp_path: Path) -> Shell:
    shell = Shell(tmp_path / "home")  # made after `aws` set the environment
    shell.env["HOME"] = str(tmp_path)  # no developer's cloud login is found
    return shell


@pytest.mark.integration
def test_cli_json_and_exit_status(cli: Shell, aws: StandIn) -> None:
    aws.app.set_service_quota(ON_DEMAND, 192, "us-west-2")
    done = cli("check", "--provider", "aws", "--gpus", "A100:8", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["usable"] == ["aws"]
    [cloud] = data["clouds"]
    assert set(cloud) == {
        "provider",
        "usable",
        "present",
        "source",
        "valid",
        "offered",
        "identity",
        "quotas",
        "room",
        "findings",
    }
    assert (cloud["present"], cloud["valid"]) == (True, True)
    assert cloud["source"] == present("aws").source
    west = next(q for q in cloud["quotas"] if q["region"] == "us-west-2" and not q["spot"])
    assert west == {
        "region": "us-west-2",
        "name": "Running On-Demand P instances (L-417A185B)",
        "limit": 192.0,
        "used": 0.0,
        "left": 192.0,
        "unit": "vCPUs",
        "spot": False,
        "instance_types": ["p4d.24xlarge"],
    }
    assert {
        "instance_type": "p4d.24xlarge",
        "gpus": "A100:8",
        "region": "us-west-2",
        "spot": False,
        "nodes": 2,
    } in cloud["room"]


@pytest.mark.integration
def test_cli_table_says_what_to_fix(cli: Shell, aws: StandIn) -> None:
    aws.app.set_service_quota(ON_DEMAND, 64, "eu-west-1")
    done = cli("check", "--provider", "aws", "--gpus", "A100:8")
    assert done.returncode == 0, done.stderr
    assert "account 123456789012" in done.stdout
    assert "aws quotas" in done.stdout
    assert "nodes the quotas leave room for" in done.stdout
    assert (
        "aws: Running On-Demand P instances (L-417A185B) (on-demand) in eu-west-1: 64 vCPUs "
        "left, the smallest machine of interest needs 96"
    ) in done.stdout


@pytest.mark.integration
def test_cli_refused_or_absent_credentials_exit_1(cli: Shell, aws: StandIn) -> None:
    aws.app.add_fault("GetCallerIdentity", "ExpiredToken", "expired", 403, service="sts")
    refused = cli("check", "--provider", "aws")
    assert refused.returncode == 1, refused.stderr
    assert "ExpiredToken" in refused.stdout
    assert "aws sts get-caller-identity" in refused.stdout
    assert "Traceback" not in refused.stdout + refused.stderr

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        cli.env.pop(name, None)
    calls = len(aws.app.calls(service=None))
    absent = cli("check", "--provider", "aws", "--json")
    assert absent.returncode == 1
    [cloud] = json.loads(absent.stdout)["clouds"]
    assert (cloud["present"], cloud["valid"], cloud["usable"]) == (False, None, False)
    assert cloud["findings"][0]["problem"] == "no credentials found"
    assert cloud["findings"][0]["fix"]
    assert len(aws.app.calls(service=None)) == calls  # nothing was asked of the cloud
    assert os.environ.get("AWS_ACCESS_KEY_ID") == "testing"  # this process's own is untouched
