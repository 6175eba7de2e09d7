"""Managed jobs through the real CLI on the local provider: a node killed mid-job is replaced,
the job resumes from its newest checkpoint and finishes; cancel and a dead watcher."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cloudtrain.jobs import watched
from cloudtrain.node import procs
from tests.integration.conftest import REPO, SCRIPTS, Shell, wait_for

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"
FSDP = REPO / "examples" / "digits_fsdp.py"
#: digits_fsdp's MLP a 64th of its size (its shards, checkpoints and recovery are the same):
#: these tests are about the recovery, and two jobs of the full one take both cores for minutes
SMALL = ("--hidden", "256")


def kill_node(home: Path, cluster: str, index: int) -> float:
    """What a lost machine looks like to the local provider: every process of the node killed
    at once (no exit code is written), and its folder, the node's "instance", gone."""
    root = home / "local" / cluster / f"node-{index}"
    killed = time.time()
    # A process of the node that started as the others died (the agent's supervisor restarting
    # it) may write into the folder as it goes: kill again until the folder stays gone. (CI saw
    # "Directory not empty: 'agent'" once.)
    for _ in range(20):
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(root)}, grace_s=0)
        shutil.rmtree(root, ignore_errors=True)
        if not root.exists():
            return killed
        time.sleep(0.05)
    raise AssertionError(f"{root} could not be removed: something of the node lives on")


def read_until(proc: subprocess.Popen[str], pattern: str, timeout: float = 180) -> str:
    """The process's output up to the first line matching `pattern`."""
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if re.search(pattern, line):
            return "".join(seen)
        assert time.monotonic() < deadline, "".join(seen)
    raise AssertionError(f"ended before {pattern!r}:\n{''.join(seen)}")


def test_a_managed_job_replaces_a_killed_node_and_resumes_from_its_checkpoint(
    sh: Shell,
) -> None:
    sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    assert sh("up", "--name", "m", "--nodes", "2").returncode == 0
    train = sh.popen("train", "-c", "m", "--managed", str(EXAMPLE), "--",
                     "--epochs", "8", "--pause", "1")  # fmt: skip
    before = read_until(train, r"epoch 3/8")
    killed = kill_node(sh.home, "m", 1)
    rest, _ = train.communicate(timeout=300)
    out = before + rest
    print(out)
    assert train.returncode == 0, out
    assert re.search(r"cloudtrain: job m-1: recovery 1/3: node 1 its processes vanished", out)
    assert "replacing node(s) 1 of m" in out
    resumed = re.search(r"resumed from epoch (\d+)", out)
    assert resumed, out
    assert int(resumed.group(1)) >= 2, out  # at most one epoch of work lost
    assert "epoch 8/8" in out
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", out)
    assert accuracy, out
    assert float(accuracy.group(1)) >= 0.95, out

    job = sh.job("m-1")
    assert job["status"] == "succeeded"
    recoveries = job["detail"]["recoveries"]
    assert [(r["cause"], r["node"], r["replaced"]) for r in recoveries] == [("vanished", 1, [1])]
    for index in (0, 1):  # the survivor's stopped agent and the replacement's bootstrap
        served = (sh.home / "local" / "m" / f"node-{index}" / "warm" / "server.log").read_text()
        assert "forked agent" in served, f"node {index}'s next attempt did not start warm"
    print(f"recovered {recoveries[0]['seconds']} s after the failure was seen, "
          f"{recoveries[0]['at'] - killed:.1f} s after the kill")  # fmt: skip
    # the steps it redid: from the last step seen before the loss back to the checkpoint's
    per_epoch = recoveries[0]["resumed_at_step"] // int(resumed.group(1))
    assert per_epoch == 23, "719 of the 1437 samples on each rank, batches of 32"
    assert 0 <= recoveries[0]["steps_redone"] <= 2 * per_epoch, recoveries[0]
    assert recoveries[0]["step_at_loss"] >= recoveries[0]["resumed_at_step"]
    events = [e["message"] for e in sh.status()["events"]]
    assert (f"job m-1: resumed at step {recoveries[0]['resumed_at_step']}, "
            f"{recoveries[0]['steps_redone']} step(s) redone") in events  # fmt: skip
    logs = sh("logs", "m-1")
    assert logs.stdout.count("final test accuracy") == 1
    assert "epoch 3/8" in logs.stdout, "the copy keeps the attempt before the recovery"
    assert sh("down", "m").returncode == 0


def test_a_managed_fsdp_job_resumes_from_the_shards_of_a_node_that_is_gone(sh: Shell) -> None:
    """Each node holds its own shards of an fsdp checkpoint: the lost node's shards come from
    the copy pulled while the job ran (every node's, `Kept.pull_sharded`), and the replacement
    and the survivor resume from their union."""
    sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    assert sh("up", "--name", "s", "--nodes", "2").returncode == 0
    train = sh.popen("train", "-c", "s", "--managed", "--strategy", "fsdp", str(FSDP), "--",
                     *SMALL, "--epochs", "6", "--pause", "2")  # fmt: skip
    before = read_until(train, r"epoch 3/6")
    kill_node(sh.home, "s", 1)
    rest, _ = train.communicate(timeout=300)
    out = before + rest
    assert train.returncode == 0, out
    assert "replacing node(s) 1 of s" in out
    resumed = re.search(r"resumed from epoch (\d+) \(saved by 2 ranks, now 2\)", out)
    assert resumed, out
    assert int(resumed.group(1)) >= 2, out  # at most one epoch of work lost
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", out)
    assert accuracy, out
    assert float(accuracy.group(1)) >= 0.9, out
    assert [r["cause"] for r in sh.job("s-1")["detail"]["recoveries"]] == ["vanished"]
    assert sh("down", "s").returncode == 0


def whole_at_home(kept: Path) -> list[int]:
    """The epochs of digits_fsdp's checkpoints that a snapshot in `kept` holds both nodes'
    markers of (ckpt-N is epoch N + 1)."""
    return [
        int(ckpt.name.split("-")[1]) + 1
        for ckpt in kept.glob("[0-9]*/digits_fsdp/ckpt-*")
        if (ckpt / "complete-0.json").is_file() and (ckpt / "complete-1.json").is_file()
    ]


def test_a_managed_fsdp_job_survives_a_lost_node_at_the_default_settings(sh: Shell) -> None:
    """At the defaults the shards come home every 30 s: when a node is lost between two pulls,
    the home's copy of its shards is older than the survivor's newest checkpoints (which have
    pruned the one they share). Attempt 2 resumes from the newest checkpoint complete on
    every rank, wherever its shards are: here, the one the home kept."""
    assert "CLOUDTRAIN_CHECKPOINT_PULL_S" not in sh.env
    assert sh("up", "--name", "d", "--nodes", "2").returncode == 0
    args = ["--managed", "--strategy", "fsdp", str(FSDP), "--", *SMALL, "--epochs", "20",
            "--pause", "1"]  # fmt: skip
    train = sh.popen("train", "-c", "d", *args)
    out = read_until(train, r"epoch 1/20")
    kept = sh.home / "checkpoints" / "d-1"
    wait_for(lambda: whole_at_home(kept), timeout=120, what="a copy of both nodes' shards")
    home = max(whole_at_home(kept))  # the newest epoch the home holds whole
    # Two more epochs (seconds, well within the next copy at 30 s): the survivor's two
    # newest checkpoints are past all the home holds, and its folder has pruned the rest.
    out += read_until(train, rf"epoch {home + 2}/20")
    kill_node(sh.home, "d", 1)
    rest, _ = train.communicate(timeout=600)
    out += rest
    assert train.returncode == 0, out
    assert "replacing node(s) 1 of d" in out
    assert "no checkpoint is complete" not in out, out
    resumed = re.search(r"resumed from epoch (\d+) \(saved by 2 ranks, now 2\)", out)
    assert resumed, out
    assert int(resumed.group(1)) >= home, out  # nothing older than what the home held
    assert "epoch 20/20" in out
    assert [r["cause"] for r in sh.job("d-1")["detail"]["recoveries"]] == ["vanished"]
    assert sh("down", "d").returncode == 0


def test_a_managed_fsdp_job_lost_before_its_shards_came_home_starts_afresh(sh: Shell) -> None:
    """A node lost right after its first checkpoint: the survivor's shards alone are no
    checkpoint, so attempt 2 resumes from a copy at home that both ranks completed or, where
    none came home in time, starts afresh on both nodes, rather than failing on the survivor's
    half of one."""
    assert "CLOUDTRAIN_CHECKPOINT_PULL_S" not in sh.env
    assert sh("up", "--name", "e", "--nodes", "2").returncode == 0
    args = ["--managed", "--strategy", "fsdp", str(FSDP), "--", *SMALL, "--epochs", "3",
            "--pause", "1"]  # fmt: skip
    train = sh.popen("train", "-c", "e", *args)
    out = read_until(train, r"epoch 1/3")
    kill_node(sh.home, "e", 1)
    rest, _ = train.communicate(timeout=600)
    out += rest
    assert train.returncode == 0, out
    assert "no checkpoint is complete" not in out, out
    # A checkpoint comes home when it completes, so epoch 1's may arrive whole between the
    # line above and the kill: then it is resumed from (saved by both ranks), and otherwise the
    # job starts afresh. Never from the survivor's half alone.
    if re.search(r"recovered in [\d.]+ s \(attempt 2\), from no checkpoint", out):
        assert "resumed from epoch" not in out, out
        assert out.count("epoch 1/3") == 2, out
    else:
        assert re.search(r"from the checkpoint kept [\d.]+ s before", out), out
        assert re.search(r"resumed from epoch \d+ \(saved by 2 ranks, now 2\)", out), out
        assert whole_at_home(sh.home / "checkpoints" / "e-1"), out
    assert "epoch 3/3" in out
    assert sh("down", "e").returncode == 0


def test_a_script_that_fails_is_not_recovered_unless_asked(sh: Shell) -> None:
    assert sh("up", "--name", "f", "--nodes", "2").returncode == 0
    plain = sh("train", "-c", "f", "--managed", str(SCRIPTS / "fail_on_node.py"))
    assert plain.returncode == 1, plain.stderr
    assert "recovery" not in plain.stderr
    # node 1's rank: torchrun ranks agents that share an address (local nodes) in pid order
    said = r"error: job f-1: failed: node 1 exited 1 \(rank [01] exited 3\)"
    assert re.search(said, plain.stderr), plain.stderr

    retried = sh("train", "-c", "f", "--managed", "--retry-on-failure", "--max-recoveries", "1",
                 str(SCRIPTS / "fail_on_node.py"))  # fmt: skip
    assert retried.returncode == 1, retried.stderr
    assert "recovery 1/1: node 1 exited 1" in retried.stderr
    assert retried.stdout.count("boom: node 1 gives up") == 2, retried.stdout
    assert "its 1 recoveries are spent" in retried.stderr
    assert sh("down", "f").returncode == 0


def test_cancel_of_a_managed_job_stops_it_and_its_watcher_tears_the_cluster_down(
    sh: Shell,
) -> None:
    assert sh("up", "--name", "c", "--nodes", "2").returncode == 0
    start = sh("train", "-c", "c", "--managed", "--detach", "--down", str(SCRIPTS / "sleeper.py"))
    assert start.returncode == 0, start.stderr
    assert "tears the cluster down at the end" in start.stderr
    wait_for(lambda: sh.job("c-1")["status"] == "running", what="the job to run")
    cancel = sh("cancel", "c-1")
    assert cancel.returncode == 0, cancel.stderr
    assert "job c-1 cancelled" in cancel.stdout
    assert sh.job("c-1")["status"] == "cancelled"
    assert sh.status()["clusters"] == []
    assert not (sh.home / "local" / "c").exists()
    assert sh.processes() == []


def test_a_watcher_that_died_is_started_again_by_the_next_command(
    sh: Shell, tmp_path: Path
) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(f"name: w\nnum_nodes: 2\nworkdir: {SCRIPTS}\nrun: countdown.py\n"
                    "managed: true\nmax_recoveries: 2\n")  # fmt: skip
    start = sh("launch", str(task), "--detach")
    assert start.returncode == 0, start.stderr
    assert "recovers it up to 2 time(s)" in start.stderr
    found = re.search(r"watcher \(pid (\d+)\)", start.stderr)
    assert found, start.stderr
    pid = int(found.group(1))  # its supervisor (which starts a dead watcher again)
    wait_for(lambda: (watched.watcher_pid(sh.home, "w-1") or -1) > 0, what="the watcher")
    watcher = watched.watcher_pid(sh.home, "w-1")
    assert watcher is not None
    for each in (pid, watcher):  # both gone, as after a restart of the machine
        os.kill(each, signal.SIGKILL)
    wait_for(lambda: not procs.alive(pid) and not procs.alive(watcher), what="both to die")
    status = sh("status")
    assert "the watcher of managed job w-1 was not running; started it" in status.stderr
    follow = sh("logs", "w-1", "-f")
    assert follow.returncode == 0, follow.stderr
    assert "job w-1 succeeded" in follow.stderr
    assert sh("down", "w").returncode == 0


def test_an_elastic_job_goes_on_with_the_nodes_it_has_left(sh: Shell) -> None:
    assert sh("up", "--name", "e", "--nodes", "2").returncode == 0
    bad = sh("train", "-c", "e", "--nodes", "3:2", str(EXAMPLE))
    assert bad.returncode == 2
    assert "--nodes '3:2': write a number of nodes" in bad.stderr
    train = sh.popen("train", "-c", "e", "--nodes", "1:2", str(EXAMPLE), "--",
                     "--epochs", "8", "--pause", "1")  # fmt: skip
    before = read_until(train, r"epoch 3/8")
    assert "rank 1/2 on node" in before
    kill_node(sh.home, "e", 1)
    rest, _ = train.communicate(timeout=300)
    out = before + rest
    assert train.returncode == 0, out
    assert "rank 0/1 on node 0" in rest, "the survivor re-formed the job alone"
    resumed = re.search(r"resumed from epoch (\d+)", rest)
    assert resumed, out
    assert int(resumed.group(1)) >= 2, out
    assert "epoch 8/8" in rest
    assert "job e-1 succeeded" in rest
    assert sh("down", "e").returncode == 0


def test_a_managed_elastic_job_gets_its_lost_node_back_while_it_runs(sh: Shell) -> None:
    """`--managed --nodes 1:2`: node 1 is killed; node 0 goes on alone while the watcher makes
    node 1 again (here, a local node in a few seconds, often before node 0 re-formed), then the
    job starts again on both from the newest checkpoint and ends there."""
    sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    assert sh("up", "--name", "g", "--nodes", "2").returncode == 0
    train = sh.popen("train", "-c", "g", "--managed", "--nodes", "1:2", str(EXAMPLE), "--",
                     "--epochs", "16", "--pause", "2")  # fmt: skip
    before = read_until(train, r"epoch 3/16")
    kill_node(sh.home, "g", 1)
    back = read_until(train, r"job g-1 runs on 2 node\(s\) again in \d+\.\d s \(attempt 2\)")
    rest, _ = train.communicate(timeout=300)
    out = before + back + rest
    print(out)
    assert train.returncode == 0, out
    assert "recovery 1/3: node 1 was lost; the others go on (elastic) while it is made" in out
    assert "replacing node(s) 1 of g" in out
    assert re.search(r"node 1 is back after \d+\.\d s; the job starts again on all", back)
    assert re.search(r"rank [01]/2 on node 1", rest), "node 1 trains again, one of two"
    resumed = [int(e) for e in re.findall(r"resumed from epoch (\d+)", back + rest)]
    assert resumed, out
    assert resumed == sorted(resumed), "never back to an older checkpoint"
    assert resumed[-1] >= 2, out
    assert "epoch 16/16" in rest
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", rest)
    assert accuracy, out
    assert float(accuracy.group(1)) >= 0.9
    job = sh.job("g-1")
    assert job["status"] == "succeeded"
    assert [r["replaced"] for r in job["detail"]["recoveries"]] == [[1]]
    assert sh("down", "g").returncode == 0


def test_a_managed_elastic_job_survives_its_rendezvous_host_and_counts_it_once(
    sh: Shell,
) -> None:
    """`--managed --nodes 1:2`: node 0, which hosts the c10d rendezvous, is killed; node 1
    starts again at once on a rendezvous of its own and trains while node 0 is made again; then
    the job runs on both and finishes. One loss: one recovery, and events that say so."""
    sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    assert sh("up", "--name", "h", "--nodes", "2").returncode == 0
    train = sh.popen("train", "-c", "h", "--managed", "--nodes", "1:2", str(EXAMPLE), "--",
                     "--epochs", "8", "--pause", "1")  # fmt: skip
    before = read_until(train, r"epoch 3/8")
    assert sh.job("h-1")["detail"]["head_node"] == 0
    kill_node(sh.home, "h", 0)
    rest, _ = train.communicate(timeout=300)
    out = before + rest
    print(out)
    assert train.returncode == 0, out
    assert re.search(r"recovery 1/3: node 0, the rendezvous host, its processes vanished; "
                     r"node\(s\) 1 lost their rendezvous with it and start again", out)  # fmt: skip
    moved = r"rendezvous on node 1, from the checkpoint kept \d+ s before"
    assert re.search(r"job h-1 runs on node\(s\) 1 again in \d+\.\d s \(attempt 2\), " + moved, out)
    assert re.search(r"node 0 is back after \d+\.\d s; the job starts again on all", rest)
    if "job h-1 runs on 2 node(s) again" in rest:  # node 0 was back before the job ended
        grown = rest.split("node 0 is back")[1]
        assert re.search(r"rank \d/2 on node 0", grown), "both train again"
        assert re.search(r"rank \d/2 on node 1", grown), "both train again"
    assert "the others go on" not in out, "they did not: they lost their rendezvous"
    assert "recovery 2/" not in out
    resumed = [int(e) for e in re.findall(r"resumed from epoch (\d+)", rest)]
    assert resumed, out
    assert resumed == sorted(resumed), "never back to an older checkpoint"
    assert resumed[0] >= 2, out
    assert "epoch 8/8" in rest
    job = sh.job("h-1")
    assert job["status"] == "succeeded"
    recoveries = job["detail"]["recoveries"]
    assert [(r["cause"], r["node"], r["replaced"]) for r in recoveries] == [("vanished", 0, [0])]
    assert sh("down", "h").returncode == 0


def test_a_managed_job_on_ssh_hosts_survives_a_host_that_goes_away_and_comes_back(
    sh: Shell, tmp_path: Path
) -> None:
    """A host whose sshd and processes die mid-job is lost once it has not answered for the
    heartbeat timeout; the watcher tries to recover until the host answers again (a reboot),
    then resumes the job there from the newest checkpoint."""
    from tests.sshd import Lab

    lab = Lab(tmp_path / "lab", addresses=(7, 8))
    name = "ssh-managed"
    sh.env.update({"CLOUDTRAIN_HEARTBEAT_TIMEOUT_S": "3", "CLOUDTRAIN_CHECKPOINT_PULL_S": "1"})
    try:
        assert sh(*lab.up_args(name)).returncode == 0
        train = sh.popen("train", "-c", name, "--managed", "--max-recoveries", "8", str(EXAMPLE),
                         "--", "--epochs", "8", "--pause", "1")  # fmt: skip
        before = read_until(train, r"epoch 3/8")
        lab.hosts[1].cut()  # the host goes away: its sshd, then what it ran
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(lab.home / ".cloudtrain" / name /
                                                          "node-1")}, grace_s=0)  # fmt: skip
        during = read_until(train, r"recovery 1/8: node 1 went away")
        time.sleep(2)  # the host is down a little longer: the watcher's tries fail, and count
        lab.hosts[1].start()
        rest, _ = train.communicate(timeout=300)
        out = before + during + rest
        assert train.returncode == 0, out
        resumed = re.search(r"resumed from epoch (\d+)", rest)
        assert resumed, out
        assert int(resumed.group(1)) >= 2, out
        assert "epoch 8/8" in rest
        assert "[node 1] rank 1/2 on node 1" in rest, "node 1 is back in the job"
        job = sh.job(f"{name}-1")
        assert job["status"] == "succeeded"
        assert job["detail"]["recoveries"][0]["cause"] == "lost"
        assert sh("down", name).returncode == 0
    finally:
        lab.stop()
        procs.kill_matching({"CLOUDTRAIN_CLUSTER": name}, grace_s=2)
