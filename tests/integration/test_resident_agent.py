"""The resident node agent as real processes: one per node, supervised, started again by the
heartbeat when it and its supervisor are gone, beating the node's running jobs, gone with its
node; and on the local and ssh providers, there from `up` to `down`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.node import agent, procs
from tests.integration.conftest import Shell, is_agent, wait_for

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).parent / "scripts"


def agents_of(root: Path) -> list[int]:
    return [p for p in procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)}) if is_agent(p)]


def ensure(root: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "cloudtrain.node", "agent", "--root", str(root),
                           "--ensure"], capture_output=True, text=True, check=True)  # fmt: skip
    return dict(json.loads(done.stdout))


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    node = tmp_path / "node-0"
    node.mkdir()
    yield node
    procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node)}, grace_s=2)


def beating(root: Path) -> int:
    """The pid of the agent once it beats."""
    wait_for(lambda: agent.beat(root)["resident"], timeout=30, what="the agent's beat")
    return int(agent.beat(root)["pid"])


def test_one_agent_per_node_supervised_and_healed_by_the_heartbeat(root: Path) -> None:
    assert ensure(root)["launched"] is True
    first = beating(root)
    assert ensure(root)["launched"] is False, "one is resident: no second one"
    assert len(agents_of(root)) == 2, "the agent and its supervisor"

    os.kill(first, signal.SIGKILL)  # the supervisor starts it again
    wait_for(lambda: agent.beat(root).get("pid") not in (None, first) and
             agent.beat(root)["resident"], timeout=30, what="a new agent")  # fmt: skip
    second = int(agent.beat(root)["pid"])
    assert "starting it again" in (root / "agent" / "agent.log").read_text()

    for pid in agents_of(root):  # both gone: the next heartbeat starts them again
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not agents_of(root), what="the agents to die")
    wait_for(lambda: not agent.beat(root)["resident"], timeout=30, what="the beat to go stale")
    job_dir = root / "jobs" / "j-1"
    job_dir.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "cloudtrain.node", "status", str(job_dir)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    answer = json.loads(done.stdout)["agent"]
    assert answer["launched"] is True
    assert re.fullmatch(r"its last beat was \d+ s ago", answer["restarted"])
    assert beating(root) not in (first, second)

    os.kill(next(p for p in agents_of(root) if p != beating(root)), signal.SIGTERM)
    wait_for(lambda: not agents_of(root), what="SIGTERM to the supervisor to stop both")


def test_the_beat_says_which_jobs_run_and_since_when_the_node_is_idle(root: Path) -> None:
    ensure(root)
    beating(root)
    idle = agent.beat(root)
    assert idle["jobs"] == []
    assert isinstance(idle["idle_since"], float)
    env = {**os.environ, "CLOUDTRAIN_NODE_ROOT": str(root), "CLOUDTRAIN_JOB_ID": "j-7"}
    job = subprocess.Popen(["sleep", "60"], env=env)
    try:
        wait_for(lambda: agent.beat(root)["jobs"] == ["j-7"], timeout=30, what="the job")
        assert agent.beat(root)["idle_since"] is None
    finally:
        job.kill()
        job.wait()
    wait_for(lambda: agent.beat(root)["jobs"] == [], timeout=30, what="the job to end")
    assert agent.beat(root)["idle_since"] > idle["idle_since"], "the idle clock starts again"


def test_the_agent_goes_with_its_nodes_folder(root: Path) -> None:
    ensure(root)
    beating(root)
    assert len(agents_of(root)) == 2
    subprocess.run(["rm", "-rf", str(root)], check=True)
    wait_for(lambda: not agents_of(root), timeout=30, what="the agents to leave")


def test_a_local_cluster_has_its_agents_from_up_to_down(sh: Shell) -> None:
    assert sh("up", "--name", "ag", "--nodes", "2").returncode == 0
    roots = [sh.home / "local" / "ag" / f"node-{i}" for i in range(2)]
    for node in roots:
        assert agent.beat(node)["resident"], "a ready node has its agent"
    assert len(sh.agents()) == 4
    assert sh.strays() == []

    start = sh("train", "-c", "ag", "--detach", str(SCRIPTS / "sleeper.py"))
    assert start.returncode == 0, start.stderr
    wait_for(lambda: agent.beat(roots[1])["jobs"] == ["ag-1"], timeout=30, what="the beat")
    for pid in agents_of(roots[1]):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not agent.beat(roots[1])["resident"], timeout=30, what="a stale beat")
    refreshed = sh("status", "ag", "--refresh", "--json")  # NAME, as -c NAME
    assert refreshed.returncode == 0, refreshed.stderr
    events = [e["message"] for e in json.loads(refreshed.stdout)["events"]]
    assert any(re.match(r"node 1's agent was not running \(its last beat was \d+ s ago\); "
                        "started again", m) for m in events), events  # fmt: skip
    assert agent.beat(roots[1])["resident"] or beating(roots[1])

    assert sh("cancel", "ag-1").returncode == 0
    assert sh("down", "ag").returncode == 0
    assert sh.processes() == []
