"""A cluster on a real Slurm (the lab: slurmctld and two slurmd's, tests/slurmlab.py), through
the CLI as its users type it, from a login node over SSH (a real sshd) or on this machine: `up`
holds both nodes in one batch job, `train` runs the digits example across them as steps of that
job to its accuracy, and `down`, with the state file gone, finds the job by its name and comment
and leaves nothing: the queue empty, no process of the job on any node (the lab's closing
checks), no folder."""

from __future__ import annotations

import re
import sys

import pytest

from tests.integration.conftest import REPO, Shell
from tests.slurm.fixtures import LoginNode
from tests.slurmlab import SlurmLab, _command

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"


def jobs(slurm: SlurmLab) -> list[list[str]]:
    """The lab's live jobs: [id, name, state, comment]."""
    shown = slurm.run("squeue", "--noheader", "--format=%A\x1f%j\x1f%T\x1f%k").stdout
    return [line.split("\x1f") for line in shown.splitlines()]


def test_up_train_down_on_two_slurm_nodes_through_a_login_node_over_ssh_leaves_nothing(
    slurm: SlurmLab, slurm_sh: Shell, slurm_login: LoginNode
) -> None:
    """The login node reached over SSH: Slurm's commands and the cluster's folder (by default
    ~/.cloudtrain/slurm there) are its, and this machine has no SLURM_CONF of the lab. The
    preflight proves the network across the allocation; `status` shows its time limit."""
    del slurm_sh.env["SLURM_CONF"]
    where = ["--provider", "slurm", *slurm_login.args()]
    shape = ["--python", sys.executable, "--nodes", "2", "--name", "exp1", "--time", "30"]
    up = slurm_sh("up", *where, *shape, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "cluster exp1 is up: 2 node(s)" in up.stdout
    [job] = jobs(slurm)
    assert job[1:3] == ["exp1", "RUNNING"]
    assert job[3].startswith('cloudtrain {"id": '), "whose it is, on it"
    assert '"owner": ' in job[3]
    [cluster] = slurm_sh.status()["clusters"]
    ips = [n["private_ip"] for n in cluster["nodes"]]
    assert ips == ["127.0.0.1", "127.0.0.1"], "n2's NodeAddr, localhost, resolved at the login"
    folder = slurm_login.host.home / ".cloudtrain" / "slurm" / "exp1"
    assert (folder / "node-1" / "bootstrap").is_dir(), "the login user's folder"

    train = slurm_sh("train", "-c", "exp1", str(EXAMPLE), "--epochs", "2", timeout=180)
    assert train.returncode == 0, train.stdout + train.stderr
    assert "[node 1]" in train.stdout, "both nodes' ranks are heard"
    accuracy = re.search(r"final test accuracy: ([\d.]+)", train.stdout)
    assert accuracy, train.stdout
    assert float(accuracy.group(1)) > 0.9, train.stdout
    assert [j[0] for j in jobs(slurm)] == [job[0]], "the job ran as steps: nothing queued again"
    preflight = slurm_sh("preflight", "exp1", timeout=180)
    assert preflight.returncode == 0, preflight.stdout + preflight.stderr
    assert "2 ranks on gloo" in preflight.stdout
    assert preflight.stdout.rstrip().endswith("PASS"), preflight.stdout
    status = slurm_sh("status")
    assert re.search(r"time limit ends in 2\dm\d\ds", status.stdout), status.stdout

    assert slurm.job_processes(), "the hosts, agents and warm servers run inside the job"
    (slurm_sh.home / "state.db").unlink()  # down reads Slurm, not what this machine recorded
    down = slurm_sh("down", "exp1", *where)
    assert down.returncode == 0, down.stdout + down.stderr
    assert jobs(slurm) == []
    assert not folder.exists()
    assert [_command(p) for p in slurm.job_processes()] == []


def test_a_managed_job_whose_node_slurm_sets_down_resumes_with_that_node_made_again(
    slurm: SlurmLab, slurm_sh: Shell, slurm_login_apart: LoginNode
) -> None:
    """A node Slurm sets down leaves the cluster's job running on the others (``--no-kill``;
    each node's host is a step of its own); the watcher sees the node gone, makes it again as a
    job of one node, and resumes from the newest checkpoint. On a site without a shared home:
    the checkpoints come back from the nodes' own folders, and go to the new node's, through
    steps; nothing of either job is left on a node."""
    slurm_sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    del slurm_sh.env["SLURM_CONF"]
    where = ["--provider", "slurm", *slurm_login_apart.args()]
    shape = ["--python", sys.executable, "--nodes", "2", "--name", "m"]
    up = slurm_sh("up", *where, *shape, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    [first] = slurm.queue()
    train = slurm_sh.popen("train", "-c", "m", "--managed", str(EXAMPLE), "--",
                           "--epochs", "6", "--pause", "1")  # fmt: skip
    out = slurm.lose_node_under(train, once="epoch 3/6")
    assert train.returncode == 0, out
    assert re.search(r"recovery 1/3: node 1 went away", out), out
    resumed = re.search(r"resumed from epoch (\d+)", out)
    assert resumed, out
    assert int(resumed.group(1)) >= 2, out
    accuracy = re.search(r"final test accuracy: ([\d.]+)", out)
    assert accuracy, out
    assert float(accuracy.group(1)) >= 0.95, out
    held = jobs(slurm)
    assert [j[0] for j in held][:1] == [first], "the cluster's job ran on"
    [again] = [j for j in held if j[0] != first]
    assert again[1:3] == ["m", "RUNNING"], again
    assert '"index": 1' in again[3], "a job of one node that makes node 1 again"
    nodes = slurm_login_apart.host.home / ".cloudtrain" / "slurm" / "m"  # as the nodes see it
    assert (nodes / "node-0").is_dir()
    assert slurm_sh("down", "m", *where).returncode == 0
    assert slurm.queue() == []
    assert [_command(p) for p in slurm.job_processes()] == []
    assert not nodes.exists(), "nothing of either job on a node"
