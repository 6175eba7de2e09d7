"""`cloudtrain cost`, `cloudtrain events`, and the cost so far in `status`, in-process: from a
history recorded in the state (clusters already down), and from the fake provider."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pytest

from cloudtrain.cli.options import parse_since
from cloudtrain.errors import ConfigError
from cloudtrain.model import NodeInfo
from cloudtrain.providers.fake.provider import _CLOUDS, ZONES, FakeCloud
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State
from tests.conftest import Cli

NOW = 1_800_000_000.0


# -- --since ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ago_s"), [("30d", 30 * 86400), ("12h", 12 * 3600), ("90m", 90 * 60), ("0m", 0)]
)
def test_since_takes_a_duration_back_from_now(text: str, ago_s: int) -> None:
    assert parse_since(text, NOW) == NOW - ago_s


def test_since_takes_an_iso_date_or_time() -> None:
    midnight = datetime.datetime(2026, 11, 1).astimezone().timestamp()  # local time
    assert parse_since("2026-11-01", NOW) == midnight
    assert (
        parse_since("2026-11-01T09:30:00+02:00", NOW)
        == datetime.datetime(2026, 11, 1, 7, 30, tzinfo=datetime.UTC).timestamp()
    )


@pytest.mark.parametrize("text", ["3x", "", "30", "-1d", "1.5h", "30 days", "yesterday"])
def test_a_bad_since_names_the_flag_the_value_and_what_is_allowed(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_since(text, NOW)
    assert str(err.value) == (
        f"--since {text!r}: give 30d, 12h, 90m (back from now), or an ISO date or time "
        "(2026-11-01, 2026-11-01T09:30)"
    )


def test_a_since_in_the_future_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--since '2030-01-01' is in the future; give 30d"):
        parse_since("2030-01-01", NOW)


@pytest.mark.parametrize("command", ["cost", "events"])
def test_a_bad_since_is_one_line_and_exit_2(run_cli: Cli, command: str) -> None:
    result = run_cli(command, "--since", "3x")
    assert result.exit_code == 2
    assert result.output == (
        "error: --since '3x': give 30d, 12h, 90m (back from now), or an ISO date or time "
        "(2026-11-01, 2026-11-01T09:30)\n"
    )


# -- a recorded history ----------------------------------------------------------------------


def recorded(home: Path) -> float:
    """Two clusters, both down: "big" ran 2 on-demand nodes at $32.77 for an hour (a job on
    node 0 for half of it), "cheap" one spot node at $1.234 for half an hour. Its start."""
    t0 = float(int(time.time()) - 3 * 86400)
    clock = [t0]
    with State.open(home, clock=lambda: clock[0]) as st:
        for name, nodes, price, spot in (("big", 2, 32.77, False), ("cheap", 1, 1.234, True)):
            spec = ClusterSpec(name, "aws", nodes, Resources("A100", 8, spot=spot))
            offer = {"region": "us-east-1", "price_per_node_hour": price, "spot": spot}
            st.put_cluster(
                spec,
                status=ClusterStatus.UP,
                price_per_hour=price * nodes,
                plan={"offers": [offer]},
            )
            st.set_nodes(
                name,
                [NodeInfo(name, i, f"{name}-{i}", None, None, "running") for i in range(nodes)],
            )
            st.add_event(name, "up", f"{nodes} node(s) running")
        job = st.new_job("big", "train", num_nodes=1, nproc_per_node=8, command=["t.py"])
        st.update_job(job.id, status="running", started_at=t0 + 600, detail={"ran_on": [0]})
        st.add_event("big", "job", f"job {job.id} running on 1 node(s)", job_id=job.id)
        clock[0] = t0 + 1800
        st.delete_cluster("cheap")
        clock[0] = t0 + 2400
        st.finish_job(job.id, "succeeded", exit_code=0)
        clock[0] = t0 + 3600
        st.delete_cluster("big")
        st.add_event("big", "down", "cluster 'big' terminated")
    return t0


def test_cost_json_has_clusters_already_down_to_the_cent(run_cli: Cli, home: Path) -> None:
    recorded(home)
    result = run_cli("cost", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["by"], data["currency"]) == ("cluster", "USD")
    assert data["rows"] == [
        {
            "name": "big",
            "cluster": "big",
            "provider": "aws",
            "status": "down",
            "node_hours": 2.0,
            "prices_per_node_hour": [32.77],
            "cost": 65.54,
            "estimate": False,
            "price_unknown": False,
        },
        # 0.5 h × 1.234 = 0.617
        {
            "name": "cheap",
            "cluster": "cheap",
            "provider": "aws",
            "status": "down",
            "node_hours": 0.5,
            "prices_per_node_hour": [1.234],
            "cost": 0.62,
            "estimate": True,
            "price_unknown": False,
        },
    ]
    assert (data["total"]["cost"], data["total"]["node_hours"]) == (66.16, 2.5)
    assert data["total"]["estimate"] is True


def test_cost_by_job_and_by_provider(run_cli: Cli, home: Path) -> None:
    recorded(home)
    jobs = json.loads(run_cli("cost", "--by", "job", "--json").output)
    # 1800 s of one node × $32.77 = 16.385: half to even
    assert [
        (r["name"], r["cluster"], r["status"], r["node_hours"], r["cost"]) for r in jobs["rows"]
    ] == [("big-1", "big", "succeeded", 0.5, 16.38)]
    providers = json.loads(run_cli("cost", "--by", "provider", "--json").output)
    assert [(r["name"], r["cost"], r["estimate"]) for r in providers["rows"]] == [
        ("aws", 66.16, True)
    ]


def test_cost_table_marks_the_estimate_and_a_narrow_window_has_nothing(
    run_cli: Cli, home: Path
) -> None:
    recorded(home)
    table = run_cli("cost").output
    assert "spend since " in table
    assert "(30d), by cluster" in table
    big = next(line for line in table.splitlines() if "│ big " in line)
    assert [cell.strip() for cell in big.split("│")[1:-1]] == [
        "big",
        "aws",
        "down",
        "2.000",
        "32.77",
        "65.54",
        "",
    ]
    cheap = next(line for line in table.splitlines() if "│ cheap " in line)
    assert "│    1.234 │" in cheap, "every digit of the price recorded"
    assert "~0.62" in cheap
    assert "estimate (spot)" in cheap
    total = next(line for line in table.splitlines() if "│ total " in line)
    assert "~66.16" in total
    by_job = run_cli("cost", "--by", "job").output
    assert "big-1" in by_job
    assert "a job is charged the nodes it ran on, while it ran" in by_job
    assert run_cli("cost", "--since", "1d").output == "no spend since 1d: no node billed then\n"


# -- events ----------------------------------------------------------------------------------


def test_events_lists_what_happened_oldest_first(run_cli: Cli, home: Path) -> None:
    t0 = recorded(home)
    lines = run_cli("events", "big").output.splitlines()
    when = datetime.datetime.fromtimestamp(t0).astimezone().isoformat(timespec="seconds")
    assert lines[0] == f"{when}  big  -  up  2 node(s) running"
    assert [line.split("  ", 1)[1] for line in lines] == [
        "big  -  up  2 node(s) running",
        "big  big-1  job  job big-1 running on 1 node(s)",
        "big  -  down  cluster 'big' terminated",
    ]
    assert run_cli("events", "big-1").output.splitlines() == [lines[1]]
    every = run_cli("events").output.splitlines()
    assert len(every) == 4
    quiet = run_cli("events", "--since", "1d")
    assert (quiet.stdout, quiet.stderr) == ("", "no events since 1d\n")
    listed = json.loads(run_cli("events", "cheap", "--json").output)
    assert [(e["cluster"], e["job"], e["kind"], e["message"]) for e in listed] == [
        ("cheap", None, "up", "1 node(s) running")
    ]
    assert listed[0]["ts"] == t0


def test_a_hostile_message_cannot_pass_for_an_event_or_drive_the_terminal(
    run_cli: Cli, home: Path
) -> None:
    with State.open(home) as st:
        st.add_event(
            "c1",
            "bootstrap",
            "\x1b]52;c;ZXZpbA==\x07failed\n2026-01-01T00:00:00+00:00"
            "  c1  -  down  cluster 'c1' terminated",
        )
    out = run_cli("events", "c1").output
    assert "\x1b" not in out
    assert "\\x1b]52;c;ZXZpbA==\\x07failed\n    2026-01-01T00:00:00+00:00  c1  -  down" in out


def test_events_of_an_unknown_or_bad_name_is_exit_2(run_cli: Cli) -> None:
    unknown = run_cli("events", "nope")
    assert unknown.exit_code == 2
    assert unknown.output == (
        "error: no cluster or job named 'nope' has events; `cloudtrain events` lists all\n"
    )
    bad = run_cli("events", "Bad;rm")
    assert bad.exit_code == 2
    assert bad.output.startswith("error: NAME 'Bad;rm' is neither a cluster name")


# -- what the provisioning records --------------------------------------------------------------


def kinds_and_messages(run_cli: Cli, name: str) -> list[tuple[str, str]]:
    return [(e["kind"], e["message"]) for e in json.loads(run_cli("events", name, "--json").output)]


def test_a_failed_zone_and_the_clusters_life_are_events(run_cli: Cli, home: Path) -> None:
    _CLOUDS[home] = FakeCloud(exhausted_zones={"fake-1a"})
    assert run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2").exit_code == 0
    assert run_cli("down", "c1").exit_code == 0
    assert kinds_and_messages(run_cli, "c1") == [
        ("up", "provisioning 2 node(s) on fake"),
        (
            "capacity",
            "create attempt failed in fake-1/fake-1a: InsufficientCapacity; trying the next zone",
        ),
        ("up", "2 node(s) running"),
        ("up", "cluster 'c1' is up: 2 node(s) ready"),
        ("down", "cluster 'c1' terminated"),
    ]


def test_an_up_that_made_nothing_is_an_event(run_cli: Cli, home: Path) -> None:
    _CLOUDS[home] = FakeCloud(exhausted_zones=set(ZONES))
    assert run_cli("up", "--provider", "fake", "--name", "c1").exit_code == 3
    last = kinds_and_messages(run_cli, "c1")[-1]
    assert last[0] == "up"
    assert last[1].startswith("up failed: fake: NoCapacity: no zone had 1 × fake-cpu: ")
    assert last[1].endswith("; nothing was made")


def test_status_shows_the_cost_so_far_and_a_node_gone_is_an_event(run_cli: Cli, home: Path) -> None:
    cloud = _CLOUDS[home] = FakeCloud()
    assert run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2").exit_code == 0
    assert run_cli("up", "--provider", "fake", "--name", "s1", "--spot").exit_code == 0
    data = json.loads(run_cli("status", "--json").output)
    spent = {c["name"]: (c["cost_so_far"], c["cost_is_estimate"]) for c in data["clusters"]}
    assert spent == {"c1": (0.0, False), "s1": (0.0, True)}  # a second at $1/h: no cent yet
    table = run_cli("status").output
    assert "~0.00" in table
    assert "~ a spot price's estimate" in table
    gone = next(i for i in cloud.live("c1") if i.tags["cloudtrain:node"] == "1")
    gone.state = "terminated"  # preempted, behind cloudtrain's back
    assert run_cli("status", "--refresh").exit_code == 0
    assert ("node", f"node 1 ({gone.instance_id}) is gone: fake no longer has it") in (
        kinds_and_messages(run_cli, "c1")
    )
    with State.open(home) as st:
        assert [(s.index, s.end_reason) for s in st.spans("c1")] == [(0, None), (1, "gone")]
    assert run_cli("down", "--all", "--yes").exit_code == 0
