"""The rank harness itself: a rank that never finishes fails its test with the stacks of every
rank still running, and leaves no process behind (multiprocessing would otherwise join it at
pytest's exit, forever)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from tests.unit.runtime.ranks import run_ranks


def rank_one_hangs(rank: int, world: int, port: int) -> None:
    if rank == 1:
        time.sleep(3600)


def test_a_rank_that_hangs_fails_with_its_stack_and_is_killed() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_ranks(rank_one_hangs, 2, timeout_s=3)
    message = str(failed.value)
    assert message.startswith("rank_one_hangs on 2 ranks did not finish in 3 s")
    assert "-- rank 1 --" in message
    assert "-- rank 0 --" not in message  # it had finished
    assert "in rank_one_hangs" in message, message
    assert not multiprocessing.active_children()
