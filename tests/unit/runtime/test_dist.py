"""init, the rank helpers, average and wrap: in this process (a group of one) and for real in a
two-process gloo group."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from cloudtrain import runtime
from cloudtrain.runtime import dist as runtime_dist
from cloudtrain.runtime.checkpoint import STAMP
from tests.unit.runtime.ranks import TORCHRUN_ENV, join, run_ranks


@pytest.fixture
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A plain `python train.py` process; any group a test makes is destroyed after it."""
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    runtime.shutdown()


@pytest.mark.usefixtures("no_torchrun")
def test_without_torchrun_init_makes_a_group_of_one() -> None:
    runtime.init()
    runtime.init()  # idempotent
    assert dist.is_initialized()
    assert (runtime.rank(), runtime.local_rank(), runtime.world_size()) == (0, 0, 1)
    assert runtime.is_main()
    assert runtime.device() == torch.device("cpu")
    assert dist.get_backend() == "gloo"
    runtime.barrier()
    runtime.shutdown()
    runtime.shutdown()  # idempotent
    assert not dist.is_initialized()


@pytest.mark.usefixtures("no_torchrun")
def test_average_with_one_process_returns_the_value() -> None:
    runtime.init()
    value = runtime.average(2.5)
    assert isinstance(value, float)
    assert value == 2.5
    assert runtime.average(3) == 3.0
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    out = runtime.average(t)
    assert torch.equal(out, t)
    assert not out.requires_grad
    assert runtime.average(torch.tensor([1, 2])).dtype == torch.get_default_dtype()


@pytest.mark.usefixtures("no_torchrun")
def test_wrap_in_a_group_of_one() -> None:
    runtime.init()
    model = nn.Linear(3, 2)
    ddp = runtime.wrap(model)
    assert isinstance(ddp, nn.parallel.DistributedDataParallel)
    assert ddp.module is model
    from torch.distributed.fsdp import FSDPModule

    sharded = runtime.wrap(nn.Linear(3, 2), "fsdp")
    assert isinstance(sharded, FSDPModule)
    sharded(torch.ones(1, 3)).sum().backward()


@pytest.mark.usefixtures("no_torchrun")
def test_wrap_refuses_an_unknown_strategy() -> None:
    with pytest.raises(ValueError, match=r"unknown strategy 'zero3'; allowed: ddp, fsdp"):
        runtime.wrap(nn.Linear(3, 2), "zero3")


@pytest.mark.usefixtures("no_torchrun")
def test_helpers_read_torchruns_env_before_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (runtime.rank(), runtime.local_rank(), runtime.world_size()) == (3, 1, 4)
    assert not runtime.is_main()
    with pytest.raises(RuntimeError, match=r"call cloudtrain\.runtime\.init\(\) first"):
        runtime.average(1.0)
    with pytest.raises(RuntimeError, match=r"call cloudtrain\.runtime\.init\(\) first"):
        runtime.wrap(nn.Linear(3, 2))
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x' is not an integer"):
        runtime.rank()


def worker(rank: int, world: int, port: int, folder: str) -> None:
    """One rank of a real gloo group, set up the way torchrun sets up its workers."""
    join(rank, world, port)
    runtime.init()  # idempotent
    assert (runtime.rank(), runtime.world_size(), runtime.is_main()) == (rank, world, rank == 0)
    assert dist.get_backend() == "gloo"

    mean = runtime.average(float(rank))
    assert isinstance(mean, float)
    assert mean == 0.5, mean
    t = torch.tensor([rank, 2.0 * rank])
    assert torch.equal(runtime.average(t), torch.tensor([0.5, 1.0]))
    assert torch.equal(t, torch.tensor([rank, 2.0 * rank])), "the input must not change"

    sampler = runtime.BalancedSampler(11, seed=1)
    assert (sampler.rank, sampler.world_size, len(sampler)) == (rank, world, 6)

    path = Path(folder) / "last.pt"
    runtime.save_checkpoint(path, {"writer": rank})
    loaded = runtime.load_checkpoint(path)  # the barrier made the file complete for rank 1
    assert loaded == {"writer": 0}, loaded

    # Each node's copy, and they differ (a node that joined late holds an older one, another
    # none): every rank gets the newest, and the stamp stays inside cloudtrain.
    own = Path(folder) / f"rank{rank}" / "ckpt.pt"
    own.parent.mkdir()
    torch.save({"epoch": 5 if rank == 0 else 3, STAMP: 200.0 if rank == 0 else 100.0}, own)
    assert runtime.load_checkpoint(own) == {"epoch": 5}
    if rank == 1:
        torch.save({"epoch": 2, STAMP: 1.0}, own.with_name("only.pt"))
    assert runtime.load_checkpoint(own.with_name("only.pt")) == {"epoch": 2}
    assert runtime.load_checkpoint(own.with_name("none.pt")) is None

    # Rank r feeds a batch of (r + 1)s: the weight gradient is 2 (r + 1) per element on each
    # rank and the all-reduced mean is 3.
    x = torch.full((2, 4), float(rank + 1))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    ddp = runtime.wrap(model, "ddp")  # keep a reference: its reducer averages the gradients
    ddp(x).sum().backward()
    assert model.weight.grad is not None
    assert torch.allclose(model.weight.grad, torch.full((2, 4), 3.0)), model.weight.grad

    torch.manual_seed(0)
    sharded = runtime.wrap(nn.Linear(4, 2), "fsdp")
    sharded(x).sum().backward()
    weight = sharded.get_parameter("weight")
    assert isinstance(weight.grad, DTensor)  # each rank holds its shard of the mean gradient
    assert torch.allclose(weight.grad.full_tensor(), torch.full((2, 4), 3.0))
    runtime.shutdown()
    # The gloo barrier's work outlives the group (while `ddp` still holds it): its last
    # reference is dropped on this thread, never by gloo's with the GIL wanted (dist.shutdown).
    assert runtime_dist._last_barrier is not None
    assert not dist.is_initialized()
    del ddp, sharded  # the group's destructor runs now, and returns


def test_two_processes_in_a_real_gloo_group(tmp_path: Path) -> None:
    """The one multi-process unit test: init from torchrun's env, average, barrier, wrap."""
    run_ranks(worker, 2, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "rank0", "rank1"]


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "digits_ddp.py"
EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+) loss \d+\.\d{4} train_acc \d\.\d{4} test_acc \d\.\d{4}")


def run_example(argv: list[str], checkpoints: Path) -> list[str]:
    """Run the digits example; return its stdout lines after checking it exited 0 quietly."""
    env = {**os.environ, "CLOUDTRAIN_CHECKPOINT_DIR": str(checkpoints), "OMP_NUM_THREADS": "1"}
    for name in TORCHRUN_ENV:
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=checkpoints.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Ranks print nothing but their lines; torchrun's agent may log, Python warnings may not.
    assert not re.search(r"\w+Warning\b", proc.stderr), proc.stderr[-3000:]
    # every rank says once what share of the data it trains on; rank 0 alone prints the rest
    world = 2 if "--nproc-per-node" in argv else 1
    assert sorted(int(r) for r in RANK_LINE.findall(proc.stdout)) == list(range(world))
    return RANK_LINE.sub("", proc.stdout).splitlines()


RANK_LINE = re.compile(r"rank (\d+)/\d+ on node 0: \d+ of 1437 training samples per epoch\n")


def check_run(lines: list[str], *, first: int, last: int) -> float:
    """The lines of epochs first..last: first step, one line per epoch, the final accuracy."""
    assert lines[0] == "cloudtrain: first step", lines
    epochs = [EPOCH_LINE.fullmatch(line) for line in lines[1:-1]]
    assert all(epochs), lines
    assert [(int(m[1]), int(m[2])) for m in epochs if m] == [
        (e, last) for e in range(first, last + 1)
    ]
    finals = [line for line in lines if line.startswith("final test accuracy: ")]
    assert finals == [lines[-1]]
    assert re.fullmatch(r"final test accuracy: \d\.\d{4}", lines[-1])
    return float(lines[-1].rsplit(" ", 1)[1])


@pytest.mark.integration
def test_the_digits_example_trains_on_two_ranks_and_resumes(tmp_path: Path) -> None:
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    checkpoints = tmp_path / "checkpoints"
    lines = run_example([*torchrun, str(EXAMPLE), "--epochs", "5"], checkpoints)
    assert check_run(lines, first=1, last=5) >= 0.95
    assert [p.name for p in checkpoints.iterdir()] == ["digits.pt"]

    lines = run_example([*torchrun, str(EXAMPLE), "--epochs", "6"], checkpoints)
    assert lines[0] == "resumed from epoch 5"
    assert check_run(lines[1:], first=6, last=6) >= 0.95


@pytest.mark.integration
def test_the_digits_example_trains_without_torchrun(tmp_path: Path) -> None:
    lines = run_example([str(EXAMPLE), "--epochs", "5"], tmp_path / "checkpoints")
    assert check_run(lines, first=1, last=5) >= 0.95
