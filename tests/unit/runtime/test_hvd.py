"""`cloudtrain.runtime.hvd`, Horovod's API on torch.distributed: in a group of one, and for real
in a two-process gloo group set up the way torchrun sets up its workers — where a Horovod-style
training loop gives the same weights as DDP on the same data."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import cloudtrain.runtime.hvd as hvd
from cloudtrain import runtime
from tests.unit.runtime.ranks import TORCHRUN_ENV, join, run_ranks


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*TORCHRUN_ENV, "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    yield
    hvd.shutdown()


@pytest.mark.usefixtures("alone")
def test_a_group_of_one_answers_without_communication() -> None:
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(hvd.allreduce(t), t)
    assert torch.equal(hvd.allgather(t), t)
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}
    with pytest.raises(ValueError, match=r"op 'median': use hvd\.Average, hvd\.Sum"):
        hvd.allreduce(t, op="median")
    with pytest.raises(ValueError, match=r"op hvd\.Adasum: .* does not implement Adasum"):
        hvd.allreduce(t, op=hvd.Adasum)
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="backward_passes_per_step 0"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 backward_passes_per_step=0)  # fmt: skip
    with pytest.raises(ValueError, match="named_parameters not in the optimizer"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=nn.Linear(2, 1).named_parameters())  # fmt: skip


def _train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, passes: int = 1) -> None:
    """Three steps on rank-dependent data, `passes` backward passes per step."""
    for step in range(3):
        for micro in range(passes):
            x = torch.full((4, 3), float(rank + 1 + step + micro))
            y = torch.full((4, 1), float(rank - step))
            nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()


def worker(rank: int, world: int, port: int) -> None:
    join(rank, world, port, init=False)
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_size(), hvd.cross_size()) == (rank, 2, 2, 1)

    t = torch.tensor([float(rank), 10.0])
    assert torch.equal(hvd.allreduce(t), torch.tensor([0.5, 10.0]))
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), torch.tensor([1.0, 20.0]))
    assert torch.equal(hvd.allreduce(t, average=False), torch.tensor([1.0, 20.0]))
    assert torch.equal(t, torch.tensor([float(rank), 10.0])), "the input must not change"
    ragged = torch.arange(rank + 1) + 10 * rank  # rank 0: [0]; rank 1: [10, 11]
    assert torch.equal(hvd.allgather(ragged), torch.tensor([0, 10, 11]))
    assert torch.equal(hvd.broadcast(t, root_rank=1), torch.tensor([1.0, 10.0]))
    assert hvd.broadcast_object({"from": rank}, root_rank=1) == {"from": 1}

    # Horovod's way: each rank starts from its own weights; rank 0's are broadcast, then
    # the averaged gradients keep every rank equal to DDP on the same data.
    torch.manual_seed(100 + rank)
    model = nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    _train(model, opt, rank)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.state_dict()["state"][0]["step"] == 3

    torch.manual_seed(100)  # rank 0's weights, as the broadcast gave everyone
    reference = nn.Linear(3, 1)
    ddp = runtime.wrap(reference, "ddp")
    _train(ddp, torch.optim.Adam(ddp.parameters(), lr=0.1), rank)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6), (mine, theirs)
    gathered = hvd.allgather(model.weight.detach())
    assert torch.equal(gathered[0], gathered[1]), "every rank holds the same weights"

    # two backward passes per step: the gradients add up locally, then are averaged
    torch.manual_seed(7)
    acc = nn.Linear(3, 1)
    sgd = hvd.DistributedOptimizer(torch.optim.SGD(acc.parameters(), lr=0.01),
                                   backward_passes_per_step=2)  # fmt: skip
    _train(acc, sgd, rank, passes=2)
    torch.manual_seed(7)
    plain = nn.Linear(3, 1)
    ddp2 = runtime.wrap(plain, "ddp")
    _train(ddp2, torch.optim.SGD(ddp2.parameters(), lr=0.01), rank, passes=2)
    assert torch.allclose(acc.weight, plain.weight, atol=1e-6)
    hvd.shutdown()


def test_a_horovod_style_loop_matches_ddp_in_a_real_gloo_group() -> None:
    run_ranks(worker, 2)
