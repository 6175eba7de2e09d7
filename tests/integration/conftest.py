"""The integration tier: the real CLI in subprocesses, real torchrun, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.node import procs

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
    procs.kill_matching({"CLOUDTRAIN_HOME": str(shell.home)}, grace_s=2)
    assert not leftovers, f"processes left behind: {leftovers}"


def wait_for(predicate: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def require(found: bool, why: str) -> None:
    """Skip the test when a tool it needs (TensorFlow, Horovod, Chromium) is not here; fail it
    where ``CLOUDTRAIN_TEST_TOOLS=required`` (`.ci/run`, which installs them all)."""
    if found:
        return
    if os.environ.get("CLOUDTRAIN_TEST_TOOLS") == "required":
        pytest.fail(why)
    pytest.skip(why)
