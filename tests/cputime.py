"""Where the suite's time goes, by test: its wall time and the CPU time it cost, the processes it
started included (torch ranks, agents, sshd, servers). A test that keeps the cores busy is worth
making smaller; one that mostly waits can run beside others::

    python -m pytest -p tests.cputime [-n 2] [PATHS]

Each process that runs tests moves itself into a cgroup of its own (cgroup v1's ``cpuacct``,
where this user may make one: root on this project's machines), so every process it starts,
detached or not, is counted to it, even while another worker runs beside it; a test's cost is
its cgroup's CPU time over the test. Without such a cgroup it reads the whole machine's CPU
(``/proc/stat``), which means something only with ``-n 0``: it refuses otherwise.

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
    """This process's way to read CPU seconds: its cgroup's, or the machine's."""

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
    worker = hasattr(config, "workerinput")
    workers = getattr(config.option, "numprocesses", None)
    if not worker:
        os.environ.setdefault(_ENV, tempfile.mkstemp(prefix="cputime-", suffix=".tsv")[1])
        Path(os.environ[_ENV]).write_text("")
    if workers and not worker:
        return  # the workers run the tests and measure them
    _clock = _Clock()
    if _clock.group is None and (worker or workers):
        raise pytest.UsageError("-p tests.cputime needs a cgroup of its own under xdist: -n 0")


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
    fd = os.open(os.environ[_ENV], os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())  # one write: the workers' lines never interleave
    finally:
        os.close(fd)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if hasattr(terminalreporter.config, "workerinput"):
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
