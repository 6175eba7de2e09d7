"""The CLI end to end against the AWS stand-in, as a user runs it: a subprocess whose boto3
finds the stand-in through AWS_ENDPOINT_URL, as any AWS tool would."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.model import TAG_CLUSTER_ID
from tests.aws.standin import StandIn, assert_empty, leftovers, put_dlami_parameter, register_dlami
from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration
# --no-setup: moto's instances are records, not machines; no bootstrap runs on them to watch.
UP = ["up", "--provider", "aws", "--gpus", "A100:8", "--nodes", "4", "--name", "exp1", "--no-setup"]
CIDR = ["--ssh-cidr", "203.0.113.7/32"]


@pytest.fixture
def cli(aws: StandIn, tmp_path: Path) -> Iterator[Shell]:
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        put_dlami_parameter(aws.client("ssm", region), register_dlami(aws.client("ec2", region)))
    shell = Shell(tmp_path / "home")  # made after `aws` set the environment
    yield shell
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        assert_empty(aws.client("ec2", region), "exp1")


def test_up_status_down_leave_the_cloud_empty(cli: Shell, aws: StandIn) -> None:
    dry = cli(*UP, *CIDR, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "p4d.24xlarge" in dry.stdout
    assert '"MinCount": 4' in dry.stdout
    assert "nothing was created" in dry.stdout
    assert not any(c.action.startswith(("Create", "Run", "Import")) for c in aws.app.calls())

    up = cli(*UP, *CIDR)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "cluster exp1 is up: 4 node(s), $131.09/h" in up.stdout
    assert "us-east-1/us-east-1a: creating 4 × p4d.24xlarge" in up.stderr
    status = cli("status", "--json", "--refresh")
    cluster = json.loads(status.stdout)["clusters"][0]
    assert [n["index"] for n in cluster["nodes"]] == [0, 1, 2, 3]
    assert cluster["status"] == "up"

    state = b"".join(p.read_bytes() for p in cli.home.glob("state.db*"))
    logs = (up.stdout + up.stderr + dry.stdout + dry.stderr).encode()
    for secret in (b"PRIVATE KEY", b"AWS_SECRET", b"testing"):  # testing: the secret key here
        assert secret not in state
        assert secret not in logs

    again = cli(*UP, *CIDR)  # idempotent: nothing new
    assert again.returncode == 0
    assert len(aws.app.calls("RunInstances")) == 1

    down = cli("down", "exp1")
    assert down.returncode == 0, down.stderr
    assert "cluster exp1 is down" in down.stdout
    assert not (cli.home / "keys" / "exp1").exists()
    assert cli("down", "exp1").stdout.startswith("nothing to do")


def test_down_finds_the_cluster_by_tag_when_the_state_is_lost(cli: Shell, aws: StandIn) -> None:
    assert cli(*UP, *CIDR).returncode == 0
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (cli.home / name).unlink(missing_ok=True)
    assert any(leftovers(aws.client("ec2"), "exp1").values())
    down = cli("down", "exp1", "--provider", "aws")
    assert down.returncode == 0, down.stderr
    assert "cluster exp1 is down" in down.stdout


def test_capacity_failover_is_printed_and_no_capacity_exits_3(cli: Shell, aws: StandIn) -> None:
    aws.app.add_fault("RunInstances", "InsufficientInstanceCapacity", zone="us-east-1a")
    up = cli(*UP, *CIDR)
    assert up.returncode == 0, up.stderr
    assert "us-east-1/us-east-1a: InsufficientInstanceCapacity; trying the next zone" in up.stderr
    assert cli("down", "exp1").returncode == 0

    aws.app.add_fault("RunInstances", "InsufficientInstanceCapacity")
    failed = cli(*UP, *CIDR)
    assert failed.returncode == 3
    assert "no zone had 4 × p4d.24xlarge" in failed.stderr
    assert json.loads(cli("status", "--json").stdout)["clusters"] == []


def test_quota_error_exits_3_naming_the_quota(cli: Shell, aws: StandIn) -> None:
    aws.app.add_fault("RunInstances", "VcpuLimitExceeded", status=400)
    failed = cli(*UP, *CIDR)
    assert failed.returncode == 3
    assert "Running On-Demand P instances" in failed.stderr


def test_ssh_is_opened_to_the_callers_address_found_or_to_the_world_only_when_asked(
    cli: Shell, aws: StandIn, my_ip_url: str
) -> None:
    cli.env["CLOUDTRAIN_PUBLIC_IP_URL"] = my_ip_url
    assert cli(*UP).returncode == 0
    group = aws.client("ec2").describe_security_groups(GroupNames=["cloudtrain-exp1"])
    ssh = [r for r in group["SecurityGroups"][0]["IpPermissions"] if r.get("FromPort") == 22]
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == ["198.51.100.9/32"]
    recorded = json.loads(cli("status", "--json").stdout)["clusters"][0]["spec"]
    assert recorded["ssh_cidr"] == "198.51.100.9/32"  # what was opened, not "the default"
    assert cli("down", "exp1").returncode == 0

    world = cli(*UP, "--ssh-cidr", "0.0.0.0/0")
    assert world.returncode == 0
    assert "SSH is open to the whole internet (0.0.0.0/0), as asked" in world.stderr
    assert cli("down", "exp1").returncode == 0


SMALL = ["up", "--provider", "aws", "--gpus", "V100:1", "--nodes", "2", "--no-setup", *CIDR]


def test_two_ups_of_one_name_at_once_make_one_cluster_with_one_host_key(
    cli: Shell, aws: StandIn
) -> None:
    """Started together: one waits for the other's lock (and says for whom), then finds the
    cluster made; exactly N instances, one host key, and the nodes present that key."""
    first, second = cli.popen(*SMALL, "--name", "exp1"), cli.popen(*SMALL, "--name", "exp1")
    outputs = [p.communicate(timeout=240)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    assert sum("is busy: pid" in out for out in outputs) <= 1
    ec2 = aws.client("ec2")
    assert len(leftovers(ec2, "exp1")["instances"]) == 2
    assert len(aws.app.calls("RunInstances")) == 1
    folder = cli.home / "keys" / "exp1"
    host_key = (folder / "ssh_host_ed25519_key.pub").read_text().split()[1]
    pinned = {line.split()[2] for line in (folder / "known_hosts").read_text().splitlines()}
    assert pinned == {host_key}
    assert cli("down", "exp1").returncode == 0


def test_a_second_owner_of_the_same_name_is_refused_and_cannot_touch_the_first(
    cli: Shell, aws: StandIn, tmp_path: Path
) -> None:
    cli.env["CLOUDTRAIN_OWNER"] = "alice"
    assert cli(*SMALL, "--name", "exp1").returncode == 0
    mine = leftovers(aws.client("ec2"), "exp1")
    bob = Shell(tmp_path / "bob")
    bob.env["CLOUDTRAIN_OWNER"] = "bob"
    before = len(aws.app.calls())
    refused = bob(*SMALL, "--name", "exp1")
    assert refused.returncode == 2
    assert "cluster name 'exp1' is taken on aws by another owner (alice)" in refused.stderr
    assert "Traceback" not in refused.stderr
    made = [c.action for c in aws.app.calls()[before:]]
    assert not [a for a in made if a.startswith(("Create", "Run", "Import", "Authorize"))]
    assert bob.status()["clusters"] == [], "a refused up keeps no record"
    assert bob("down", "exp1", "--provider", "aws").stdout.startswith("nothing to do")
    assert bob("down", "--all", "--provider", "aws", "--yes").stdout.startswith("nothing to do")
    assert leftovers(aws.client("ec2"), "exp1") == mine, "alice's cluster is untouched"
    assert cli("down", "exp1").returncode == 0


def test_down_removes_a_cluster_whose_instances_are_all_gone(cli: Shell, aws: StandIn) -> None:
    """Every instance preempted or deleted by hand, the state lost: `down NAME --provider
    aws` (and `down --all`) still find the security group and key pair by tag."""
    ec2 = aws.client("ec2")
    for name in ("exp1", "exp2"):
        assert cli(*SMALL, "--name", name).returncode == 0
        ec2.terminate_instances(InstanceIds=leftovers(ec2, name)["instances"])
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (cli.home / name).unlink(missing_ok=True)
    down = cli("down", "exp1", "--provider", "aws")
    assert down.returncode == 0, down.stderr
    assert "no node of 'exp1' is left on aws; deleting what remains:" in down.stderr
    assert "cluster exp1 is down" in down.stdout
    assert_empty(ec2, "exp1")
    everything = cli("down", "--all", "--provider", "aws", "--yes")
    assert everything.returncode == 0, everything.stderr
    assert "cluster exp2 is down" in everything.stdout
    assert_empty(ec2, "exp2")


def test_down_owner_cleans_up_from_another_machine(
    cli: Shell, aws: StandIn, tmp_path: Path
) -> None:
    """alice made the cluster on one machine; on another (no record, another default owner)
    `down NAME --owner alice` finds it by its tags and removes it."""
    cli.env["CLOUDTRAIN_OWNER"] = "alice"
    assert cli(*SMALL, "--name", "exp1").returncode == 0
    laptop = Shell(tmp_path / "laptop")
    laptop.env.pop("CLOUDTRAIN_OWNER", None)
    assert laptop("down", "exp1", "--provider", "aws").stdout.startswith("nothing to do")
    down = laptop("down", "exp1", "--provider", "aws", "--owner", "alice")
    assert down.returncode == 0, down.stderr
    assert "cluster exp1 is down" in down.stdout
    assert_empty(aws.client("ec2"), "exp1")


def test_one_owner_on_two_machines_never_acts_on_the_other_machines_cluster(
    cli: Shell, aws: StandIn, tmp_path: Path
) -> None:
    """Two machines share an owner (``CLOUDTRAIN_OWNER=team``). Every resource carries its
    cluster's random id; the second machine's `up` of a name the first holds is refused
    before any write (the first's keys are not there to reach its nodes). Once the second
    machine removed it and made its own, the first machine's stale record neither describes
    nor deletes the new one."""
    ec2 = aws.client("ec2")
    cli.env["CLOUDTRAIN_OWNER"] = "team"
    assert cli(*SMALL, "--name", "exp1").returncode == 0
    first_id = cli.status()["clusters"][0]["spec"]["cluster_id"]
    assert re.fullmatch(r"[0-9a-f]{12}", first_id)
    made = leftovers(ec2, "exp1")
    assert leftovers(ec2, first_id, tag_key=TAG_CLUSTER_ID) == made, "all carry the id"
    assert made["key_pairs"] == [f"cloudtrain-exp1-{first_id}"]

    laptop = Shell(tmp_path / "laptop")
    laptop.env["CLOUDTRAIN_OWNER"] = "team"
    before = len(aws.app.calls())
    refused = laptop(*SMALL, "--name", "exp1")
    assert refused.returncode == 2, refused.stderr
    assert f"held on aws by another cluster of owner team (id {first_id})" in refused.stderr
    writes = [c.action for c in aws.app.calls()[before:]]
    assert not [a for a in writes if a.startswith(("Create", "Run", "Import", "Authorize"))]
    assert laptop.status()["clusters"] == []

    assert laptop("down", "exp1", "--provider", "aws").returncode == 0  # no record: any id
    assert laptop(*SMALL, "--name", "exp1").returncode == 0
    second_id = laptop.status()["clusters"][0]["spec"]["cluster_id"]
    assert second_id != first_id
    theirs = leftovers(ec2, "exp1")
    assert len(theirs["instances"]) == 2

    refreshed = cli("status", "--refresh", "--json")
    assert refreshed.returncode == 0, refreshed.stderr
    assert json.loads(refreshed.stdout)["clusters"][0]["nodes"] == []
    assert cli("down", "exp1").returncode == 0
    assert leftovers(ec2, "exp1") == theirs, "the stale record removed nothing of the laptop's"
    assert laptop("down", "exp1").returncode == 0
