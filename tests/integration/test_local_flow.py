"""The local vertical slice through the real CLI: up → train → status → logs → down."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, SCRIPTS, TWO, Shell, wait_for

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"


def loose(home: Path) -> list[str]:
    """What under `home` another user could read or enter (symlinks and sockets aside)."""
    return [
        f"{oct(path.stat().st_mode & 0o777)} {path}"
        for path in [home, *home.rglob("*")]
        if not path.is_symlink() and not path.is_socket() and path.stat().st_mode & 0o077
    ]


def test_two_node_ddp_trains_streams_both_nodes_and_leaves_nothing(sh: Shell) -> None:
    sh.home.mkdir(mode=0o755)  # a home made by hand, as loose as the shell's umask makes it
    sh.home.chmod(0o755)
    up = sh("up", "--provider", "local", "--nodes", "2", "--name", "demo")
    assert up.returncode == 0, up.stderr
    assert "cluster demo is up: 2 node(s)" in up.stdout
    verify = {}
    for i in (0, 1):
        status = json.loads((sh.home / f"local/demo/node-{i}/bootstrap/status.json").read_text())
        verify[i] = next(p["state"] for p in status["phases"] if p["name"] == "verify")
    assert verify == {0: "done", 1: "skipped"}, "the nodes are one machine: verified once"

    train = sh("train", "-c", "demo", str(EXAMPLE), "--", "--epochs", "5")
    assert train.returncode == 0, train.stdout + train.stderr
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", train.stdout)
    assert accuracy, train.stdout
    assert float(accuracy.group(1)) >= 0.95, train.stdout
    assert "[node 0] " in train.stdout
    assert "[node 1] " in train.stdout
    job_id = re.search(r"job (demo-\d+) succeeded", train.stderr)
    assert job_id, train.stderr
    assert re.search(r"syncing .*examples: \d+ file\(s\), [\d.]+ [KM]?B to each node", train.stderr)

    job = sh.job(job_id.group(1))
    assert job["status"] == "succeeded"
    assert job["exit_code"] == 0
    assert job["num_nodes"] == 2
    assert job["nproc_per_node"] == 1
    cluster = sh.status()["clusters"][0]
    assert cluster["name"] == "demo"
    assert len(cluster["nodes"]) == 2

    logs = sh("logs", job_id.group(1))
    assert logs.returncode == 0
    assert "final test accuracy" in logs.stdout
    reported = sh("metrics", job_id.group(1), "--json")
    assert reported.returncode == 0, reported.stderr
    per_epoch = [ln for ln in json.loads(reported.stdout) if "loss" in ln]
    printed = re.findall(r"epoch (\d)/5 loss ([\d.]+) train_acc ([\d.]+) test_acc ([\d.]+)",
                         train.stdout)  # fmt: skip
    assert [(str(m["epoch"]), f"{m['loss']:.4f}", f"{m['train_acc']:.4f}",
             f"{m['test_acc']:.4f}") for m in per_epoch] == printed  # fmt: skip
    assert [m["step"] for m in per_epoch] == [23, 46, 69, 92, 115]
    assert all(m["rank"] == 0 and m["samples_s"] > 0 for m in per_epoch)
    assert "[node 0] " in logs.stdout
    assert "[node 1] " in logs.stdout

    # a second run on the same cluster resumes from the checkpoint of the first when asked
    # (a new job has a checkpoint folder of its own: without --resume-from it starts afresh)
    again = sh("train", "-c", "demo", "--resume-from", job_id.group(1), str(EXAMPLE), "--",
               "--epochs", "6")  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed from epoch 5" in again.stdout
    assert "epoch 6/6" in again.stdout
    assert "epoch 5/6" not in again.stdout

    assert loose(sh.home) == [], "every file 0600, every folder 0700"
    down = sh("down", "demo")
    assert down.returncode == 0
    assert "is down" in down.stdout
    assert not (sh.home / "local" / "demo").exists()
    assert sh.status()["clusters"] == []
    assert sh.processes() == []
    # the logs outlive the cluster
    kept = sh("logs", job_id.group(1))
    assert kept.returncode == 0
    assert "final test accuracy" in kept.stdout
    table = sh("metrics", job_id.group(1))
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == [
        "attempt", "step", "at", "epoch", "loss", "train_acc", "test_acc", "samples_s",
    ]  # fmt: skip
    assert len(table.stdout.splitlines()) == 6
    assert "the script said it takes 115 steps" in table.stderr
    curve = sh.home.parent / "curve.png"
    drawn = sh("plot", job_id.group(1), "loss", "test_acc", "-o", str(curve))
    assert drawn.returncode == 0, drawn.stderr
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    unknown = sh("plot", job_id.group(1), "los")
    assert unknown.returncode == 2
    assert unknown.stderr == (
        f"error: metric 'los': job {job_id.group(1)} reported epoch, loss, train_acc, test_acc, "
        "samples_s\n"
    )

    again_down = sh("down", "demo")
    assert again_down.returncode == 0
    assert "nothing to do" in again_down.stdout


def test_a_horovod_style_script_trains_on_two_nodes_unchanged(two_nodes: Shell) -> None:
    """`examples/digits_hvd.py`, written as Horovod's docs write a script, under cloudtrain's
    torchrun through `cloudtrain.runtime.hvd` (Horovod itself is not installed here)."""
    sh = two_nodes
    train = sh("train", "-c", TWO, str(REPO / "examples" / "digits_hvd.py"), "--",
               "--epochs", "5")  # fmt: skip
    assert train.returncode == 0, train.stdout + train.stderr
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", train.stdout)
    assert accuracy, train.stdout
    assert float(accuracy.group(1)) >= 0.95, train.stdout


def test_a_jobs_checkpoint_outlives_its_cluster_and_starts_a_job_on_another(sh: Shell) -> None:
    """The head node's checkpoints come back to this machine when the job ends (and before
    `down`); a new job on the same cluster starts afresh, and one on a new cluster from them
    with --resume-from."""
    assert sh("up", "--name", "first", "--nodes", "2").returncode == 0
    train = sh("train", "-c", "first", str(EXAMPLE), "--", "--epochs", "2")
    assert train.returncode == 0, train.stdout + train.stderr
    job_id = re.search(r"job (first-\d+) succeeded", train.stderr)
    assert job_id
    assert f"`--resume-from {job_id.group(1)}` starts a job from it" in train.stderr
    kept = sh.home / "checkpoints" / job_id.group(1)
    assert [p for p in kept.iterdir() if p.name.isdigit()], "a whole snapshot is kept"
    missing = sh("train", "-c", "first", str(EXAMPLE), "--resume-from", "first-999")
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.startswith("error: job first-999 has no checkpoint kept here")
    assert [j["id"] for j in sh.status()["jobs"]] == [job_id.group(1)], "nothing started"
    afresh = sh("train", "-c", "first", str(EXAMPLE), "--", "--epochs", "1")
    assert afresh.returncode == 0, afresh.stdout + afresh.stderr
    assert "resumed" not in afresh.stdout, "a new job does not take the last one's weights"
    assert "epoch 1/1" in afresh.stdout
    assert sh("down", "first").returncode == 0

    assert sh("up", "--name", "second", "--nodes", "2").returncode == 0
    resumed = sh("train", "-c", "second", str(EXAMPLE), "--resume-from", job_id.group(1),
                 "--", "--epochs", "3")  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from epoch 2" in resumed.stdout
    assert "epoch 3/3" in resumed.stdout
    assert "epoch 1/3" not in resumed.stdout
    assert sh("down", "second").returncode == 0


def test_detach_logs_follow_and_cancel_leave_no_process(two_nodes: Shell) -> None:
    sh = two_nodes
    start = sh("train", "-c", TWO, "--detach", str(SCRIPTS / "sleeper.py"))
    assert start.returncode == 0, start.stderr
    job_id = re.search(rf"job ({TWO}-\d+) running", start.stderr)
    assert job_id
    assert "cloudtrain logs" in start.stderr
    jid = job_id.group(1)
    assert sh.job(jid)["status"] == "running"
    wait_for(lambda: "tick 2" in sh("logs", jid).stdout, what="the job's output")
    logs = sh("logs", jid).stdout
    assert "[node 0] " in logs
    assert "[node 1] " in logs

    follower = sh.popen("logs", jid, "-f")
    time.sleep(2)
    cancel = sh("cancel", jid)
    assert cancel.returncode == 0, cancel.stderr
    assert "cancelled" in cancel.stdout
    out, _ = follower.communicate(timeout=60)
    assert follower.returncode == 0
    assert "tick" in out
    assert sh.job(jid)["status"] == "cancelled"
    assert sh.strays() == []  # the cluster's agents stay
    assert sh("cancel", jid).returncode == 0  # idempotent


def test_a_failing_node_fails_the_job_stops_the_others_and_exits_1(two_nodes: Shell) -> None:
    sh = two_nodes
    train = sh("train", "-c", TWO, str(SCRIPTS / "fail_on_node.py"), timeout=120)
    assert train.returncode == 1, train.stdout + train.stderr
    assert "failed: node 1 exited" in train.stderr
    assert "boom: node 1 gives up" in train.stderr  # the failed node's log tail is shown
    job = sh.status()["jobs"][0]
    assert job["status"] == "failed"
    assert job["detail"]["failed_node"] == 1
    assert sh.strays() == []  # the cluster's agents stay


def test_ctrl_c_stops_following_and_leaves_the_job_running(sh: Shell) -> None:
    assert sh("up", "--name", "cc", "--nodes", "1").returncode == 0
    proc = sh.popen("train", "-c", "cc", str(SCRIPTS / "sleeper.py"))
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "tick 1" in line:
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, "".join(seen) + rest
    assert "keeps running" in rest
    assert "cloudtrain cancel cc-1" in rest
    assert sh.job("cc-1")["status"] == "running"
    assert sh("down", "cc").returncode == 0  # down cancels the job first
    assert sh.job("cc-1")["status"] == "cancelled"
    assert sh.processes() == []


def test_launch_with_down_runs_the_task_file_and_tears_down(sh: Shell, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        f"name: launched\nnum_nodes: 2\nworkdir: {SCRIPTS}\n"
        "run: show_args.py 'two words' '$(touch /tmp/pwned)' 'a;b' \"q'uote\"\n"
        'envs:\n  ODD: "x y $HOME `id`"\n'
    )
    done = sh("launch", str(task), "--down")
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"argv": ["two words", "$(touch /tmp/pwned)", "a;b", "q\'uote"]' in done.stdout
    assert '"odd": "x y $HOME `id`"' in done.stdout
    assert "cluster launched is down" in done.stderr
    assert sh.status()["clusters"] == []
    assert sh.processes() == []


def listeners(pids: list[int]) -> list[tuple[str, int]]:
    """(local address, pid) of every TCP socket listening in one of `pids` (``ss``)."""
    lines = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in lines.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & set(pids):
            found.append((line.split()[3], min(owners & set(pids))))
    return found


def test_a_running_job_listens_on_loopback_only(two_nodes: Shell) -> None:
    """The rendezvous store, the workers' store and gloo's pairs of a local job listen on
    127.0.0.1, never on every interface (torch's c10d backend listens on ``*``)."""
    sh = two_nodes
    start = sh("train", "-c", TWO, "--detach", str(SCRIPTS / "grouped_sleeper.py"))
    assert start.returncode == 0, start.stderr
    jid = re.search(rf"job ({TWO}-\d+) running", start.stderr)
    assert jid
    wait_for(lambda: "grouped 2" in sh("logs", jid.group(1)).stdout, what="the process group")
    found = listeners(sh.processes())
    assert len(found) >= 4, found  # two stores on the head's agent, a gloo listener per worker
    assert [a for a, _ in found if not a.startswith("127.0.0.1:")] == [], found
    assert sh("cancel", jid.group(1)).returncode == 0
