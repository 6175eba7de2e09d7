"""The ssh provider through the CLI over two real sshd hosts (127.0.0.2 and 127.0.0.3): up,
a DDP job across them, a job that outlives a killed CLI, cancel, down leaving nothing."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.node import agent as resident
from cloudtrain.node import procs
from tests.integration.conftest import (
    REPO,
    SCRIPTS,
    Shell,
    is_agent,
    wait_for,
)
from tests.sshd import Lab, keygen

pytestmark = pytest.mark.integration


def test_ddp_across_two_ssh_hosts_and_down_leaves_nothing(sh: Shell, lab: Lab, name: str) -> None:
    up = sh(*lab.up_args(name))
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"cluster {name} is up: 2 node(s)" in up.stdout
    assert "verify: ready" in up.stderr
    roots = [lab.home / ".cloudtrain" / name / f"node-{i}" for i in range(2)]
    for root in roots:  # each host runs its node's agent, detached, started by the bootstrap
        assert resident.beat(root)["resident"], root
        assert len([p for p in procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)})
                    if is_agent(p)]) == 2, "the agent and its supervisor"  # fmt: skip
    train = sh("train", "-c", name, str(REPO / "examples" / "digits_ddp.py"), "--", "--epochs", "5")
    assert train.returncode == 0, train.stdout + train.stderr
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", train.stdout)
    assert accuracy, train.stdout
    assert float(accuracy.group(1)) >= 0.95
    assert "[node 0] rank 0/2 on node 0" in train.stdout
    assert "[node 1] rank 1/2 on node 1" in train.stdout
    down = sh("down", name)
    assert down.returncode == 0, down.stderr
    assert not (lab.home / ".cloudtrain" / name).exists()
    for root in roots:
        assert procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)}) == []


def test_the_job_outlives_a_killed_cli_and_cancel_stops_every_rank(
    sh: Shell, lab: Lab, name: str
) -> None:
    assert sh(*lab.up_args(name)).returncode == 0
    proc = sh.popen("train", "-c", name, str(SCRIPTS / "countdown.py"))
    assert proc.stdout is not None
    for line in proc.stdout:
        if "rank" in line:
            break
    proc.send_signal(signal.SIGKILL)  # the laptop goes away
    proc.wait()
    proc.stdout.close()
    job = sh.status()["jobs"][0]["id"]
    follow = sh("logs", job, "-f")
    assert follow.returncode == 0, follow.stderr
    assert "rank 0: done" in follow.stdout
    assert "rank 1: done" in follow.stdout
    assert f"job {job} succeeded" in follow.stderr

    started = sh("train", "-c", name, "--detach", str(SCRIPTS / "sleeper.py"))
    second = re.search(rf"job ({name}-\d+) running", started.stderr)
    assert second, started.stderr
    wait_for(lambda: "tick 1" in sh("logs", second.group(1)).stdout, what="the sleeper's output")
    assert procs.find_processes({"CLOUDTRAIN_JOB_ID": second.group(1)})
    cancel = sh("cancel", second.group(1))
    assert cancel.returncode == 0, cancel.stderr
    assert "cancelled" in cancel.stdout
    assert procs.find_processes({"CLOUDTRAIN_JOB_ID": second.group(1)}) == []
    assert sh("down", name).returncode == 0


def test_a_host_down_at_up_is_named_and_the_others_are_left_clean(
    sh: Shell, lab: Lab, name: str
) -> None:
    good = f"root@{lab.hosts[0].host}:{lab.hosts[0].port}"
    result = sh(*lab.up_args(name, [good, "root@127.0.0.9:2"]))
    assert result.returncode == 3
    assert "cannot reach root@127.0.0.9:2" in result.stderr
    assert not (lab.home / ".cloudtrain" / name).exists()


def test_a_wrong_host_key_is_refused(sh: Shell, lab: Lab, name: str, tmp_path: Path) -> None:
    wrong = tmp_path / "known_hosts"
    other = keygen(tmp_path / "other")
    wrong.write_text(f"{lab.hosts[0].address} {' '.join(other.split()[:2])}\n")
    args = lab.up_args(name, [f"root@{lab.hosts[0].host}:{lab.hosts[0].port}"])
    args[args.index("--known-hosts") + 1] = str(wrong)
    result = sh(*args)
    assert result.returncode == 3
    assert "did not present the cluster's pinned host key" in result.stderr
    # refused before anything was written: no record that `down` could never remove
    assert sh.status()["clusters"] == []
    down = sh("down", name)
    assert down.returncode == 0
    assert down.stdout.strip() == f"nothing to do: no cluster named {name!r}"


def test_a_host_that_goes_away_mid_job_fails_the_job_naming_it(
    sh: Shell, tmp_path: Path, name: str
) -> None:
    """Its own two hosts (one of them is cut): the job is marked failed with the node that went
    away, and the reachable node's ranks are stopped."""
    lab = Lab(tmp_path / "lab", addresses=(10, 11))
    try:
        assert sh(*lab.up_args(name)).returncode == 0
        proc = sh.popen("train", "-c", name, str(SCRIPTS / "sleeper.py"))
        assert proc.stdout is not None
        seen: set[str] = set()
        for line in proc.stdout:
            seen |= {n for n in ("[node 0] tick 2", "[node 1] tick 2") if n in line}
            if len(seen) == 2:
                break
        lab.hosts[1].cut()
        out, _ = proc.communicate(timeout=120)
        job = sh.status()["jobs"][0]
        assert proc.returncode == 1, out
        assert f"job {job['id']}: failed: node 1 went away (ssh: " in out
        assert job["detail"]["failed_node"] == 1
        assert [s["state"] for s in job["detail"]["nodes"]] == ["exited", "unreachable"]
        head_root = lab.home / ".cloudtrain" / name / "node-0"
        assert not procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(head_root),
                                         "CLOUDTRAIN_JOB_ID": job["id"]})  # fmt: skip
        procs.kill_matching({"CLOUDTRAIN_JOB_ID": job["id"]}, grace_s=2)  # the host died
        refreshed = sh("status", "--refresh", "--json")
        cluster = json.loads(refreshed.stdout)["clusters"][0]
        assert (cluster["status"], [n["state"] for n in cluster["nodes"]]) == (
            "partial", ["running", "unreachable"]
        )  # fmt: skip
        again = sh("train", "-c", name, str(SCRIPTS / "sleeper.py"))
        assert again.returncode != 0
        assert "has 1 of its 2 node(s) running, node 1 unreachable" in again.stderr
        lab.hosts[1].start()
        assert sh("down", name).returncode == 0
    finally:
        lab.stop()


def test_up_from_an_inventory_file_checks_each_host_s_gpus(
    sh: Shell, lab: Lab, name: str, tmp_path: Path
) -> None:
    first, second = lab.hosts
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(
        f"user: root\nidentity: {lab.identity}\nknown_hosts: {lab.known_hosts}\n"
        f"python: {sys.executable}\nhosts:\n"
        f"  - {{address: {first.host}, port: {first.port}, gpus: 0}}\n"
        f"  - root@{second.host}:{second.port}\n"
    )
    up = sh("up", "--provider", "ssh", "--name", name, "--inventory", str(inventory))
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"cluster {name} is up: 2 node(s)" in up.stdout
    nodes = sh.status()["clusters"][0]["nodes"]
    assert [(n["private_ip"], n["extra"]["port"]) for n in nodes] == [
        (first.host, first.port), (second.host, second.port)
    ]  # fmt: skip
    assert sh("down", name).returncode == 0

    inventory.write_text(inventory.read_text().replace("gpus: 0", "gpus: 8"))
    wrong = sh("up", "--provider", "ssh", "--name", name, "--inventory", str(inventory))
    assert wrong.returncode == 2, wrong.stderr
    assert f"root@{first.host}:{first.port}: the inventory says 8 GPUs, nvidia-smi shows 0" in (
        wrong.stderr
    )
    assert not (lab.home / ".cloudtrain" / name).exists(), "nothing written on a bad input"


def test_an_idle_cluster_on_ssh_hosts_removes_itself_and_says_why(
    sh: Shell, lab: Lab, name: str
) -> None:
    """The hosts' agents judge the idle time and remove their nodes, nothing of cloudtrain
    running on the user's side; the next command says why, and `down` clears the rest."""
    up = sh(*lab.up_args(name), "--idle-minutes", "0.05")
    assert up.returncode == 0, up.stdout + up.stderr
    base = lab.home / ".cloudtrain" / name
    assert sh.strays() == []
    wait_for(lambda: not list(base.glob("node-*/node.json")), timeout=60,
             what="the nodes to remove themselves")  # fmt: skip
    wait_for(lambda: procs.find_processes({"CLOUDTRAIN_CLUSTER": name}) == [] and not [
        p for i in range(2) for p in procs.find_processes(
            {"CLOUDTRAIN_NODE_ROOT": str(base / f"node-{i}")})], timeout=30,
        what="the agents to leave")  # fmt: skip
    refreshed = sh("status", name, "--refresh")
    assert refreshed.returncode == 0, refreshed.stderr
    assert "node-0 removed itself at" in refreshed.stderr
    assert "node-1 removed itself at" in refreshed.stderr
    assert "idle for 3 s" in refreshed.stderr
    assert sh("down", name).returncode == 0


def test_an_ssh_session_of_the_user_keeps_its_node_from_stopping(
    sh: Shell, lab: Lab, name: str
) -> None:
    """A terminal open on a host (sshd gives it SSH_TTY) is work: that node waits for it to
    close; the other node, with no session, stops when its idle time is over."""
    up = sh(*lab.up_args(name), "--idle-minutes", "0.1")
    assert up.returncode == 0, up.stdout + up.stderr
    host = lab.hosts[0]
    session = subprocess.Popen(
        ["ssh", "-tt", "-i", str(lab.identity), "-o", f"UserKnownHostsFile={lab.known_hosts}",
         "-o", "BatchMode=yes", "-p", str(host.port), f"root@{host.host}", "sleep 20"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = lab.home / ".cloudtrain" / name
    try:
        wait_for(lambda: not (base / "node-1" / "node.json").exists(), timeout=60,
                 what="node 1, with no session, to stop")  # fmt: skip
        assert session.poll() is None, "the session is still open"
        assert (base / "node-0" / "node.json").exists(), "the session keeps node 0"
        shown = sh("status", name)
        assert "node 0: agent up, 1 SSH session(s) open" in shown.stdout, shown.stdout
    finally:
        session.wait(timeout=60)
    wait_for(lambda: not (base / "node-0" / "node.json").exists(), timeout=60,
             what="node 0 to stop once the session closed")  # fmt: skip
    said = json.loads((base / "node-0.stopped.json").read_text())
    assert said["why"] == "idle for 6 s"
    assert sh("down", name).returncode == 0
