"""Clusters that remove themselves when idle (local provider, the clock in seconds): the
nodes' agents act with nothing running on the user's side; a running job keeps them; the next
command says what happened and `down` clears what is left."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.integration.conftest import SCRIPTS, Shell, wait_for

pytestmark = pytest.mark.integration


def gone(sh: Shell, name: str) -> bool:
    return not list((sh.home / "local" / name).glob("node-*/node.json"))


def test_an_idle_cluster_removes_itself_with_nothing_running_here(sh: Shell) -> None:
    up = sh("up", "--name", "idle", "--nodes", "2", "--idle-minutes", "0.05")
    assert up.returncode == 0, up.stderr
    assert "idle stops itself after 0.05 idle minute(s) (kept, stopped)" in up.stderr
    assert sh.strays() == [], "nothing of cloudtrain runs on this side: only the nodes' agents"
    wait_for(lambda: gone(sh, "idle"), timeout=60, what="the nodes to remove themselves")
    wait_for(lambda: sh.processes() == [], timeout=30, what="the agents to leave")

    refreshed = sh("status", "idle", "--refresh")
    assert refreshed.returncode == 0, refreshed.stderr
    assert "node-0 removed itself at" in refreshed.stderr
    assert "idle for 3 s" in refreshed.stderr
    assert "idle stopped itself (it was idle); `cloudtrain up` brings it back" in refreshed.stderr
    assert sh.status()["clusters"][0]["status"] == "stopped"
    assert sh("down", "idle").returncode == 0
    assert not (sh.home / "local" / "idle").exists()
    assert sh.status()["clusters"] == []


def test_a_running_job_keeps_it_and_the_clock_starts_when_the_job_ends(sh: Shell) -> None:
    assert sh("up", "--name", "busy", "--nodes", "1").returncode == 0
    start = sh("train", "-c", "busy", "--detach", str(SCRIPTS / "sleeper.py"))
    assert start.returncode == 0, start.stderr
    told = sh("autostop", "busy", "--idle-minutes", "0.05")
    assert told.returncode == 0, told.stderr
    assert "cluster busy stops itself after 0.05 idle minute(s) (kept, stopped)" in told.stdout
    time.sleep(8)  # well past the idle time: the job holds it
    assert not gone(sh, "busy")
    shown = sh("status", "busy")
    assert "node 0: agent up, running busy-1, removes itself" not in shown.stdout
    assert "node 0: agent up, running busy-1" in shown.stdout, shown.stdout
    assert sh("cancel", "busy-1").returncode == 0
    ended = time.monotonic()
    wait_for(lambda: gone(sh, "busy"), timeout=60, what="the node to remove itself")
    assert time.monotonic() - ended >= 2, "the idle clock started when the job ended"
    assert sh("down", "busy").returncode == 0


def test_off_keeps_the_cluster_and_status_says_when_it_would_stop(sh: Shell) -> None:
    assert sh("up", "--name", "keep", "--nodes", "1", "--idle-minutes", "60").returncode == 0
    shown = sh("status", "keep")
    assert "node 0: agent up, idle for" in shown.stdout, shown.stdout
    table = sh("status").stdout
    assert "idle " in table
    assert "stops in 59m" in table or "stops in 1h" in table, table
    assert "removes itself in 59m" in shown.stdout or "removes itself in 1h" in shown.stdout
    off = sh("autostop", "keep", "--off")
    assert off.returncode == 0, off.stderr
    assert "cluster keep never stops by itself" in off.stdout
    assert "stays until `cloudtrain down`" in sh("status", "keep").stdout
    events = [e["message"] for e in sh.status()["events"]]
    assert events[-2:] == [
        "the nodes stop themselves: after 60 idle minute(s) (kept, stopped)",
        "the nodes stop themselves: never",
    ]
    assert sh("down", "keep").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--idle-minutes", "0"), "idle_minutes '0': give minutes above 0"),
        (("--idle-minutes", "soon"), "idle_minutes 'soon': give minutes above 0"),
        (("--idle-minutes", "20000"), "at most 10080 (a week)"),
        (("--max-hours", "1", "--max-cost", "0.5"), "--max-cost 0.5: a local cluster has no price"),
        (
            ("--provider", "fake", "--idle-minutes", "5"),
            "provider 'fake' takes no --idle-minutes (got 5.0)",
        ),
    ],
)
def test_a_bad_idle_time_costs_nothing(sh: Shell, args: tuple[str, ...], message: str) -> None:
    done = sh("up", "--name", "bad", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert sh.status()["clusters"] == []
    assert not (sh.home / "local" / "bad").exists()


def test_autostop_on_a_node_that_went_away_says_so_and_makes_nothing_again(sh: Shell) -> None:
    from cloudtrain.node import procs

    assert sh("up", "--name", "lost", "--nodes", "1").returncode == 0
    root = sh.home / "local" / "lost" / "node-0"
    procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(root)}, grace_s=0)
    shutil.rmtree(root)
    told = sh("autostop", "lost", "--idle-minutes", "5")
    assert told.returncode == 3, told.stderr
    assert f"no node at {root} (it went away)" in told.stderr
    assert not root.exists(), "its folder is not made again"
    assert sh("down", "lost").returncode == 0


def test_a_budget_deletes_the_cluster_and_the_next_command_removes_the_rest(sh: Shell) -> None:
    """$18/h for 2 nodes is half a cent a second: a $0.30 budget (a minute, the least it may
    buy) ends 60 s after `up`, with this side off; the next `status` removes what the nodes
    left and says why; the cost shown is price × hours to the cent all along."""
    up = sh("up", "--name", "budget", "--nodes", "2", "--node-price", "9", "--max-cost", "0.30")
    assert up.returncode == 0, up.stderr
    assert "budget stops itself at " in up.stderr
    assert "when its budget ends" in up.stderr
    record = sh.status()["clusters"][0]
    ends_at = record["spec"]["limits"]["ends_at"]
    assert ends_at == pytest.approx(record["created_at"] + 60, abs=0.01)
    assert record["price_per_hour"] == 18.0
    shown = sh("status")
    now = time.time()
    assert "budget ends in" in shown.stdout
    cost = 18.0 * (now - record["created_at"]) / 3600
    assert f"{cost:.2f}" in shown.stdout or f"{cost - 0.01:.2f}" in shown.stdout
    assert sh.strays() == [], "nothing of cloudtrain runs on this side"
    wait_for(lambda: gone(sh, "budget"), timeout=120, what="the nodes to remove themselves")

    after = sh("status", "budget")
    assert after.returncode == 0, after.stderr
    assert "budget stopped itself (its budget ended); removed what was left: " in after.stderr
    assert "node-1 removed itself at" in after.stderr
    assert sh.status()["clusters"] == [], "the record went with the leftovers"
    assert not (sh.home / "local" / "budget").exists()
    assert "its budget ended" in after.stdout, "`status NAME` still tells the story"
    assert sh("down", "budget").returncode == 0, "nothing left: down is a no-op"
    again = sh("train", "-c", "budget", str(SCRIPTS / "sleeper.py"))
    assert again.returncode != 0
    assert "no cluster named 'budget'" in again.stderr


def test_a_lifetime_ends_a_busy_cluster_and_the_cost_stops_with_it(sh: Shell) -> None:
    up = sh(
        "up", "--name", "life", "--nodes", "1", "--node-price", "3.6", "--max-hours", "0.008"
    )  # fmt: skip  (28.8 s: time for `up` and `train` on a slow machine)
    assert up.returncode == 0, up.stderr
    job = sh("train", "-c", "life", "--detach", str(SCRIPTS / "sleeper.py"))
    assert job.returncode == 0, job.stderr
    assert "warning: cluster 'life' ends in " in job.stderr
    assert "(its lifetime, set at `up`); a job still running then is stopped" in job.stderr
    wait_for(lambda: gone(sh, "life"), timeout=90, what="the lifetime (28.8 s) to end the node")
    late = sh("train", "-c", "life", str(SCRIPTS / "sleeper.py"))  # the next command
    assert "life stopped itself (its lifetime ended); removed what was left" in late.stderr
    assert "no cluster named 'life'" in late.stderr
    record = sh.status()["clusters"]
    assert record == [], "ended: removed by the next command"
    events = [e["message"] for e in sh.status()["events"] if e["cluster"] == "life"]
    assert any("life stopped itself (its lifetime ended)" in e for e in events), events
