"""The ssh provider through the CLI over two real sshd hosts (127.0.0.2 and 127.0.0.3): up,
a DDP job across them, a job that outlives a killed CLI, cancel, down leaving nothing."""

from __future__ import annotations

import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import node as agent
from tests.integration.conftest import REPO, SCRIPTS, Shell, wait_for
from tests.sshd import Lab, keygen

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    built = Lab(tmp_path_factory.mktemp("lab") / "lab")
    yield built
    built.stop()


@pytest.fixture
def name() -> Iterator[str]:
    cluster = f"lab{uuid.uuid4().hex[:8]}"
    yield cluster
    left = agent.find_processes({"CLOUDTRAIN_CLUSTER": cluster})
    agent.kill_matching({"CLOUDTRAIN_CLUSTER": cluster}, grace_s=2)
    assert not left, f"processes left behind: {left}"
    assert not (Path.home() / ".cloudtrain" / cluster).exists()


def test_ddp_across_two_ssh_hosts_and_down_leaves_nothing(sh: Shell, lab: Lab, name: str) -> None:
    up = sh(*lab.up_args(name))
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"cluster {name} is up: 2 node(s)" in up.stdout
    assert "verify: ready" in up.stderr
    train = sh("train", "-c", name, str(REPO / "examples" / "digits_ddp.py"), "--", "--epochs", "5")
    assert train.returncode == 0, train.stdout + train.stderr
    accuracy = re.search(r"final test accuracy: (\d\.\d+)", train.stdout)
    assert accuracy, train.stdout
    assert float(accuracy.group(1)) >= 0.95
    assert "[node 0] rank 0/2 on node 0" in train.stdout
    assert "[node 1] rank 1/2 on node 1" in train.stdout
    down = sh("down", name)
    assert down.returncode == 0, down.stderr
    assert not (Path.home() / ".cloudtrain" / name).exists()


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
    assert agent.find_processes({"CLOUDTRAIN_JOB_ID": second.group(1)})
    cancel = sh("cancel", second.group(1))
    assert cancel.returncode == 0, cancel.stderr
    assert "cancelled" in cancel.stdout
    assert agent.find_processes({"CLOUDTRAIN_JOB_ID": second.group(1)}) == []
    assert sh("down", name).returncode == 0


def test_a_host_down_at_up_is_named_and_the_others_are_left_clean(
    sh: Shell, lab: Lab, name: str
) -> None:
    good = f"root@{lab.hosts[0].host}:{lab.hosts[0].port}"
    result = sh(*lab.up_args(name, [good, "root@127.0.0.9:2"]))
    assert result.returncode == 3
    assert "cannot reach root@127.0.0.9:2" in result.stderr
    assert not (Path.home() / ".cloudtrain" / name).exists()


def test_a_wrong_host_key_is_refused(sh: Shell, lab: Lab, name: str, tmp_path: Path) -> None:
    wrong = tmp_path / "known_hosts"
    other = keygen(tmp_path / "other")
    wrong.write_text(f"{lab.hosts[0].address} {' '.join(other.split()[:2])}\n")
    args = lab.up_args(name, [f"root@{lab.hosts[0].host}:{lab.hosts[0].port}"])
    args[args.index("--known-hosts") + 1] = str(wrong)
    result = sh(*args)
    assert result.returncode == 3
    assert "did not present the cluster's pinned host key" in result.stderr
