"""`down` of an ssh cluster returns once nothing of the cluster runs on its hosts: over two real
sshd hosts (`tests.sshd`), a cluster whose nodes each run a warm server (`cloudtrain.jobs.warm`)
and their resident agents; right after `down` returns, no process on this machine names a node
of the cluster, in its environment or its command line."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.node import procs
from tests.integration.conftest import SCRIPTS, Shell, down_leaves_nothing
from tests.sshd import Lab

pytestmark = pytest.mark.integration


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    built = Lab(tmp_path / "lab")
    yield built
    built.stop()


def test_down_returns_when_nothing_of_the_cluster_runs(sh: Shell, lab: Lab) -> None:
    """With `--python` (the hosts' interpreter has cloudtrain). The default, a venv per node
    (the hosts' own `python3`, which `down` uses, has neither torch nor cloudtrain), is checked
    the same way at the end of `test_ssh_cluster`'s install test, which pays for a venv once."""
    name = f"dn{uuid.uuid4().hex[:8]}"
    base = lab.home / ".cloudtrain" / name
    try:
        up = sh(*lab.up_args(name), timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        train = sh("train", "-c", name, str(SCRIPTS / "countdown.py"))
        assert train.returncode == 0, train.stdout + train.stderr
        down_leaves_nothing(sh, name, base)
    finally:
        procs.kill_matching({"CLOUDTRAIN_CLUSTER": name}, grace_s=2)
        for i in range(2):
            procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(base / f"node-{i}")}, grace_s=2)
