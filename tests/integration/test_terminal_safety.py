"""The user's terminal stays the user's: what a node sends never drives it, Ctrl-C during
`train` is one line (no node's traceback), and the progress panel takes the terminal's width
and keeps pace with the log. The real CLI in subprocesses and pseudo-terminals, real jobs on
the local provider."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.integration.conftest import CLOUDTRAIN, REPO, SCRIPTS, TWO, Shell, wait_for

pytestmark = pytest.mark.integration
#: rich's own styles and cursor moves (the only escape sequences a terminal may get)
RICH = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TITLE = "\x1b]0;owned\x07"


def in_terminal(
    sh: Shell,
    args: Sequence[str],
    *,
    columns: int = 200,
    env: dict[str, str] | None = None,
    interrupt_after: bytes | None = None,
) -> tuple[int, str]:
    """Run `cloudtrain ARGS` on a pseudo-terminal `columns` wide (stdin, stdout and stderr, as
    in a shell); with `interrupt_after`, press Ctrl-C (SIGINT to its process group, as the
    terminal does) once that was shown. Its exit code and what it showed, rich's escapes
    removed."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {k: v for k, v in sh.env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [*CLOUDTRAIN, *args],
        env={**environ, "TERM": "xterm", **(env or {})},
        cwd=REPO,
        stdin=child,
        stdout=child,
        stderr=child,
        start_new_session=True,
    )
    os.close(child)
    shown = bytearray()
    pressed = False
    try:
        while True:
            ready, _, _ = select.select([parent], [], [], 1)
            if ready:
                try:
                    data = os.read(parent, 65536)
                except OSError:  # the other side closed
                    break
                if not data:
                    break
                shown += data
                if interrupt_after and not pressed and interrupt_after in shown:
                    os.killpg(proc.pid, signal.SIGINT)
                    pressed = True
            elif proc.poll() is not None:
                break
    finally:
        os.close(parent)
    code = proc.wait(timeout=120)
    return code, RICH.sub("", shown.decode(errors="replace")).replace("\r", "")


def job_ids(sh: Shell) -> set[str]:
    return {j["id"] for j in sh.status()["jobs"]}


def test_a_failure_tail_and_a_bootstrap_phase_reach_the_terminal_escaped(sh: Shell) -> None:
    assert sh("up", "--name", "esc").returncode == 0
    failed = sh("train", "-c", "esc", str(SCRIPTS / "hostile_failure.py"))
    assert failed.returncode == 1, failed.stderr
    assert "last lines of node 0" in failed.stderr  # the failure's tail …
    assert "boom \\x1b]52;c;b3duZWQ=\\x07 \\x1b]0;owned\\x07 \\x9b2J" in failed.stderr  # … as text
    shown = [failed]
    for args in (["logs", "esc-1"], ["events", "esc"], ["status"]):
        shown.append(sh(*args))
    # a node's status.json names a phase that would set the terminal's title
    status_file = sh.home / "local" / "esc" / "node-0" / "bootstrap" / "status.json"
    status = json.loads(status_file.read_text())
    status["phase"] = status["phases"][0]["name"] = TITLE
    status_file.write_text(json.dumps(status))
    again = sh("up", "--name", "esc")
    assert again.returncode == 0, again.stderr
    assert "node 0: \\x1b]0;owned\\x07: ready" in again.stderr
    assert "bootstrap phase \\x1b]0;owned\\x07 done" in again.stderr
    shown.append(again)
    for done in shown:
        text = done.stdout + done.stderr
        assert not {"\x1b", "\x9b", "\x07"} & set(text), done.args
    assert sh("down", "esc").returncode == 0


def test_ctrl_c_during_train_is_one_line_and_no_node_traceback(two_nodes: Shell) -> None:
    sh = two_nodes
    before = job_ids(sh)
    code, shown = in_terminal(
        sh, ["train", "-c", TWO, str(SCRIPTS / "sleeper.py")], interrupt_after=b"tick 3"
    )
    assert code == 130, shown
    assert "Traceback" not in shown, shown
    assert "KeyboardInterrupt" not in shown, shown
    last_log = max(m.end() for m in re.finditer(r"\[node \d\] tick \d+\n", shown))
    panel = ("│", "╭", "╰")  # the progress panel's last frame stays on the screen
    said = [
        ln for ln in shown[last_log:].splitlines() if ln.strip(" ^C") and not ln.startswith(panel)
    ]
    (job,) = job_ids(sh) - before
    assert said == [
        f"stopped following job {job}; it keeps running on its nodes: `cloudtrain logs {job} -f` "
        f"follows it again, `cloudtrain cancel {job}` stops it"
    ], shown
    assert sh.job(job)["status"] == "running"  # left running, as said
    assert sh("cancel", job).returncode == 0
    wait_for(lambda: not sh.strays(), what="the job's processes to end")


def test_ctrl_c_while_the_job_starts_is_one_line_and_leaves_nothing(
    two_nodes: Shell, tmp_path: Path
) -> None:
    sh = two_nodes
    task = tmp_path / "task.yaml"
    task.write_text(
        f"name: {TWO}\nnum_nodes: 2\nworkdir: {SCRIPTS}\nrun: sleeper.py\n"
        "setup: echo setting up; sleep 600\n"
    )
    before = job_ids(sh)
    code, shown = in_terminal(sh, ["train", str(task)], interrupt_after=b"setting up")
    assert code == 130, shown
    assert "Traceback" not in shown, shown
    last_log = max(m.end() for m in re.finditer(r"\[node \d\] setting up\n", shown))
    said = [ln for ln in shown[last_log:].splitlines() if ln.strip(" ^C")]
    (job,) = job_ids(sh) - before
    assert said == [f"stopped starting job {job}: what had started was stopped, nothing of it runs"]
    assert sh.job(job)["status"] == "cancelled"
    wait_for(lambda: not sh.strays(), what="the setup to be stopped")


def test_the_panel_takes_the_terminals_width_and_keeps_pace_with_the_log(sh: Shell) -> None:
    """A COLUMNS exported long ago (72) does not cut the panel on a 200-column terminal; each
    report printed with a line comes home (where the panel reads it) while the job runs."""
    assert sh("up", "--name", "wide").returncode == 0
    code, shown = in_terminal(
        sh, ["train", "-c", "wide", str(SCRIPTS / "reports_as_it_prints.py")], env={"COLUMNS": "72"}
    )
    assert code == 0, shown
    rows = re.findall(r"│ (.*?) +│\n", shown)
    assert any(
        re.fullmatch(
            r"loss 1  train_accuracy_running_mean 0\.5  validation_accuracy"
            r"_running_mean 0\.25  samples_per_second_all_ranks 1234",
            row,
        )
        for row in rows
    ), shown
    took = [float(s) for s in re.findall(r"step \d home after ([\d.]+) s", shown)]
    assert len(took) == 3, shown  # each report came home while the job ran (how fast: not
    # asserted here, tests never fail on timing; measured ~0.1-1 s, 4.5 s before METRICS_S)
    assert sh("down", "wide").returncode == 0


def test_the_users_horovod_timeout_wins_and_wiring_is_refused_in_one_line(
    two_nodes: Shell,
) -> None:
    pytest.importorskip("horovod")
    sh = two_nodes
    script = SCRIPTS / "show_env.py"
    done = sh(
        "train",
        "-c",
        TWO,
        "--runtime",
        "horovod",
        "--env",
        "HOROVOD_GLOO_TIMEOUT_SECONDS=7",
        str(script),
    )
    assert done.returncode == 0, done.stderr
    assert "[node 0] HOROVOD_GLOO_TIMEOUT_SECONDS=7" in done.stdout, done.stdout
    jobs = [j["id"] for j in sh.status()["jobs"]]
    for env, line in [
        (
            "HOROVOD_GLOO_TIMEOUT_SECONDS=soon",
            "error: envs: HOROVOD_GLOO_TIMEOUT_SECONDS='soon': "
            "write whole seconds from 1 to 86400 (default 120)",
        ),
        (
            "HOROVOD_RANK=3",
            "error: envs: HOROVOD_RANK='3': cloudtrain sets HOROVOD_RANK for "
            "each horovod worker (it wires the job together); leave it out",
        ),
    ]:
        refused = sh("train", "-c", TWO, "--runtime", "horovod", "--env", env, str(script))
        assert (refused.returncode, refused.stderr) == (2, line + "\n")
    assert [j["id"] for j in sh.status()["jobs"]] == jobs  # the refused ones cost nothing
