"""Where the suite's time goes, by test: its wall time and the CPU time it cost, the processes it
started included (torch ranks, agents, sshd, servers). A test that keeps the cores busy is worth
making smaller; one that mostly waits can run beside others. One test at a time::

    python -m pytest -n 0 -p tests.cputime [PATHS]

The run moves itself into a cgroup of its own (cgroup v1's ``cpuacct``, where this user may make
one: root on this project's machines), so every process it starts, detached or not, is counted
and nothing else on the machine is; without one it reads the whole machine's CPU
(``/proc/stat``). Under xdist it refuses: the workers' tests would share one count (a cgroup
per worker was tried once, in a run whose failures came from SIGINT ignored by a background
shell, since fixed in ``tests/conftest.py``; it is untried since).

The table (slowest first) ends the report, and every test's line is written, tab-separated
(node id, wall s, CPU s), to ``$CLOUDTRAIN_TEST_CPUTIME`` (a file of the run's own otherwise).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_TICKS = os.sysconf("SC_CLK_TCK")
_ENV = "CLOUDTRAIN_TEST_CPUTIME"


def _machine_seconds() -> float:
    """The whole machine's CPU time so far: every core's busy time (not idle, not iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICKS


def _own_cgroup() -> Path | None:
    """A cpuacct cgroup of this process's own, this process moved into it; None where this
    user may not make one."""
    group = _CPUACCT / f"cloudtrain-tests-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


class _Clock:
    """The run's way to read CPU seconds: its cgroup's, or the machine's."""

    def __init__(self) -> None:
        self.group = _own_cgroup()
        self.read: Callable[[], float] = (
            self._group_seconds if self.group is not None else _machine_seconds
        )

    def _group_seconds(self) -> float:
        assert self.group is not None
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def leave(self) -> None:
        """Back into the root cgroup; the own one goes when the last process in it has."""
        if self.group is None:
            return
        with contextlib.suppress(OSError):
            (_CPUACCT / "cgroup.procs").write_text(f"{os.getpid()}\n")
            self.group.rmdir()


_clock: _Clock | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _clock
    if getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        raise pytest.UsageError("-p tests.cputime measures one test at a time: add -n 0")
    os.environ.setdefault(_ENV, tempfile.mkstemp(prefix="cputime-", suffix=".tsv")[1])
    Path(os.environ[_ENV]).write_text("")
    _clock = _Clock()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _clock is not None:
        _clock.leave()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if _clock is None:
        yield
        return
    wall, cpu = time.monotonic(), _clock.read()
    yield
    line = f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t{_clock.read() - cpu:.2f}\n"
    with open(os.environ[_ENV], "a") as out:
        out.write(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _clock is None:
        return
    rows = []
    for line in Path(os.environ[_ENV]).read_text().splitlines():
        nodeid, wall_s, cpu_s = line.split("\t")
        rows.append((nodeid, float(wall_s), float(cpu_s)))
    if not rows:
        return
    rows.sort(key=lambda row: -row[1])
    wall, cpu = sum(r[1] for r in rows), sum(r[2] for r in rows)
    write = terminalreporter.write_line
    write(
        f"cputime: {len(rows)} tests, {wall:.0f} s of tests, {cpu:.0f} CPU s ({os.environ[_ENV]})"
    )
    for nodeid, took, used in rows[:40]:
        write(f"{took:8.1f} s {used:8.1f} CPU s  {nodeid}")
