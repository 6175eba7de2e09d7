"""A detached job's end as its node saw it: `status` run long after the job ended records the
end the node wrote (not the moment it looked), and a running dashboard records it by itself,
with no other command run. Real local clusters, real torchrun, the real CLI."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import CLOUDTRAIN, REPO, Shell, wait_for
from tests.integration.test_dashboard import login

pytestmark = pytest.mark.integration
SHORT = "import time\ntime.sleep(1.0)\nprint(f'ended at {time.time()!r}', flush=True)\n"


def start_short_job(sh: Shell, tmp_path: Path, cluster: str) -> str:
    work = tmp_path / "work"  # not the folder that holds the home
    work.mkdir(exist_ok=True)
    (work / "short.py").write_text(SHORT)
    start = sh("train", "-c", cluster, "--detach", str(work / "short.py"))
    assert start.returncode == 0, start.stderr
    return f"{cluster}-1"


def wait_for_the_end_on_its_node(sh: Shell, cluster: str, job_id: str) -> tuple[float, float]:
    """(when the job printed its last line, a moment just after its node recorded its end),
    read from the node's own folder: no cloudtrain command runs meanwhile."""
    folder = sh.home / "local" / cluster / "node-0" / "jobs" / job_id
    wait_for(lambda: (folder / "exit_code").exists(), timeout=120, what="the job to end")
    seen = time.time()
    printed = (folder / "node.log").read_text().split("ended at ")[1].split()[0]
    return float(printed), seen


def test_status_long_after_records_the_end_the_node_saw(sh: Shell, tmp_path: Path) -> None:
    assert sh("up", "--name", "brief", "--nodes", "1").returncode == 0
    job_id = start_short_job(sh, tmp_path, "brief")
    printed, seen = wait_for_the_end_on_its_node(sh, "brief", job_id)
    time.sleep(6)  # then someone looks
    job = sh.job(job_id)
    assert job["status"] == "succeeded"
    assert printed <= job["ended_at"] <= seen, (printed, job["ended_at"], seen)
    assert job["started_at"] <= printed
    assert sh("down", "brief").returncode == 0


def test_a_running_dashboard_records_the_end_by_itself(sh: Shell, tmp_path: Path) -> None:
    assert sh("up", "--name", "shown", "--nodes", "1").returncode == 0
    board = subprocess.Popen([*CLOUDTRAIN, "dashboard", "--no-open"], env=sh.env, cwd=REPO,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert board.stdout is not None
        url = board.stdout.readline().strip()
        base, cookie = url.split("/login")[0], login(url)

        def shown() -> dict[str, object]:
            request = urllib.request.Request(f"{base}/api/state", headers={"Cookie": cookie})
            with urllib.request.urlopen(request, timeout=10) as resp:
                jobs = json.loads(resp.read())["jobs"]
            return dict(next(j for j in jobs if j["id"] == job_id))

        job_id = start_short_job(sh, tmp_path, "shown")
        printed, seen = wait_for_the_end_on_its_node(sh, "shown", job_id)
        wait_for(lambda: shown()["status"] == "succeeded", timeout=60, what="the page to say so")
        ended = shown()["ended_at"]
        assert isinstance(ended, float)
        assert printed <= ended <= seen, (printed, ended, seen)
    finally:
        board.terminate()
        board.communicate(timeout=30)
    assert sh("down", "shown").returncode == 0
