"""`cloudtrain dashboard` in a real headless Chromium: the page of a running local job's loss
curve, growing while the job runs, and its cluster's cost so far; what another local user
without the token gets; the browser it opens gets a one-time link, never the token; Ctrl-C
stops it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
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


def fetch(url: str, cookie: str = "") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def login(link: str) -> str:
    """Spend a one-time link as a browser would: the session cookie it sets (``name=value``)."""
    parts = urllib.parse.urlsplit(link)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request("GET", f"{parts.path}?{parts.query}")
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    assert resp.status == 303, resp.status
    assert resp.getheader("Location") == "/"
    return str(resp.getheader("Set-Cookie")).split(";")[0]


LINK = r"http://127\.0\.0\.1:\d+/login\?once=[\w-]{32}"


def test_the_page_shows_a_running_jobs_curve_and_its_clusters_cost(
    sh: Shell, tmp_path: Path
) -> None:
    require(shutil.which("chromium") is not None, "no chromium: apt-get install chromium")
    assert sh("up", "--name", "dash", "--nodes", "2", "--node-price", "1.80").returncode == 0
    start = sh("train", "-c", "dash", "-d", str(EXAMPLE), "--", "--epochs", "60", "--pause", "1")
    assert start.returncode == 0, start.stderr
    board = subprocess.Popen([*CLOUDTRAIN, "dashboard", "--no-open"], env=sh.env, cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert board.stdin is not None
        assert board.stdout is not None
        stdin, stdout = board.stdin, board.stdout

        def link() -> str:  # Enter: a new one-time link
            stdin.write("\n")
            stdin.flush()
            return stdout.readline().strip()

        url = stdout.readline().strip()
        assert re.fullmatch(LINK, url), url
        base = url.split("/login")[0]
        assert fetch(base + "/api/state")[0] == 403, "no token, nothing"
        cookie = login(url)

        def curve_points() -> int:
            status, body = fetch(f"{base}/api/metrics?job=dash-1", cookie)
            return sum("loss" in line for line in json.loads(body)) if status == 200 else 0

        wait_for(lambda: curve_points() >= 2, timeout=120, what="two epochs copied home")
        dom = chromium("--dump-dom", link())
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
        later = chromium("--dump-dom", link())
        grown = re.search(r'data-metric="loss"[^>]*>\s*<polyline[^>]*data-points="(\d+)"', later)
        assert grown, later[-3000:]
        assert int(grown.group(1)) > points[0]
        shot = tmp_path / "dashboard.png"
        chromium(f"--screenshot={shot}", "--window-size=1100,900", link())
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        board.send_signal(signal.SIGINT)
        _, err = board.communicate(timeout=30)
    assert board.returncode == 0, err
    assert "Traceback" not in err
    assert "dashboard stopped" in err
    assert sh("cancel", "dash-1").returncode == 0
    assert sh("down", "dash").returncode == 0


BROWSER = """\
#!/bin/sh
# what every local user reads through `ps`: this process's command line
tr '\\0' ' ' < /proc/$$/cmdline > "{out}/argv.tmp" && mv "{out}/argv.tmp" "{out}/argv"
chromium --headless --disable-gpu {sandbox} --virtual-time-budget=8000 --dump-dom "$1" \\
    > "{out}/dom.tmp" 2> "{out}/stderr"
mv "{out}/dom.tmp" "{out}/dom"
"""


def test_the_browser_it_opens_gets_a_link_that_works_once_and_never_the_token(
    sh: Shell, tmp_path: Path
) -> None:
    require(shutil.which("chromium") is not None, "no chromium: apt-get install chromium")
    sandbox = "--no-sandbox" if os.geteuid() == 0 else ""
    browser = tmp_path / "browser.sh"  # `webbrowser` runs $BROWSER; '&': in the background
    browser.write_text(BROWSER.format(out=tmp_path, sandbox=sandbox))
    browser.chmod(0o700)
    board = subprocess.Popen([*CLOUDTRAIN, "dashboard"], cwd=REPO,
                             env={**sh.env, "BROWSER": f"{browser} %s &"},
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert board.stdout is not None
        printed = board.stdout.readline().strip()
        assert re.fullmatch(LINK, printed), printed
        token = login(printed).split("=", 1)[1]  # the session's: what must stay secret
        wait_for((tmp_path / "argv").exists, timeout=60, what="the browser to start")
        argv = (tmp_path / "argv").read_text()
        opened = re.search(LINK, argv)
        assert opened, argv
        assert opened.group(0) != printed, "a link of its own"
        assert token not in argv
        everyone = []  # every command line on the machine now (chromium's own children too)
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                everyone.append(cmdline.read_bytes())
        assert not [c for c in everyone if token.encode() in c]
        wait_for((tmp_path / "dom").exists, timeout=120, what="the browser to load the page")
        dom = (tmp_path / "dom").read_text()
        assert 'data-ready="1"' in dom, dom[-2000:]  # its requests carried the cookie it got
        assert fetch(opened.group(0))[0] == 403, "spent at its first use"
    finally:
        board.send_signal(signal.SIGINT)
        _, err = board.communicate(timeout=30)
    assert board.returncode == 0, err
    assert "Traceback" not in err
    wait_for(lambda: not sh.strays(), timeout=30, what="the browser to exit")
