"""What the records and messages say after a refused, killed or cut-short command, through the
real CLI in subprocesses: a refused ssh `up` over a real sshd leaves no record; `down` during
`train` is a cancelled job, not "failed: node None"; a killed `down` is finished by `down`; a
killed `up` in the bootstrap wait does not stay ``bootstrapping`` forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.node import procs
from cloudtrain.state import State
from tests.integration.conftest import SCRIPTS, Shell, wait_for
from tests.sshd import Lab

pytestmark = pytest.mark.integration


@pytest.fixture
def name() -> str:
    return f"rec{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    built = Lab(tmp_path_factory.mktemp("lab") / "lab", addresses=(21,))
    yield built
    built.stop()


def test_a_refused_ssh_up_leaves_no_record(sh: Shell, lab: Lab, name: str, tmp_path: Path) -> None:
    """The ssh control folder is a symlink (another user could have planted it): `up` is
    refused before anything is written, and so is listing what it made; no `partial 0/1`."""
    planted = tmp_path / "tmp"
    planted.mkdir()
    (planted / f"cloudtrain-ssh-{os.getuid()}").symlink_to(tmp_path)
    sh.env["TMPDIR"] = str(planted)
    try:
        up = sh(*lab.up_args(name))
    finally:
        del sh.env["TMPDIR"]
    assert up.returncode == 2, up.stdout + up.stderr
    assert (
        up.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: ssh control folder {planted / f'cloudtrain-ssh-{os.getuid()}'} is a symlink"
        )
    )
    assert "could not list" not in up.stderr
    assert sh.status()["clusters"] == []
    down = sh("down", name)
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == f"nothing to do: no cluster named {name!r}"
    assert not (lab.home / ".cloudtrain" / name).exists()


def test_down_during_train_is_a_cancelled_job(sh: Shell, name: str) -> None:
    assert sh("up", "--name", name).returncode == 0
    train = sh.popen("train", "-c", name, str(SCRIPTS / "sleeper.py"))
    assert train.stdout is not None
    for line in train.stdout:
        if "tick 2" in line:
            break
    down = sh("down", name)
    assert down.returncode == 0, down.stderr
    out, _ = train.communicate(timeout=120)
    job = sh.status()["jobs"][0]
    assert job["status"] == "cancelled"
    assert out.splitlines()[-2:] == [
        f"job {job['id']} cancelled",
        f"error: job {job['id']}: cancelled",
    ]
    assert "node None" not in out
    assert train.returncode == 1


def test_a_killed_down_is_finished_by_down(sh: Shell, name: str) -> None:
    """`down` is killed while it stops the node's processes (one of them ignores SIGTERM, so
    the teardown waits its grace): `status` says `down` again finishes it, and it does."""
    assert sh("up", "--name", name, "--no-setup").returncode == 0
    root = sh.home / "local" / name / "node-0"
    assert root.is_dir()
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(120)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**sh.env, "CLOUDTRAIN_NODE_ROOT": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout is not None
    assert stubborn.stdout.readline().strip() == "ready"
    down = sh.popen("down", name)

    def terminating() -> bool:
        with State.open(sh.home) as state:
            return [i.action for i in state.open_intents(name)] == ["terminate"]

    wait_for(terminating, timeout=120, what="down to begin its teardown")
    down.send_signal(signal.SIGKILL)
    down.communicate(timeout=30)
    said = sh("status")
    assert said.returncode == 0
    assert f"warning: an earlier `cloudtrain down {name}` was interrupted" in said.stderr
    assert f"`cloudtrain down {name}` again finishes it" in said.stderr
    assert "`cloudtrain up` it again" not in said.stderr
    again = sh("down", name)
    assert again.returncode == 0, again.stderr
    stubborn.wait(timeout=30)  # killed by the teardown, past its grace
    stubborn.stdout.close()
    assert not root.exists()
    assert "interrupted" not in sh("status").stderr


def test_a_killed_up_in_the_bootstrap_wait_says_what_finishes_it(sh: Shell, name: str) -> None:
    up = sh.popen("up", "--name", name)
    assert up.stdout is not None
    for line in up.stdout:
        if "node 0: torch: running" in line or "node 0: verify: running" in line:
            break
    with State.open(sh.home) as state:
        record = state.cluster(name)
        assert record is not None
        assert record.status == "bootstrapping"
    up.send_signal(signal.SIGKILL)
    up.communicate(timeout=30)
    said = sh("status")
    assert said.returncode == 0
    assert "bootstrapping" not in said.stdout
    assert "unwatched" in said.stdout
    assert (
        f"warning: the wait for the bootstrap of {name!r} was interrupted; its nodes run, ready "
        f"or not: `cloudtrain up` it again to wait, or `cloudtrain down {name}`"
    ) in said.stderr
    events = sh("events", name)
    assert "killed before it ended" in events.stdout
    again = sh("up", "--name", name)
    assert again.returncode == 0, again.stderr
    assert sh.status()["clusters"][0]["status"] == "up"
    assert sh("down", name).returncode == 0
    assert (
        procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(sh.home / "local" / name / "node-0")})
        == []
    )
