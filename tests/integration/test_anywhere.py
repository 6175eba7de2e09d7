"""`up --gpus …` naming no provider, through the CLI against two clouds' stand-ins at once: the
optimizer ranks GCP's V100 (2.95 $/h) before AWS's (3.06), and when GCP has no room anywhere the
cluster is made on AWS, with nothing left on GCP (its firewall rules and placement policy
included)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aws.standin import StandIn as AwsStandIn
from tests.aws.standin import assert_empty, leftovers, put_dlami_parameter, register_dlami
from tests.gcp.standin import StandIn as GcpStandIn
from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration
AWS_REGIONS = ("us-east-1", "us-west-2", "eu-west-1")
UP = ["up", "--gpus", "V100:1", "--nodes", "2", "--name", "exp1", "--no-setup",
      "--ssh-cidr", "203.0.113.7/32"]  # fmt: skip


@pytest.fixture
def cli(aws: AwsStandIn, gcp: GcpStandIn, tmp_path: Path) -> Iterator[Shell]:
    for region in AWS_REGIONS:
        put_dlami_parameter(aws.client("ssm", region), register_dlami(aws.client("ec2", region)))
    shell = Shell(tmp_path / "home")  # made after both stand-ins set the environment
    yield shell
    for region in AWS_REGIONS:
        assert_empty(aws.client("ec2", region), "exp1")
    assert gcp.is_empty()


def test_the_dry_run_ranks_every_cloud_at_hand_and_creates_nothing(
    cli: Shell, aws: AwsStandIn, gcp: GcpStandIn
) -> None:
    dry = cli(*UP, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    rows = [[cell.strip() for cell in line.strip("│").split("│")]
            for line in dry.stdout.splitlines() if line.startswith("│")]  # fmt: skip
    assert [(r[0], r[1], r[2], r[-2]) for r in rows] == [
        ("1", "gcp", "us-central1", "2.95"),
        ("2", "aws", "us-east-1", "3.06"),
        ("3", "aws", "us-west-2", "3.06"),
        ("4", "aws", "eu-west-1", "3.31"),
    ]
    assert "dry run: would try gcp (us-central1), then aws (us-east-1, us-west-2, eu-west-1)" in (
        dry.stdout
    )
    assert "left out: azure: no credentials" in dry.stderr
    assert not gcp.calls("instances.bulkInsert")
    assert not [c for c in aws.app.calls() if c.action == "RunInstances"]


def test_no_room_on_the_cheapest_cloud_makes_the_cluster_on_the_next(
    cli: Shell, aws: AwsStandIn, gcp: GcpStandIn
) -> None:
    gcp.add_fault("instances.bulkInsert", "ZONE_RESOURCE_POOL_EXHAUSTED", in_operation=True)
    made = cli(*UP)
    assert made.returncode == 0, made.stderr
    assert "cheapest first (gcp us-central1 at $2.95/node-hour)" in made.stderr
    assert "gcp: NoCapacity: no zone had 2 × n1-highmem-8+1xnvidia-tesla-v100" in made.stderr
    assert "trying aws (us-east-1, us-west-2, eu-west-1)" in made.stderr
    assert len(gcp.calls("instances.bulkInsert")) == 4  # every zone of us-central1 was tried
    assert gcp.is_empty()  # nothing of the attempt is left on the first cloud
    (record,) = cli.status()["clusters"]
    assert (record["provider"], record["spec"]["provider"]) == ("aws", "aws")
    assert record["price_per_hour"] == pytest.approx(2 * 3.06)
    assert len(leftovers(aws.client("ec2", "us-east-1"), "exp1")["instances"]) == 2
    events = json.loads(cli("events", "exp1", "--json").stdout)
    assert any("us-central1-a: ZONE_RESOURCE_POOL_EXHAUSTED" in e["message"] for e in events)

    again = cli(*UP)  # the same command completes the cluster where it is: no second one
    assert again.returncode == 0, again.stderr
    assert len(gcp.calls("instances.bulkInsert")) == 4
    assert cli("down", "exp1").returncode == 0


def test_no_room_anywhere_names_every_cloud_and_leaves_nothing(
    cli: Shell, aws: AwsStandIn, gcp: GcpStandIn
) -> None:
    gcp.add_fault("instances.bulkInsert", "ZONE_RESOURCE_POOL_EXHAUSTED", in_operation=True)
    aws.app.add_fault("RunInstances", "InsufficientInstanceCapacity")
    failed = cli(*UP, "--max-price", "3.1")
    assert failed.returncode == 3, failed.stderr
    assert "left out: 1 offer(s) over --max-price 3.1 $/node-hour" in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: any: NoCapacity: gcp: NoCapacity: no zone had 2 × n1-high")
    assert "; aws: NoCapacity: no zone had 2 × p3.2xlarge" in last
    assert "eu-west-1" not in last  # over the price: never tried
    assert cli.status()["clusters"] == []


def test_two_ups_of_one_name_at_once_make_one_cluster_on_one_cloud(
    cli: Shell, aws: AwsStandIn, gcp: GcpStandIn
) -> None:
    gcp.add_fault("instances.bulkInsert", "ZONE_RESOURCE_POOL_EXHAUSTED", in_operation=True)
    both = [cli.popen(*UP), cli.popen(*UP)]
    outputs = [p.communicate(timeout=240)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    (record,) = cli.status()["clusters"]
    assert record["provider"] == "aws"
    assert len(leftovers(aws.client("ec2", "us-east-1"), "exp1")["instances"]) == 2
    assert len([c for c in aws.app.calls() if c.action == "RunInstances"]) == 1
    assert gcp.is_empty()
    assert cli("down", "exp1").returncode == 0
