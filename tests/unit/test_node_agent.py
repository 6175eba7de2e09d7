"""The node agent (`python -m cloudtrain.node`) for real, on this machine's processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cloudtrain import node


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain.node", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_port_is_free() -> None:
    port = int(agent("port").stdout)
    assert 0 < port < 65536


def test_follow_once_and_tail(tmp_path: Path) -> None:
    (tmp_path / "node.log").write_text("".join(f"line {i}\n" for i in range(100)))
    assert agent("follow", "--once", str(tmp_path)).stdout.count("\n") == 100
    assert agent("follow", "--once", "--tail", "2", str(tmp_path)).stdout == "line 98\nline 99\n"


def test_follow_streams_until_the_exit_code_appears(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_text("first\n")
    (tmp_path / "pid").write_text(f"{os.getpid()}\n")  # alive while we write
    follower = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain.node", "follow", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.3)
    with open(log, "a") as f:
        f.write("second\n")
    time.sleep(0.3)
    (tmp_path / "exit_code").write_text("0\n")
    out, _ = follower.communicate(timeout=10)
    assert out == "first\nsecond\n"
    assert follower.returncode == 0
    status = json.loads(agent("status", str(tmp_path)).stdout)
    assert status["exit_code"] == 0
    assert status["log_bytes"] == len("first\nsecond\n")


def test_kill_finds_processes_by_their_environment_in_any_session(tmp_path: Path) -> None:
    env = {**os.environ, "CLOUDTRAIN_JOB_ID": "t-1", "CLOUDTRAIN_NODE_ROOT": str(tmp_path)}
    # one process that ignores TERM, in a session of its own, like a torchrun worker
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
        env=env, start_new_session=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    polite = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], env={**env, "CLOUDTRAIN_JOB_ID": "t-2"})
    assert stubborn.stdout is not None
    stubborn.stdout.readline()
    match = {"CLOUDTRAIN_JOB_ID": "t-1", "CLOUDTRAIN_NODE_ROOT": str(tmp_path)}
    try:
        assert sorted(node.find_processes(match)) == sorted([stubborn.pid, polite.pid])
        counts = json.loads(
            agent("kill", "--match", "CLOUDTRAIN_JOB_ID=t-1", "--match",
                  f"CLOUDTRAIN_NODE_ROOT={tmp_path}", "--grace", "0.5").stdout
        )  # fmt: skip
        assert counts == {"terminated": 2, "killed": 1}
        assert stubborn.wait(5) == -9
        assert polite.wait(5) == -15
        assert other.poll() is None, "another job's process is left alone"
        assert node.find_processes(match) == []
    finally:
        for proc in (stubborn, polite, other):
            proc.kill()
            proc.wait()
        stubborn.stdout.close()
