"""`train`'s progress panel on a real terminal: the CLI runs in a pseudo-terminal and its frames
are read back as the terminal shows them; in a pipe, the same words come as plain lines."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess

import pytest

from tests.integration.conftest import CLOUDTRAIN, REPO, Shell

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def in_terminal(sh: Shell, *args: str) -> str:
    """Run `cloudtrain ARGS` with a pseudo-terminal as its stdout; what it showed there."""
    parent, child = pty.openpty()
    env = {**sh.env, "COLUMNS": "100", "LINES": "40", "TERM": "xterm"}
    proc = subprocess.Popen([*CLOUDTRAIN, *args], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=child, stderr=subprocess.PIPE)  # fmt: skip
    os.close(child)
    shown = bytearray()
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
        elif proc.poll() is not None:
            break
    os.close(parent)
    assert proc.stderr is not None
    with proc.stderr:
        errors = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, errors
    return ANSI.sub("", shown.decode(errors="replace")).replace("\r", "")


def test_the_panel_shows_step_metrics_and_nodes_under_the_logs(sh: Shell) -> None:
    assert sh("up", "--name", "live").returncode == 0
    shown = in_terminal(sh, "train", "-c", "live", str(EXAMPLE), "--", "--epochs", "3",
                        "--pause", "2")  # fmt: skip
    frames = re.findall(r"│ (job live-1 · step [^│]*?) +│\n│ ([^│]*?) +│\n│ ([^│]*?) +│", shown)
    assert frames, shown
    last = frames[-1]
    assert re.fullmatch(r"job live-1 · step 135/135 \(100%\) · [\d.]+ steps/s", last[0]), last
    loss = re.findall(r"epoch 3/3 loss (\d\.\d+)", shown)
    assert loss, shown
    assert re.fullmatch(rf"epoch 3  loss {float(loss[0]):.4g}  train_acc [\d.]+  test_acc "
                        r"[\d.]+  samples_s \d+", last[1]), last  # fmt: skip
    assert last[2] == "node 0 exited"
    assert "[node 0] final test accuracy" in shown  # the logs go on above it
    plain = in_terminal(sh, "train", "-c", "live", "--no-live", str(EXAMPLE), "--",
                        "--epochs", "4")  # fmt: skip
    assert "│ job live-2" not in plain
    # long enough for one plain line (every `PLAIN_EVERY_S`, 10 s), with half again of margin
    piped = sh("train", "-c", "live", str(EXAMPLE), "--", "--epochs", "3", "--pause", "5")
    assert piped.returncode == 0
    assert re.search(r"^cloudtrain: job live-3 · step \d+/\d+ .* \| epoch \d  loss ", piped.stderr,
                     re.MULTILINE), piped.stderr  # fmt: skip
    assert sh("down", "live").returncode == 0
