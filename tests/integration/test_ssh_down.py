"""`down` of an ssh cluster returns once nothing of the cluster runs on its hosts: over two real
sshd hosts (`tests.sshd`), a cluster whose nodes each run a warm server (`cloudtrain.jobs.warm`)
and their resident agents; right after `down` returns, no process on this machine names a node
of the cluster, in its environment or its command line."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.jobs import warm
from cloudtrain.node import procs
from tests.conftest import unavailable
from tests.integration.conftest import SCRIPTS, Shell, wait_for
from tests.sshd import Lab

pytestmark = pytest.mark.integration


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    built = Lab(tmp_path / "lab")
    yield built
    built.stop()


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


@pytest.mark.parametrize("install", [False, True], ids=["python", "venv"])
def test_down_returns_when_nothing_of_the_cluster_runs(
    sh: Shell, lab: Lab, tmp_path: Path, install: bool
) -> None:
    """Either way a node gets its Python: `--python` (the hosts' interpreter has cloudtrain), or
    the default, a venv per node with torch and cloudtrain in it (the hosts' `python3`, which
    `down` has, has neither)."""
    name = f"dn{uuid.uuid4().hex[:8]}"
    base = Path.home() / ".cloudtrain" / name
    args = lab.up_args(name)
    if install:
        args = [a for a in args if a not in ("--python", sys.executable)]
        args += ["--torch-index", torch_index(tmp_path)]
    try:
        up = sh(*args, timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        train = sh("train", "-c", name, str(SCRIPTS / "countdown.py"))
        assert train.returncode == 0, train.stdout + train.stderr
        roots = [base / f"node-{i}" for i in range(2)]
        # the first fork job's end started each node's warm server: the next job's agent
        serving = lambda: all((warm.folder(r) / "sock").exists() for r in roots)  # noqa: E731
        wait_for(serving, timeout=120, what="each node's warm server")
        for root in roots:
            assert procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)})
        down = sh("down", name)
        assert down.returncode == 0, down.stdout + down.stderr
        assert of_cluster(base) == []
        assert not base.exists()
    finally:
        procs.kill_matching({"CLOUDTRAIN_CLUSTER": name}, grace_s=2)
        for i in range(2):
            procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(base / f"node-{i}")}, grace_s=2)
