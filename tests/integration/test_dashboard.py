"""`cloudtrain dashboard` in a real headless Chromium: the page of a running local job's loss
curve, growing while the job runs, and its cluster's cost so far; what another local user
without the token gets; Ctrl-C stops it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import CLOUDTRAIN, REPO, Shell, require, wait_for

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"


def chromium(*args: str) -> str:
    """What headless Chromium prints for `args` (its page scripts run for 8 s of page time)."""
    sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []  # root has no user namespace sandbox
    done = subprocess.run(
        ["chromium", "--headless", "--disable-gpu", *sandbox, "--virtual-time-budget=8000", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def test_the_page_shows_a_running_jobs_curve_and_its_clusters_cost(
    sh: Shell, tmp_path: Path
) -> None:
    require(shutil.which("chromium") is not None, "no chromium: apt-get install chromium")
    assert sh("up", "--name", "dash", "--nodes", "2", "--node-price", "1.80").returncode == 0
    start = sh("train", "-c", "dash", "-d", str(EXAMPLE), "--", "--epochs", "60", "--pause", "1")
    assert start.returncode == 0, start.stderr
    board = subprocess.Popen([*CLOUDTRAIN, "dashboard", "--no-open"], env=sh.env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert board.stdout is not None
        url = board.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{32}", url), url
        base, token = url.split("/?token=")
        assert fetch(base + "/api/state")[0] == 403, "no token, nothing"

        def curve_points() -> int:
            status, body = fetch(f"{base}/api/metrics?job=dash-1&token={token}")
            return sum("loss" in line for line in json.loads(body)) if status == 200 else 0

        wait_for(lambda: curve_points() >= 2, timeout=120, what="two epochs copied home")
        dom = chromium("--dump-dom", url)
        points = [int(n) for n in re.findall(r'data-metric="loss"[^>]*>\s*<polyline[^>]*'
                                             r'data-points="(\d+)"', dom)]  # fmt: skip
        assert points, dom[-3000:]
        assert points[0] >= 2
        row = re.search(r'<tr data-cluster="dash">(.*?)</tr>', dom)
        assert row, dom[-3000:]
        cells = re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))
        assert cells[:5] == ["dash", "local", "up", "2", "$3.60"], cells  # the cluster's $/hour
        assert re.fullmatch(r"\$\d+\.\d\d", cells[5]), cells
        assert re.search(r'<tr class="job selected" data-job="dash-1">', dom)
        wait_for(lambda: curve_points() > points[0], timeout=60, what="the curve to grow")
        later = chromium("--dump-dom", url)
        grown = re.search(r'data-metric="loss"[^>]*>\s*<polyline[^>]*data-points="(\d+)"', later)
        assert grown, later[-3000:]
        assert int(grown.group(1)) > points[0]
        shot = tmp_path / "dashboard.png"
        chromium(f"--screenshot={shot}", "--window-size=1100,900", url)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        board.send_signal(signal.SIGINT)
        _, err = board.communicate(timeout=30)
    assert board.returncode == 0, err
    assert "Traceback" not in err
    assert "dashboard stopped" in err
    assert sh("cancel", "dash-1").returncode == 0
    assert sh("down", "dash").returncode == 0
