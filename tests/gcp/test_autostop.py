"""An idle or ended GCP cluster stops billing with the user's machine off and no credential on
a node: each node's agent powers its guest off, GCE leaves the instance TERMINATED (its disk
still bills), and the next command here deletes the instances, their disks and the firewall
rules. ``maxRunDuration`` carries the lifetime as well, for a node whose agent is gone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import guest_agent
from tests.gcp.standin import GUEST, StandIn
from tests.integration.conftest import Shell, wait_for

pytestmark = pytest.mark.integration
UP = ["up", "--provider", "gcp", "--gpus", "V100:1", "--nodes", "2", "--no-setup",
      "--ssh-cidr", "203.0.113.7/32"]  # fmt: skip


@pytest.fixture
def cli(gcp: StandIn, tmp_path: Path) -> Shell:
    return Shell(tmp_path / "home")


def statuses(gcp: StandIn) -> dict[tuple[str, str], str]:
    return {key: inst["status"] for key, inst in gcp.gce.instances.items()}


def run_agents(gcp: StandIn, tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    """Each node's agent as its metadata says; its power-off is the stand-in's guest halt."""
    body = gcp.calls("instances.bulkInsert")[-1].body or {}
    metadata = {i["key"]: i["value"] for i in body["instanceProperties"]["metadata"]["items"]}
    unit = guest_agent.unit_of(metadata["user-data"].encode("latin-1"))
    agents: list[subprocess.Popen[bytes]] = []
    for i, (zone, name) in enumerate(sorted(gcp.gce.instances)):
        halt = ["python", "-c", "import sys, urllib.request; urllib.request.urlopen("
                "urllib.request.Request(sys.argv[1], method='POST'), timeout=30)",
                f"{gcp.url}{GUEST}{zone}/{name}"]  # fmt: skip
        agents.append(guest_agent.start(tmp_path / f"node-{i}", unit, halt))
    return agents


def test_an_ended_gcp_cluster_powers_off_and_the_next_command_deletes_it(
    cli: Shell, gcp: StandIn, tmp_path: Path
) -> None:
    name = "budget-gcp"
    up = cli(*UP, "--name", name, "--max-cost", "0.1")  # $5.90/h for both: ~61 s, about the least
    assert up.returncode == 0, up.stderr
    record = cli.status()["clusters"][0]
    limits = record["spec"]["limits"]
    assert limits["ends_why"] == "budget"
    assert limits["ends_at"] == pytest.approx(record["created_at"] + 0.1 / 5.90 * 3600, abs=1)
    body = gcp.calls("instances.bulkInsert")[-1].body or {}
    scheduling = body["instanceProperties"]["scheduling"]
    assert scheduling["instanceTerminationAction"] == "DELETE"
    assert 50 <= int(scheduling["maxRunDuration"]["seconds"]) <= 62, "GCE ends them too"
    assert not [c for c in gcp.calls() if "serviceAccount" in json.dumps(c.body or {})]

    with guest_agent.running(run_agents(gcp, tmp_path)):
        wait_for(lambda: set(statuses(gcp).values()) == {"TERMINATED"}, timeout=120,
                 what="the nodes to power themselves off at the end of the budget")  # fmt: skip
    assert gcp.leftovers(name)["disks"], "a stopped instance keeps its disk (it bills)"

    after = cli("status")
    assert after.returncode == 0, after.stderr
    assert f"{name} stopped itself (its budget ended); removed what was left" in after.stderr
    assert cli.status()["clusters"] == []
    assert gcp.is_empty(name), gcp.leftovers(name)


def test_idle_nodes_stop_and_the_next_command_removes_their_disks(
    cli: Shell, gcp: StandIn, tmp_path: Path
) -> None:
    name = "idle-gcp"
    assert cli(*UP, "--name", name, "--idle-minutes", "0.05").returncode == 0
    with guest_agent.running(run_agents(gcp, tmp_path)):
        wait_for(lambda: set(statuses(gcp).values()) == {"TERMINATED"}, timeout=60,
                 what="the idle nodes to power themselves off")  # fmt: skip
    after = cli("status", name)
    # a stopped GCE instance keeps a disk that bills, and `up` does not start it: removed
    assert f"{name} stopped itself (it was idle); removed what was left: " in after.stderr
    assert "TERMINATED" not in after.stderr
    assert "(stopped)" in after.stderr or ", stopped)" in after.stderr
    assert cli.status()["clusters"] == []
    assert gcp.is_empty(name), gcp.leftovers(name)
