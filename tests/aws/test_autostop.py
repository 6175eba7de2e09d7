"""An idle AWS cluster ends itself with the user's machine off and no credential on a node:
each node's agent powers its guest off, EC2 terminates it (``InstanceInitiatedShutdownBehavior``),
and the next command here removes what only the account can (security group, key pair)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests import guest_agent
from tests.aws.standin import StandIn, assert_empty, put_dlami_parameter, register_dlami
from tests.integration.conftest import Shell, wait_for

pytestmark = pytest.mark.integration
UP = ["up", "--provider", "aws", "--gpus", "V100:1", "--nodes", "2", "--no-setup",
      "--region", "us-east-1", "--ssh-cidr", "203.0.113.7/32"]  # fmt: skip


@pytest.fixture
def cli(aws: StandIn, tmp_path: Path) -> Shell:
    put_dlami_parameter(aws.client("ssm"), register_dlami(aws.client("ec2")))
    return Shell(tmp_path / "home")


def instances(aws: StandIn, name: str) -> dict[str, str]:
    """Instance id → state of the cluster's instances."""
    found = aws.client("ec2").describe_instances(
        Filters=[{"Name": "tag:cloudtrain:cluster", "Values": [name]}]
    )
    return {i["InstanceId"]: i["State"]["Name"] for r in found["Reservations"]
            for i in r["Instances"]}  # fmt: skip


def run_agents(aws: StandIn, tmp_path: Path, name: str) -> list[subprocess.Popen[bytes]]:
    """Each node's agent as its user-data says, playing its guest against the stand-in."""
    request = aws.app.calls("RunInstances")[-1]
    unit = guest_agent.unit_of_b64(request.params["UserData"])
    assert request.params["InstanceInitiatedShutdownBehavior"] == "terminate"
    return [
        guest_agent.start(tmp_path / f"node-{i}", unit, [
            "python", "-m", "tests.aws.guest", "--endpoint", aws.url, "--region", "us-east-1",
            "--instance", iid])
        for i, iid in enumerate(sorted(instances(aws, name)))
    ]  # fmt: skip


@pytest.mark.parametrize("down_when_idle", [True, False])
def test_an_idle_aws_cluster_ends_itself_and_the_next_command_cleans(
    cli: Shell, aws: StandIn, tmp_path: Path, down_when_idle: bool
) -> None:
    name = "idle-aws"
    flags = ["--idle-minutes", "0.05", *(["--down-when-idle"] if down_when_idle else [])]
    up = cli(*UP, "--name", name, *flags)
    assert up.returncode == 0, up.stderr
    user_data = aws.app.calls("RunInstances")[-1].params["UserData"]
    unit = guest_agent.unit_of_b64(user_data)
    assert " --halt " in unit
    assert guest_agent.backstop_of_b64(user_data) is None, "no deadline: no scheduled power-off"
    assert "--idle-s 3.0 --sessions" in unit
    assert not aws.app.calls(service="iam"), "no identity, role or policy: nothing to leak"
    with guest_agent.running(run_agents(aws, tmp_path, name)):
        wait_for(lambda: set(instances(aws, name).values()) == {"terminated"}, timeout=60,
                 what="the idle nodes to power themselves off")  # fmt: skip
    for i in range(2):
        said = json.loads((tmp_path / f"node-{i}.stopped.json").read_text())
        assert said["why"] == "idle for 3 s"

    after = cli("status", name)
    assert after.returncode == 0, after.stderr
    ec2 = aws.client("ec2")
    if down_when_idle:
        assert f"{name} stopped itself (it was idle); removed what was left: " in after.stderr
        assert "security group" in after.stderr
        assert cli.status()["clusters"] == []
    else:
        kept = f"{name} stopped itself (it was idle); `cloudtrain up` brings it back"
        assert kept in after.stderr
        assert cli.status()["clusters"][0]["status"] == "stopped"
        assert cli("down", name).returncode == 0
    assert_empty(ec2, name)


def test_a_lifetime_on_aws_ends_nodes_with_a_job_running(
    cli: Shell, aws: StandIn, tmp_path: Path
) -> None:
    name = "life-aws"
    up = cli(*UP, "--name", name, "--max-hours", "0.002")  # 7.2 s
    assert up.returncode == 0, up.stderr
    ends_at = cli.status()["clusters"][0]["spec"]["limits"]["ends_at"]
    user_data = aws.app.calls("RunInstances")[-1].params["UserData"]
    unit = guest_agent.unit_of_b64(user_data)
    found = re.search(r"--ends-in ([0-9.]+) --why lifetime", unit)
    assert found, unit
    assert 0 < float(found.group(1)) <= 7.2, "the seconds left when it was asked for"
    # with every process of cloudtrain on it gone, the guest still powers off (and EC2
    # terminates it): the 7.2 s left, rounded up to a minute, and 2 minutes' margin
    assert guest_agent.backstop_of_b64(user_data) == ["shutdown", "-h", "+3"]
    with guest_agent.running(run_agents(aws, tmp_path, name)):
        wait_for(lambda: set(instances(aws, name).values()) == {"terminated"}, timeout=60,
                 what="the lifetime to end the nodes")  # fmt: skip
    assert time.time() >= ends_at
    after = cli("status")
    assert f"{name} stopped itself (its lifetime ended); removed what was left" in after.stderr
    assert_empty(aws.client("ec2"), name)


def test_a_budget_spent_at_up_is_refused_before_anything_is_made(cli: Shell, aws: StandIn) -> None:
    """$0.0001 buys 0.06 s of two $3.06/h V100 nodes: less than the minute EC2 bills."""
    before = len(aws.app.calls(service=None))  # the fixture's own (the AMI's parameter)
    done = cli(*UP, "--name", "spent-aws", "--max-cost", "0.0001")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("Bringing up 'spent-aws'"), done.stderr
    assert len(lines) == 2, "then one line that says why; no traceback"
    del lines[0]
    assert "--max-cost 0.0001: a budget must pay for at least one minute of the cluster" in lines[0]
    made = [c.action for c in aws.app.calls(service=None)[before:]
            if c.action.startswith(("Run", "Create", "Import", "Allocate", "Put"))]  # fmt: skip
    assert made == [], "nothing is made: no instance, security group or key pair"
    assert cli.status()["clusters"] == []
    assert_empty(aws.client("ec2"), "spent-aws")
