"""A node whose agent and its supervisor are both gone still stops (local provider, the idle
clock in seconds): the next `cloudtrain status` does what the agent would have — stops a node
whose policy is due, or starts its agent again, which then stops the node on its own."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cloudtrain.node import agent, procs
from tests.integration.conftest import Shell, is_agent, wait_for

pytestmark = pytest.mark.integration


def gone(sh: Shell, name: str) -> bool:
    return not list((sh.home / "local" / name).glob("node-*/node.json"))


def agents_of(root: Path) -> list[int]:
    return [p for p in procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)}) if is_agent(p)]


def kill_agent_and_supervisor(root: Path) -> None:
    """SIGKILL the node's supervisor, then its agent (the other way round, the supervisor
    would start the agent again)."""
    pids = agents_of(root)
    assert len(pids) == 2, "the agent and its supervisor"
    beating = int(agent.beat(root)["pid"])
    for pid in sorted(pids, key=lambda p: p == beating):  # the supervisor first
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(procs.alive(p) for p in pids), timeout=10, what="the agents to die")


def test_a_due_node_whose_agent_is_gone_is_stopped_by_the_next_status(sh: Shell) -> None:
    up = sh("up", "--name", "orphan", "--nodes", "1", "--idle-minutes", "0.15")  # 9 s
    assert up.returncode == 0, up.stderr
    root = sh.home / "local" / "orphan" / "node-0"
    idle_since = float(agent.beat(root)["idle_since"])
    kill_agent_and_supervisor(root)
    time.sleep(max(0.0, idle_since + 9 + 1 - time.time()))  # past its idle time
    wait_for(lambda: not agent.beat(root)["resident"], timeout=15, what="its beat to go stale")
    assert not gone(sh, "orphan"), "nothing on the node stops it: its agent is gone"

    shown = sh("status", "orphan")
    assert shown.returncode == 0, shown.stderr
    assert "node 0: stopped now, idle for 9 s while its agent was not running" in shown.stdout
    assert "orphan stopped itself (it was idle); `cloudtrain up` brings it back" in shown.stderr
    assert gone(sh, "orphan")
    assert agents_of(root) == [], "no agent was started for a node that stopped"
    assert sh.status()["clusters"][0]["status"] == "stopped"
    assert sh("down", "orphan").returncode == 0
    assert sh.processes() == []


def test_a_node_not_due_gets_its_agent_again_and_stops_on_its_own(sh: Shell) -> None:
    up = sh("up", "--name", "revived", "--nodes", "1", "--idle-minutes", "0.3")  # 18 s
    assert up.returncode == 0, up.stderr
    root = sh.home / "local" / "revived" / "node-0"
    idle_since = float(agent.beat(root)["idle_since"])
    kill_agent_and_supervisor(root)
    wait_for(lambda: not agent.beat(root)["resident"], timeout=15, what="its beat to go stale")
    assert time.time() < idle_since + 18, "not due yet (the `up` took too long to tell)"

    shown = sh("status", "revived")
    assert shown.returncode == 0, shown.stderr
    assert "node 0: its agent was not running (its last beat was " in shown.stdout, shown.stdout
    assert "s ago); started it again" in shown.stdout
    assert not gone(sh, "revived"), "not due yet: it stays for now"
    wait_for(lambda: len(agents_of(root)) == 2, timeout=10, what="the agent and its supervisor")
    wait_for(lambda: gone(sh, "revived"), timeout=40, what="the node to stop on its own")
    wait_for(lambda: sh.processes() == [], timeout=20, what="the agents to leave")
    after = sh("status", "revived")
    assert "revived stopped itself (it was idle)" in after.stderr, after.stderr
    assert sh("down", "revived").returncode == 0
