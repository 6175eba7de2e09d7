"""Where the suite's time goes, by test: its wall time and how many of the machine's cores were
busy meanwhile (the whole machine's CPU time from ``/proc/stat``, so that the processes a test
starts count: torch ranks, agents, sshd). A test that keeps the cores busy is worth making
smaller; one that leaves them idle can run beside others. Run one test at a time::

    python -m pytest -n 0 -p tests.cputime tests/integration

and the table (slowest first, with each test's busy cores) ends the report; with
``CLOUDTRAIN_TEST_CPUTIME=FILE`` it is also written there as tab-separated lines. Under xdist
the cores are shared by the workers' tests, so the figures mean nothing: it says so and stops.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: per test: (nodeid, wall seconds, busy core-seconds)
_SEEN: list[tuple[str, float, float]] = []
_TICKS = os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float:
    """The machine's CPU time so far, every core's busy time added (not idle, not iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    wall, busy = time.monotonic(), _busy_seconds()
    yield
    _SEEN.append((item.nodeid, time.monotonic() - wall, _busy_seconds() - busy))


def pytest_configure(config: pytest.Config) -> None:
    workers = getattr(config.option, "numprocesses", None)
    if workers and not hasattr(config, "workerinput"):
        raise pytest.UsageError("-p tests.cputime measures one test at a time: add -n 0")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SEEN:
        return
    rows = sorted(_SEEN, key=lambda row: -row[1])
    wall = sum(row[1] for row in rows)
    busy = sum(row[2] for row in rows)
    write = terminalreporter.write_line
    write(f"cputime: {len(rows)} tests, {wall:.0f} s, {busy:.0f} core-s ({busy / wall:.2f} cores)")
    for nodeid, took, used in rows[:40]:
        write(f"{took:8.1f} s {used / took if took else 0:5.2f} cores  {nodeid}")
    target = os.environ.get("CLOUDTRAIN_TEST_CPUTIME")
    if target:
        lines = [f"{nodeid}\t{took:.2f}\t{used:.2f}\n" for nodeid, took, used in rows]
        Path(target).write_text("".join(lines))
