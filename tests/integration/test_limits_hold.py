"""A cluster's lifetime and budget hold when a second thing goes wrong (local provider, real
processes): a budget spent before anything starts, a lifetime that ends under a managed job,
a node whose clock is off by ten minutes, a node whose agent is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.node import procs
from tests.conftest import require_tool
from tests.integration.conftest import SCRIPTS, Shell, is_agent, wait_for

pytestmark = pytest.mark.integration
#: Debian's libfaketime: a process's wall clock moved, its boot clock left as it is.
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def nodes_of(sh: Shell, name: str) -> list[Path]:
    return sorted(p.parent for p in (sh.home / "local" / name).glob("node-*/node.json"))


def ends_at(sh: Shell, name: str) -> float:
    record = next(c for c in sh.status()["clusters"] if c["name"] == name)
    return float(record["spec"]["limits"]["ends_at"])


def up_with_lifetime(sh: Shell, name: str, nodes: int, left_s: float) -> float:
    """`up` the cluster, then give it a lifetime that ends `left_s` from now (a lifetime counts
    from the first `up`, however long its bootstrap took on a busy machine); its end."""
    assert sh("up", "--name", name, "--nodes", str(nodes)).returncode == 0
    record = next(c for c in sh.status()["clusters"] if c["name"] == name)
    hours = (time.time() - float(record["created_at"]) + left_s) / 3600
    told = sh("up", "--name", name, "--nodes", str(nodes), "--max-hours", f"{hours:.6f}")
    assert told.returncode == 0, told.stderr
    return ends_at(sh, name)


def stop_agent(root: Path) -> None:
    """SIGKILL the node's agent and its supervisor (the test's own processes, by pid)."""
    pids = [p for p in procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)}) if is_agent(p)]
    assert pids, f"no agent runs for {root}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(procs.alive(p) for p in pids), timeout=10, what="the agent to go")


def test_a_budget_spent_at_up_is_refused_in_one_line_before_anything_is_made(sh: Shell) -> None:
    """$0.01 at $1998/h lasts 0.018 s: less than the minute any cloud bills a started node."""
    done = sh("up", "--name", "spent", "--nodes", "2", "--node-price", "999", "--max-cost", "0.01")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("Bringing up 'spent'"), done.stderr
    assert len(lines) == 2, "then one line that says why; no traceback"
    del lines[0]
    assert "--max-cost 0.01: a budget must pay for at least one minute of the cluster" in lines[0]
    assert "(2 node(s) at $999.00/h: $33.3000)" in lines[0]
    assert lines[0].startswith("error: --max-cost 0.01: ")
    assert lines[0].endswith("give at least 33.30"), lines[0]
    assert sh.status()["clusters"] == []
    assert not (sh.home / "local" / "spent").exists()
    assert sh.processes() == []
    enough = sh("up", "--name", "spent", "--nodes", "2", "--node-price", "999", "--max-cost",
                "33.30", "--no-setup")  # fmt: skip
    assert enough.returncode == 0, enough.stderr
    assert sh("down", "spent").returncode == 0


def test_a_lifetime_that_ends_under_a_managed_job_makes_no_node_again(sh: Shell) -> None:
    """The lifetime takes the nodes from under a managed job: its watcher sees them
    lost and makes none again; the job ends failed, saying why; the next command removes
    the rest and nothing runs. No command runs here meanwhile: the watcher alone acts."""
    end = up_with_lifetime(sh, "life", 2, 40)
    start = sh("train", "-c", "life", "--managed", "--detach", str(SCRIPTS / "sleeper.py"))
    assert start.returncode == 0, start.stderr
    found = re.search(r"watcher \(pid (\d+)\)", start.stderr)
    assert found, start.stderr
    watcher = int(found.group(1))
    late: list[float] = []  # the nodes made after the end, if any

    def over() -> bool:
        for root in nodes_of(sh, "life"):
            with_tags = root / "node.json"
            try:
                made = float(json.loads(with_tags.read_text())["created"])
            except (OSError, ValueError, KeyError):
                continue
            if made > end:
                late.append(made)
        return not procs.alive(watcher)

    wait_for(over, timeout=end - time.time() + 120, what="the watcher to end with the job")
    job = sh.job("life-1")
    assert late == [], "no node is made after the cluster's lifetime ended"
    assert job["status"] == "failed", job
    assert "cluster 'life': its lifetime ended at " in job["detail"]["reason"], job["detail"]
    assert "no node is made for it again" in job["detail"]["reason"]
    events = [e["message"] for e in sh.status()["events"]]
    assert not any("replacing node(s)" in e for e in events), events
    wait_for(lambda: sh.processes() == [], timeout=30, what="the watcher and agents to leave")
    after = sh("status", "life")
    assert after.returncode == 0, after.stderr
    assert sh.status()["clusters"] == []
    again = sh("up", "--name", "life", "--nodes", "2", "--max-hours", "0.01", "--no-setup")
    assert again.returncode == 0, "a new cluster of the name counts its lifetime anew"
    assert sh("down", "life").returncode == 0


def test_a_node_ten_minutes_behind_still_stops_at_the_lifetime(sh: Shell) -> None:
    """The node's agent runs with its wall clock 600 s behind (libfaketime): the lifetime
    came as seconds left and is counted on its boot clock, so it still ends on time."""
    lib = require_tool(FAKETIME)
    end = up_with_lifetime(sh, "skew", 1, 40)
    [root] = nodes_of(sh, "skew")
    stop_agent(root)
    (root / "agent" / "beat.json").unlink()  # the dead agent's: a new one is started
    behind = {**sh.env, "LD_PRELOAD": lib, "FAKETIME": "-600s", "DONT_FAKE_MONOTONIC": "1",
              "CLOUDTRAIN_NODE_ROOT": str(root)}  # fmt: skip
    subprocess.run([sys.executable, "-m", "cloudtrain.node", "agent", "--root", str(root),
                    "--ensure"], env=behind, check=True, capture_output=True)  # fmt: skip
    wait_for(lambda: (root / "agent" / "beat.json").exists(), timeout=30, what="its beat")
    beat = json.loads((root / "agent" / "beat.json").read_text())
    assert beat["beat"] < time.time() - 590, "the agent's clock is ten minutes behind"
    assert time.time() < end - 5, "the lifetime had not ended when the clock went off"

    wait_for(lambda: not root.exists(), timeout=end - time.time() + 30,
             what="the node to stop at its lifetime")  # fmt: skip
    gone = time.time()
    assert gone >= end - 1, "not before its lifetime either"
    said = json.loads((root.parent / f"{root.name}.stopped.json").read_text())
    assert said["why"] == "its lifetime ended"
    wait_for(lambda: sh.processes() == [], timeout=30, what="the agent to leave")
    after = sh("status", "skew")
    assert "skew stopped itself (its lifetime ended)" in after.stderr, after.stderr


def test_status_removes_a_cluster_whose_lifetime_ended_under_nodes_still_running(
    sh: Shell,
) -> None:
    """Nodes whose agents are gone outlive the lifetime: `status` no longer says
    "ends in 0s" and does nothing; it removes the cluster and says why."""
    end = up_with_lifetime(sh, "late", 2, 30)
    for root in nodes_of(sh, "late"):
        stop_agent(root)
    time.sleep(max(0.0, end + 21 - time.time()))  # autostop.LATE_S after the end
    assert len(nodes_of(sh, "late")) == 2, "with no agent, nothing stopped them"
    shown = sh("status")
    assert shown.returncode == 0, shown.stderr
    assert "late: its lifetime ended at " in shown.stderr, shown.stderr
    assert "but node 0 (late-0), node 1 (late-1) still ran" in shown.stderr
    assert "removed the cluster" in shown.stderr
    assert "ends in 0s" not in shown.stdout
    assert sh.status()["clusters"] == []
    assert not (sh.home / "local" / "late").exists()
    assert sh.processes() == []
