"""Real gloo groups for the runtime's unit tests: `run_ranks` starts the ranks, `join` makes a
process one of them the way torchrun sets up its workers.

A rank that hangs (a rendezvous that never completes, a collective one rank never reaches) must
fail its test, never the whole run: pytest's own timeout interrupts only pytest's thread, and
multiprocessing then joins the hung children at exit — forever. So `run_ranks` has a deadline
of its own; past it, every rank that is still running writes the stacks of all its threads
(faulthandler, on SIGUSR1) into the failure, and is killed.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from cloudtrain import runtime

#: What torchrun sets for each worker, and what a test's own process must not carry.
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank_main(index: int, fn: Callable[..., None], stacks: str, *args: Any) -> None:
    """A rank's entry: its stacks go to its own file on SIGUSR1, then `fn(index, *args)`."""
    with open(Path(stacks) / f"rank{index}.txt", "w") as out:
        faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
        fn(index, *args)


def run_ranks(fn: Callable[..., None], world: int, *args: Any, timeout_s: float = 120) -> None:
    """``fn(rank, world, port, *args)`` in `world` processes; raises what a rank raised, and
    fails the test with every rank's stacks when they are not done in `timeout_s`.

    The processes are forked from multiprocessing's fork server, a clean process that imported
    torch and this module once: a rank starts in well under a second instead of importing torch
    anew (seconds each), and nothing of pytest's process (its threads, its locks) comes along.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "cloudtrain.runtime", __name__])  # once, at its start
    with tempfile.TemporaryDirectory(prefix="ranks-") as stacks:
        ranks = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            _rank_main,
            args=(fn, stacks, world, free_port(), *args),
            nprocs=world,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout_s
        while not ranks.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                pytest.fail(_hung(fn, world, timeout_s, ranks.processes, Path(stacks)))


def _hung(
    fn: Callable[..., None],
    world: int,
    timeout_s: float,
    processes: list[multiprocessing.Process],
    stacks: Path,
) -> str:
    """Every running rank's stacks, then the ranks killed: the message of the failure."""
    running = [(i, p) for i, p in enumerate(processes) if p.is_alive() and p.pid]
    for _, process in running:
        os.kill(process.pid, signal.SIGUSR1)  # type: ignore[arg-type]
    time.sleep(1.0)  # faulthandler writes from a signal handler, at once
    for _, process in running:
        process.kill()
        process.join(5)
    dumps = "\n".join(
        f"-- rank {i} --\n{(stacks / f'rank{i}.txt').read_text(errors='replace')}"
        for i, _ in running
    )
    return f"{fn.__name__} on {world} ranks did not finish in {timeout_s:g} s\n{dumps}"


def join(
    rank: int, world: int, port: int, *, one_per_node: bool = False, init: bool = True
) -> None:
    """Become one rank of a real gloo group, set up the way torchrun sets up its workers: every
    rank on one node, or (`one_per_node`) each rank the only one of a node of its own. Without
    `init`, only the env: the test joins the group its own way."""
    warnings.simplefilter("error")
    torch.set_num_threads(1)  # ranks share a few cores
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK="0" if one_per_node else str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE="1" if one_per_node else str(world),
        GROUP_RANK=str(rank) if one_per_node else "0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if init:
        runtime.init(timeout_s=60)
