"""When a job ended, as its node saw it: the detach wrapper writes the node's time next to the
exit code (run for real by /bin/sh), the node agent reads it, the coordinator puts it on this
machine's clock, and the record keeps it between the job's start and now. The whole path over a
real detached job: tests/integration/test_job_end.py."""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import pytest

from cloudtrain.executors.base import DETACH_SCRIPT
from cloudtrain.jobs.attempts import last_end, on_our_clock
from cloudtrain.node import job_status
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State


def test_the_wrapper_writes_the_nodes_end_time_before_the_exit_code(tmp_path: Path) -> None:
    before = time.time()
    subprocess.run(["/bin/sh", "-c", DETACH_SCRIPT, "detach", str(tmp_path), "sleep", "0.3"],
                   check=True, capture_output=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "exit_code").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    seen = time.time()
    written = float((tmp_path / "ended_at").read_text())
    assert before + 0.3 <= written <= seen
    status = job_status(tmp_path)
    assert status["exit_code"] == 0
    assert status["ended"] == written
    assert isinstance(status["now"], float)
    assert status["now"] >= seen


def test_an_end_time_the_node_could_not_write_is_the_exit_codes(tmp_path: Path) -> None:
    (tmp_path / "exit_code").write_text("0\n")
    (tmp_path / "ended_at").write_text("1700000000.N\n")  # a `date` without %N
    assert job_status(tmp_path)["ended"] == (tmp_path / "exit_code").stat().st_mtime
    (tmp_path / "ended_at").unlink()
    assert job_status(tmp_path)["ended"] == (tmp_path / "exit_code").stat().st_mtime
    (tmp_path / "exit_code").unlink()
    assert job_status(tmp_path)["ended"] is None, "still running: no end"


def test_a_nodes_clock_is_put_on_ours_and_what_it_says_is_checked() -> None:
    sent, received = 1000.0, 1000.5
    same = on_our_clock({"ended": 990.0, "now": 1000.2}, sent, received)
    assert same["ended"] == 990.0, "within the round trip: the clocks agree"
    ahead = on_our_clock({"ended": 4590.0, "now": 4600.0}, sent, received)
    assert ahead["ended"] == 990.5  # an hour ahead: 3599.5 s at least
    behind = on_our_clock({"ended": 890.0, "now": 900.0}, sent, received)
    assert behind["ended"] == 990.0
    assert on_our_clock({"ended": 990.0}, sent, received)["ended"] == 990.0  # no clock given
    for hostile in ("990", math.nan, math.inf, True, None, [1.0]):
        assert on_our_clock({"ended": hostile, "now": 1000.2}, sent, received)["ended"] is None
    assert on_our_clock({"ended": 990.0, "now": "x"}, sent, received)["ended"] == 990.0
    assert last_end([{"ended": 3.0}, {"ended": 5.0}]) == 5.0, "when the last node ended"
    assert last_end([{"ended": 3.0}, {"ended": None}]) is None, "a node that cannot say"
    assert last_end([]) is None


@pytest.mark.parametrize(
    ("said", "recorded"),
    [(130.0, 130.0), (50.0, 100.0), (900.0, 200.0), (math.nan, 200.0), (None, 200.0)],
)
def test_the_end_is_kept_between_the_start_and_now(
    tmp_path: Path, said: float | None, recorded: float
) -> None:
    clock = [90.0]
    with State.open(tmp_path, clock=lambda: clock[0]) as state:
        state.put_cluster(ClusterSpec("c", "local", 1, Resources()), status=ClusterStatus.UP)
        job = state.new_job("c", "j", num_nodes=1, nproc_per_node=1, command=["x.py"])
        state.update_job(job.id, status="running", started_at=100.0)
        clock[0] = 200.0
        assert state.finish_job(job.id, "succeeded", exit_code=0, ended_at=said)
        ended = state.job(job.id)
        assert ended is not None
        assert ended.ended_at == recorded
        assert not state.finish_job(job.id, "failed", ended_at=150.0), "once"
