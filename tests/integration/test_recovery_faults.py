"""The second fault, during a managed job's recovery, through the real CLI on the local
provider: a replacement node killed while it boots is a new loss, noticed within a heartbeat
(never the bootstrap's 30-minute timeout); a `down` meanwhile is not kept waiting by the
recovery; a `cancel` meanwhile takes the replacement with it and keeps the node that was there."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from cloudtrain.node import procs
from tests.integration.conftest import REPO, SCRIPTS, Shell, wait_for
from tests.integration.test_managed_jobs import kill_node

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"
#: Kill → training again, through a second loss: well under the bootstrap's 1800 s.
BOUND_S = 150


def text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def booting(home: Path, cluster: str, index: int, timeout: float = 120) -> dict[str, object]:
    """Wait for the node's (new) bootstrap to have begun and not be ready yet; its status."""
    status = booted(home, cluster, index)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = json.loads(status.read_text())
        except (OSError, ValueError):
            time.sleep(0.02)
            continue
        assert found.get("state") != "ready", (
            f"the replacement booted before the test saw it: {found}"
        )
        return dict(found)
    raise AssertionError(f"no bootstrap began on node {index} of {cluster}")


def booted(home: Path, cluster: str, index: int) -> Path:
    """The node's bootstrap status file."""
    return home / "local" / cluster / f"node-{index}" / "bootstrap" / "status.json"


def start_and_lose_node_1(sh: Shell, cluster: str, script: Path, *args: str) -> None:
    """A managed job on 2 nodes, detached; once it runs, node 1 is lost and its replacement's
    bootstrap has begun."""
    sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    assert sh("up", "--name", cluster, "--nodes", "2").returncode == 0
    extra = ["--", *args] if args else []
    start = sh("train", "-c", cluster, "--managed", "--detach", str(script), *extra)
    assert start.returncode == 0, start.stderr
    # rank 0 prints the epochs, on whichever node the rendezvous put it (the agents' order)
    copies = [sh.home / "logs" / f"{cluster}-1" / f"node-{i}.log" for i in (0, 1)]

    def going() -> bool:
        return any(re.search(r"epoch 2/|tick 4\b", text(copy)) for copy in copies)

    try:
        wait_for(going, timeout=180, what="the job")
    except AssertionError:
        for copy in [*copies, copies[0].with_name("watch.log")]:
            print(f"--- {copy.name}\n{text(copy)[-3000:]}")
        raise
    kill_node(sh.home, cluster, 1)
    booting(sh.home, cluster, 1)


def node_1_processes(sh: Shell, cluster: str) -> list[int]:
    root = sh.home / "local" / cluster / "node-1"
    return procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)})


def test_a_replacement_killed_while_it_boots_is_replaced_again_at_once(sh: Shell) -> None:
    start_and_lose_node_1(sh, "r", EXAMPLE, "--epochs", "60", "--pause", "1")
    killed = kill_node(sh.home, "r", 1)  # the replacement dies during its bootstrap
    copies = [sh.home / "logs" / "r-1" / f"node-{i}.log" for i in (0, 1)]

    def attempt_2(copy: Path) -> str:
        return text(copy).partition("cloudtrain: attempt 2 of r-1")[2]

    def training_again() -> bool:  # rank 0 prints it, on whichever node rendezvous put it
        return any("cloudtrain: first step" in attempt_2(copy) for copy in copies)

    try:
        wait_for(training_again, timeout=BOUND_S, what="attempt 2 to train on both nodes")
    finally:
        print(text(sh.home / "logs" / "r-1" / "watch.log"))
    took = time.time() - killed
    print(f"training again {took:.1f} s after the replacement was killed")
    job = sh.job("r-1")
    assert job["status"] == "running", job
    first, second = job["detail"]["recoveries"]
    assert "node 1 was lost during its bootstrap" in first["error"], first
    assert first["replaced"] == [], first
    assert second["replaced"] == [1], second
    events = [e["message"] for e in sh.status()["events"]]
    assert any("recovery 1 failed: node 1 was lost during its bootstrap" in e and
               e.endswith("it is made again") for e in events), events  # fmt: skip
    assert re.search(r"rank \d/2 on node 1", attempt_2(copies[1])), "its replacement trains"
    assert sh("cancel", "r-1").returncode == 0
    assert sh("down", "r").returncode == 0


def test_down_during_a_stalled_recovery_is_not_kept_waiting(sh: Shell) -> None:
    """The replacement is killed while it boots, then `down` at once: the recovery holds no
    lock across its wait, so `down` ends it promptly and leaves nothing."""
    start_and_lose_node_1(sh, "w", SCRIPTS / "sleeper.py")
    kill_node(sh.home, "w", 1)
    began = time.monotonic()
    down = sh("down", "w", timeout=60)
    print(f"down took {time.monotonic() - began:.1f} s")
    assert down.returncode == 0, down.stderr
    assert sh.job("w-1")["status"] == "cancelled"
    assert sh.status()["clusters"] == []
    wait_for(lambda: not sh.strays(), timeout=30, what="the watcher and the job to end")
    assert not (sh.home / "local" / "w").exists()


def test_cancel_during_a_recovery_takes_the_replacement_and_keeps_the_node_that_was_there(
    sh: Shell,
) -> None:
    start_and_lose_node_1(sh, "c", SCRIPTS / "sleeper.py")
    # the replacement's bootstrap held where it is (a local one is over in a second): the
    # cancel comes during the recovery, and its stop (TERM, then CONT) still ends it
    for pid in node_1_processes(sh, "c"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    assert json.loads(booted(sh.home, "c", 1).read_text()).get("state") != "ready"
    cancel = sh("cancel", "c-1")
    assert cancel.returncode == 0, cancel.stderr
    assert "job c-1 cancelled" in cancel.stdout
    assert sh.job("c-1")["status"] == "cancelled"
    status = sh.status()
    events = [e["message"] for e in status["events"]]
    assert "job c-1: cancelled during its recovery; node(s) 1 removed" in events, events
    assert not (sh.home / "local" / "c" / "node-1").exists(), "the replacement is gone"
    assert node_1_processes(sh, "c") == []
    assert (sh.home / "local" / "c" / "node-0" / "node.json").is_file(), "node 0 stays"
    (cluster,) = status["clusters"]
    assert [n["index"] for n in cluster["nodes"]] == [0], cluster
    assert sh("down", "c").returncode == 0


def test_an_up_whose_node_is_lost_while_it_boots_ends_at_once(sh: Shell) -> None:
    """A node gone during `up`'s own bootstrap wait (its lifetime ended and it removed itself,
    its host died) ends the `up` within a check of the provider's listing, naming the node,
    instead of the bootstrap's 1800 s timeout."""
    up = sh.popen("up", "--name", "lo", "--nodes", "2")
    booting(sh.home, "lo", 1)
    kill_node(sh.home, "lo", 1)
    began = time.monotonic()
    try:
        out, _ = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    took = time.monotonic() - began
    assert up.returncode not in (0, None), out
    assert "node 1 was lost during its bootstrap" in out, out
    assert "Traceback" not in out
    assert took < 60, f"up ended {took:.0f} s after the node was lost"
    assert sh("down", "lo").returncode == 0
    assert sh.processes() == []
