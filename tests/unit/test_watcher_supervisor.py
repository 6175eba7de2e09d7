"""The supervisor of a managed job's watcher, with real child processes: a watcher that dies
while its job is open is started again after a wait; one that exits 0, or dies once the job
has ended, is not; a watcher that dies at every start is given up on; one supervisor a job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cloudtrain.jobs import supervisor
from cloudtrain.node import restarts


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restarts, "RESTART_S", 0.01)
    monkeypatch.setattr(restarts, "MAX_RESTART_S", 0.04)


def counting_child(tmp_path: Path, exits: list[int]) -> list[str]:
    """A child that appends a line to `runs` and exits with the next code of `exits` (the
    last one again once they are used up)."""
    runs = tmp_path / "runs"
    program = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); "
        "n = len(p.read_text().splitlines()) if p.exists() else 0; "
        "p.open('a').write('run\\n'); "
        f"codes = {exits!r}; sys.exit(codes[min(n, len(codes) - 1)])"
    )
    return [sys.executable, "-c", program, str(runs)]


def runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text().splitlines())


def test_a_watcher_that_dies_is_started_again_until_it_ends_well(tmp_path: Path) -> None:
    said: list[str] = []
    child = counting_child(tmp_path, [5, 3, 0])  # a crash, an error, then the job's end
    code = supervisor.supervise(tmp_path, "c1-1", child, lambda: True, said.append)
    assert code == 0
    assert runs(tmp_path) == 3
    assert said[0].startswith("the watcher of c1-1 exited 5 after 0 s; starting it again in 0 s")
    assert said[1].startswith("the watcher of c1-1 exited 3 after 0 s")
    assert len(said) == 2


def test_a_signal_s_death_is_named(tmp_path: Path) -> None:
    said: list[str] = []
    child = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    open_calls: list[int] = []

    def is_open() -> bool:
        open_calls.append(1)
        return len(open_calls) < 2  # open at the first death, ended by the second

    assert supervisor.supervise(tmp_path, "c1-1", child, is_open, said.append) == 0
    assert said == [
        "the watcher of c1-1 was killed by signal 9 after 0 s; starting it again in 0 s"
    ]


def test_a_job_that_ended_is_not_watched_again(tmp_path: Path) -> None:
    said: list[str] = []
    child = counting_child(tmp_path, [5])
    assert supervisor.supervise(tmp_path, "c1-1", child, lambda: False, said.append) == 0
    assert runs(tmp_path) == 1
    assert said == []


def test_a_watcher_that_crashes_at_every_start_is_given_up_on(tmp_path: Path) -> None:
    said: list[str] = []
    child = counting_child(tmp_path, [5])
    assert supervisor.supervise(tmp_path, "c1-1", child, lambda: True, said.append) == 1
    assert runs(tmp_path) == supervisor.GIVE_UP
    assert said[-1] == (
        f"the watcher of c1-1 exited 5: {supervisor.GIVE_UP} deaths in a row, each within 60 s "
        "of its start; not starting it again (the next `cloudtrain status` does)"
    )


def test_one_supervisor_per_job(tmp_path: Path) -> None:
    """A second supervisor of a job (a command that ran while the first waited to restart its
    watcher) leaves it to the first and starts nothing."""
    inner: list[int] = []

    def is_open() -> bool:
        inner.append(supervisor.supervise(tmp_path, "c1-1", counting_child(tmp_path, [0]),
                                          lambda: True, print))  # fmt: skip
        assert supervisor.supervisor_pid(tmp_path, "c1-1") is not None
        return False

    child = [sys.executable, "-c", "raise SystemExit(5)"]
    assert supervisor.supervise(tmp_path, "c1-1", child, is_open, print) == 0
    assert inner == [0]
    assert not (tmp_path / "runs").exists(), "the second one started no watcher"
    assert supervisor.supervisor_pid(tmp_path, "c1-1") is None
