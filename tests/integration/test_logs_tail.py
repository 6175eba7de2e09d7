"""Issue 27, item 1: plain `cloudtrain logs JOB` prints the tail of a node's log, bounded
(`cloudtrain.jobs.logtail`: at most 5000 lines within the last MiB), says what was left out and
where the whole log is, and escapes the node's text, from the node (the real local provider)
and from the copy kept at home once the cluster is gone."""

from __future__ import annotations

import re

import pytest

from cloudtrain.jobs import logtail
from tests.integration.conftest import SCRIPTS, Shell, wait_for

pytestmark = pytest.mark.integration

LINES = 60_000  # about 6 MB of log: six times the bound


def check_tail(out: str) -> None:
    printed = re.findall(r"^\[node 0\] line (\d{6}) ", out, re.MULTILINE)
    assert printed, out[-2000:]
    assert int(printed[-1]) == LINES - 1  # the newest line is there …
    assert int(printed[0]) == LINES - logtail.LINES  # … and the 5000 before it, no more
    assert len(printed) == logtail.LINES
    assert len(out.encode()) < logtail.BYTES  # the whole log is 6 MB
    note = re.search(r"cloudtrain: (\d+) bytes of earlier output left out", out)
    assert note, out[:2000]
    assert int(note.group(1)) == (LINES - logtail.LINES) * 101  # each line is 101 bytes
    assert "last \\x1b]0;owned\\x07" in out  # node text, escaped at the one point
    assert "\x1b" not in out
    assert "\x07" not in out


def test_plain_logs_print_a_bounded_tail_and_say_what_was_left_out(sh: Shell) -> None:
    assert sh("up", "--name", "lt", "--nodes", "1").returncode == 0
    start = sh("train", "-c", "lt", "--detach", str(SCRIPTS / "chatty.py"), "--", str(LINES))
    assert start.returncode == 0, start.stderr
    found = re.search(r"job (lt-\d+) running", start.stderr)
    assert found, start.stderr
    jid = found.group(1)
    last = f"line {LINES - 1:06d} last"
    wait_for(lambda: last in sh("logs", jid).stdout, timeout=120, what="the job's last line")
    logs = sh("logs", jid)
    assert logs.returncode == 0, logs.stderr
    check_tail(logs.stdout)
    assert "the whole log is " in logs.stdout
    assert "node.log on the node" in logs.stdout

    assert sh("down", "lt").returncode == 0
    kept = sh("logs", jid)  # from the copy at home
    assert kept.returncode == 0, kept.stderr
    check_tail(kept.stdout)
