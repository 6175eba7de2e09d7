"""The integration tier: the real CLI in subprocesses, real torchrun, real processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs import warm
from cloudtrain.node import procs
from tests.conftest import unavailable
from tests.sshd import Lab

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
CLOUDTRAIN = [sys.executable, "-m", "cloudtrain.cli"]


class Shell:
    """Runs `cloudtrain` as a user would, with its own CLOUDTRAIN_HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "CLOUDTRAIN_HOME": str(home), "COLUMNS": "200"}

    def __call__(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLOUDTRAIN, *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*CLOUDTRAIN, *args],
            env=self.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def status(self) -> dict[str, Any]:
        done = self("status", "--json")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in self.status()["jobs"] if j["id"] == job_id)

    def processes(self) -> list[int]:
        """Every live process started for this home (jobs inherit CLOUDTRAIN_HOME)."""
        return procs.find_processes({"CLOUDTRAIN_HOME": str(self.home)})

    def agents(self) -> list[int]:
        """The resident node agents (and their supervisors) of this home's clusters: they
        stay while a cluster is up."""
        return [p for p in self.processes() if is_agent(p)]

    def strays(self) -> list[int]:
        """This home's processes but the node agents: none once no job runs."""
        return [p for p in self.processes() if not is_agent(p)]


def is_agent(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[1:4] == [b"-m", b"cloudtrain.node", b"agent"]


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    shell = Shell(tmp_path / "home")
    yield shell
    leftovers = shell.strays()  # a cluster a test leaves up keeps its agents: stop them too
    _stop_all(shell)
    assert not leftovers, f"processes left behind: {leftovers}"


def _stop_all(shell: Shell) -> None:
    """Every process of `shell`'s home, its clusters' warm servers (which carry no home) too."""
    procs.kill_matching({"CLOUDTRAIN_HOME": str(shell.home)}, grace_s=2)
    clusters = [str(c) for c in shell.home.glob("local/*")]
    procs.stop(lambda: [pid for c in clusters for pid in procs.find_nodes(c)], grace_s=2)


#: The name of `two_nodes`' cluster.
TWO = "two"


@pytest.fixture(scope="session")
def _two_nodes_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    shell = Shell(tmp_path_factory.mktemp("two") / "home")
    try:
        up = shell("up", "--nodes", "2", "--name", TWO)
        assert up.returncode == 0, up.stderr
        yield shell
        down = shell("down", TWO)
        assert down.returncode == 0, down.stderr
        assert shell.processes() == [], "the agents outlived `down`"
    finally:
        _stop_all(shell)


@pytest.fixture
def two_nodes(_two_nodes_up: Shell) -> Iterator[Shell]:
    """`sh` with a local cluster of 2 nodes up, named `TWO`: one for every test that only
    trains on a cluster (an `up` and `down` cost about 14 s of CPU: the bootstrap, its check,
    the nodes' warm servers), brought up once per worker process. Each test must leave no
    process of its jobs (checked after it; what it left is stopped, so the next test starts
    clean), and must not change the cluster; `down` comes after the session's last test, and
    must leave nothing."""
    shell = _two_nodes_up
    yield shell
    try:
        wait_for(lambda: not shell.strays(), timeout=30, what="the test's jobs to end")
    finally:
        procs.stop(shell.strays, grace_s=2)  # so the next test starts clean


def wait_for(predicate: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def came_back_on_all(out: str) -> None:
    """An elastic job's output after a lost node: it was made again, the job started again on
    all nodes, resumed from epoch 2 or later, and ended at a test accuracy of 0.9 or more."""
    assert re.search(r"node 1 is back after \d+\.\d s; the job starts again on all", out), out
    resumed = [int(e) for e in re.findall(r"resumed from epoch (\d+)", out)]
    assert resumed, out
    assert resumed[-1] >= 2, out
    accuracy = re.search(r"final test accuracy: ([\d.]+)", out)
    assert accuracy, out
    assert float(accuracy.group(1)) >= 0.9, out


def require(found: bool, why: str) -> None:
    """Skip the test when a tool it needs (TensorFlow, Horovod, Chromium) is not here; fail it
    where ``CLOUDTRAIN_TEST_TOOLS=required`` (`.ci/run`, which installs them all)."""
    if found:
        return
    if os.environ.get("CLOUDTRAIN_TEST_TOOLS") == "required":
        pytest.fail(why)
    pytest.skip(why)


def of_cluster(base: Path) -> list[int]:
    """Every live process whose environment or command line names a node of the cluster
    under `base` (a marker renamed in place, as the warm client hides its own, included)."""
    mark = str(base).encode() + b"/node-"
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            seen = [Path(entry.path, f).read_bytes() for f in ("environ", "cmdline")]
        except OSError:
            continue
        if any(mark in text for text in seen) and procs.alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def torch_index(tmp_path: Path) -> str:
    """A local wheel index serving this machine's torch CPU wheel (as the install test's)."""
    wheels = sorted(Path("/opt/wheels").glob("torch-2.*+cpu-*.whl"))
    if not wheels:
        unavailable("no torch CPU wheel in /opt/wheels to serve the nodes as their torch index")
    index = tmp_path / "whl" / "cpu"
    (index / "torch").mkdir(parents=True)
    (index / "torch" / wheels[-1].name).symlink_to(wheels[-1])
    return index.as_uri()


def down_leaves_nothing(sh: Shell, name: str, base: Path) -> None:
    """The first fork job's end started each node's warm server (the next job's agent), and
    the resident agents run: right after `down` returns none of them, nor the folder, is left."""
    roots = [base / f"node-{i}" for i in range(2)]
    serving = lambda: all((warm.folder(r) / "sock").exists() for r in roots)  # noqa: E731
    wait_for(serving, timeout=120, what="each node's warm server")
    for root in roots:
        assert procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)})
    down = sh("down", name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert of_cluster(base) == []
    assert not base.exists()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Two sshd hosts (127.0.0.2, 127.0.0.3) for a module's tests of the ssh provider."""
    built = Lab(tmp_path_factory.mktemp("lab") / "lab")
    yield built
    built.stop()


@pytest.fixture
def name(lab: Lab) -> Iterator[str]:
    """A cluster name of the test's own on `lab`: none of its processes or files left after."""
    cluster = f"lab{uuid.uuid4().hex[:8]}"
    yield cluster
    left = procs.find_processes({"CLOUDTRAIN_CLUSTER": cluster})
    procs.kill_matching({"CLOUDTRAIN_CLUSTER": cluster}, grace_s=2)
    assert not left, f"processes left behind: {left}"
    assert not (lab.home / ".cloudtrain" / cluster).exists()
