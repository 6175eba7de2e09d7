"""The CLI end to end against the GCE stand-in, as a user runs it: a subprocess whose
google-auth finds the stand-in's credentials file (GOOGLE_APPLICATION_CREDENTIALS) and whose
provider finds the stand-in through CLOUDTRAIN_GCP_ENDPOINT."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gcp.standin import StandIn
from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration
# --no-setup: the stand-in's instances are records, not machines; no bootstrap runs on them.
CIDR = ["--ssh-cidr", "203.0.113.7/32"]


def up(gpus: str, *more: str) -> list[str]:
    return [
        "up",
        "--provider",
        "gcp",
        "--gpus",
        gpus,
        "--nodes",
        "2",
        "--name",
        "exp1",
        "--no-setup",
        *CIDR,
        *more,
    ]


@pytest.fixture
def cli(gcp: StandIn, tmp_path: Path) -> Iterator[Shell]:
    shell = Shell(tmp_path / "home")  # made after `gcp` set the environment
    yield shell
    assert gcp.is_empty()


@pytest.mark.parametrize(
    ("gpus", "machine", "price"),
    [
        ("V100:1", "n1-highmem-8", "$5.90/h"),
        ("A100:8", "a2-highgpu-8g", "$58.77/h"),
    ],
)
def test_up_status_down_leave_the_cloud_empty(
    cli: Shell, gcp: StandIn, gpus: str, machine: str, price: str
) -> None:
    dry = cli(*up(gpus), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert machine in dry.stdout
    assert '"minCount": 2' in dry.stdout
    assert "nothing was created" in dry.stdout
    assert gcp.leftovers("exp1") == {"instances": [], "disks": [], "firewalls": [], "policies": []}

    made = cli(*up(gpus), "--max-hours", "6")
    after = time.time()
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"cluster exp1 is up: 2 node(s), {price}" in made.stdout
    assert f"us-central1/us-central1-a: creating 2 × {machine}" in made.stderr
    scheduling = gcp.calls("instances.bulkInsert")[0].body["instanceProperties"]["scheduling"]
    # what is left of the 6 hours `up` resolved into a moment, when the request went out
    record = cli.status()["clusters"][0]
    ends_at = record["spec"]["limits"]["ends_at"]
    assert ends_at == pytest.approx(record["created_at"] + 6 * 3600, abs=0.01)
    assert ends_at - after <= int(scheduling["maxRunDuration"]["seconds"]) <= 6 * 3600
    status = cli("status", "--json", "--refresh")
    cluster = json.loads(status.stdout)["clusters"][0]
    assert [n["index"] for n in cluster["nodes"]] == [0, 1]
    assert cluster["status"] == "up"

    state = b"".join(p.read_bytes() for p in cli.home.glob("state.db*"))
    logs = (made.stdout + made.stderr + dry.stdout + dry.stderr).encode()
    for secret in (b"PRIVATE KEY", gcp.private_key.splitlines()[5].encode()):
        assert secret not in state
        assert secret not in logs

    again = cli(*up(gpus), "--max-hours", "6")  # idempotent: nothing new
    assert again.returncode == 0, again.stderr
    assert len(gcp.calls("instances.bulkInsert")) == 1

    down = cli("down", "exp1")
    assert down.returncode == 0, down.stderr
    assert "cluster exp1 is down" in down.stdout
    assert not (cli.home / "keys" / "exp1").exists()
    assert gcp.is_empty()


def test_down_finds_the_cluster_by_label_when_the_state_is_lost(cli: Shell, gcp: StandIn) -> None:
    assert cli(*up("V100:1"), "--project", "standin-project").returncode == 0
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (cli.home / name).unlink(missing_ok=True)
    assert not gcp.is_empty("exp1")
    down = cli("down", "exp1", "--provider", "gcp", "--project", "standin-project")
    assert down.returncode == 0, down.stderr
    assert "cluster exp1 is down" in down.stdout


def test_capacity_failover_is_printed_and_no_capacity_exits_3(cli: Shell, gcp: StandIn) -> None:
    gcp.add_fault(
        "instances.bulkInsert",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        zone="us-central1-a",
        in_operation=True,
    )
    gcp.add_fault("instances.bulkInsert", "UNSUPPORTED_OPERATION", zone="us-central1-b")
    made = cli(*up("A100:8"))
    assert made.returncode == 0, made.stderr
    assert (
        "us-central1/us-central1-a: ZONE_RESOURCE_POOL_EXHAUSTED; trying the next zone"
        in made.stderr
    )
    assert "us-central1/us-central1-b: UNSUPPORTED_OPERATION; trying the next zone" in made.stderr
    assert "us-central1/us-central1-c: creating 2 × a2-highgpu-8g" in made.stderr
    assert cli("down", "exp1").returncode == 0

    gcp.add_fault(
        "instances.bulkInsert", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", in_operation=True
    )
    failed = cli(*up("A100:8"))
    assert failed.returncode == 3
    assert "no zone had 2 × a2-highgpu-8g" in failed.stderr
    assert "us-central1-f: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in failed.stderr
    assert json.loads(cli("status", "--json").stdout)["clusters"] == []
    assert gcp.is_empty()


@pytest.mark.parametrize("in_operation", [False, True], ids=["in-answer", "in-operation"])
def test_quota_error_exits_3_naming_the_quota(cli: Shell, gcp: StandIn, in_operation: bool) -> None:
    gcp.add_fault(
        "instances.bulkInsert",
        "QUOTA_EXCEEDED",
        in_operation=in_operation,
        quota="GPUS_ALL_REGIONS",
    )
    failed = cli(*up("V100:1"))
    assert failed.returncode == 3, failed.stderr
    assert "GPUS_ALL_REGIONS" in failed.stderr
    assert gcp.is_empty()


def test_two_ups_of_one_name_at_once_make_one_cluster(cli: Shell, gcp: StandIn) -> None:
    """Started together on GCP too: one waits for the other's lock, then finds the cluster;
    one bulkInsert, two instances, one host key pinned."""
    first, second = cli.popen(*up("V100:1")), cli.popen(*up("V100:1"))
    outputs = [p.communicate(timeout=240)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    assert len(gcp.calls("instances.bulkInsert")) == 1
    assert len(gcp.leftovers("exp1")["instances"]) == 2
    folder = cli.home / "keys" / "exp1"
    host_key = (folder / "ssh_host_ed25519_key.pub").read_text().split()[1]
    pinned = {line.split()[2] for line in (folder / "known_hosts").read_text().splitlines()}
    assert pinned == {host_key}
    assert cli("down", "exp1").returncode == 0
