"""What the user sees when a provider says no, or the cloud changed behind cloudtrain's back."""

from __future__ import annotations

from pathlib import Path

from cloudtrain.providers.fake.provider import _CLOUDS, ZONES, FakeCloud
from cloudtrain.state import State
from tests.conftest import Cli


def test_capacity_errors_move_to_the_next_zone(run_cli: Cli, home: Path) -> None:
    cloud = _CLOUDS[home] = FakeCloud(exhausted_zones={"fake-1a"})
    result = run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2")
    assert result.exit_code == 0, result.output
    assert "fake-1/fake-1a: InsufficientCapacity; trying the next zone" in result.output
    assert {i.zone for i in cloud.live("c1")} == {"fake-1b"}
    assert run_cli("down", "c1").exit_code == 0
    assert cloud.live() == []


def test_no_capacity_anywhere_exits_3_and_leaves_nothing(run_cli: Cli, home: Path) -> None:
    cloud = _CLOUDS[home] = FakeCloud(exhausted_zones=set(ZONES))
    result = run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2")
    assert result.exit_code == 3
    assert "no zone had 2 × fake-cpu: fake-1/fake-1a: InsufficientCapacity; fake-1/fake-1b" in (
        result.output
    )
    assert cloud.live() == []
    with State.open(home) as state:
        assert state.cluster("c1") is None
        assert [i.outcome for i in state.open_intents()] == []


def test_a_quota_error_stops_at_once_with_exit_3(run_cli: Cli, home: Path) -> None:
    cloud = _CLOUDS[home] = FakeCloud(quota_error="VcpuLimitExceeded")
    result = run_cli("up", "--provider", "fake", "--name", "c1")
    assert result.exit_code == 3
    assert "VcpuLimitExceeded" in result.output
    assert len([r for r in cloud.requests if r["action"] == "create"]) == 1


def test_nodes_gone_behind_our_back(run_cli: Cli, home: Path) -> None:
    cloud = _CLOUDS[home] = FakeCloud()
    assert run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2").exit_code == 0
    cloud.live("c1")[1].state = "terminated"  # e.g. a spot reclaim
    script = Path(__file__).resolve().parents[3] / "examples" / "digits_ddp.py"
    result = run_cli("train", "-c", "c1", str(script))
    assert result.exit_code == 2
    assert "cluster 'c1' has 1 of its 2 node(s) running; `cloudtrain up --name c1`" in result.output
    refreshed = run_cli("status", "--refresh")
    assert "partial" in refreshed.output
    assert run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2").exit_code == 0
    assert len(cloud.live("c1")) == 2
    assert run_cli("down", "c1").exit_code == 0


def test_an_interrupted_up_is_reported_and_finished_by_the_next(run_cli: Cli, home: Path) -> None:
    _CLOUDS[home] = FakeCloud()
    with State.open(home) as state:
        state.begin_intent("c1", "apply", {"provider": "fake"})  # a process died here
    warned = run_cli("status")
    assert "an earlier `cloudtrain up` of cluster 'c1' was interrupted" in warned.output
    assert run_cli("up", "--provider", "fake", "--name", "c1").exit_code == 0
    with State.open(home) as state:
        assert state.open_intents() == []
    assert run_cli("down", "c1").exit_code == 0


def test_detach_with_down_is_refused(run_cli: Cli) -> None:
    script = Path(__file__).resolve().parents[3] / "examples" / "digits_ddp.py"
    result = run_cli("train", "-c", "x", "--detach", "--down", str(script))
    assert result.exit_code == 2
    assert "--detach and --down together" in result.output


def test_status_refresh_reports_drift(run_cli: Cli, home: Path) -> None:
    cloud = _CLOUDS[home] = FakeCloud()
    assert run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2").exit_code == 0
    assert run_cli("up", "--name", "stray").exit_code == 0
    with State.open(home) as state:
        state.delete_cluster("stray")  # a record lost; the local node folder remains
    cloud.live("c1")[0].state = "terminated"
    result = run_cli("status", "--refresh")
    assert "c1: 1 node(s) gone, 0 new, since the last record; updated" in result.output
    assert (
        "cluster 'stray' exists on local (found by its tags) but is not recorded" in result.output
    )
    assert "partial" in result.output
    assert run_cli("down", "stray").exit_code == 0
    assert run_cli("down", "c1").exit_code == 0
