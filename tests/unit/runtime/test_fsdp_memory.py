"""FSDP on CPU holds less memory per rank than DDP: the point of sharding, measured in real
2-rank gloo groups training `examples/digits_fsdp.py`'s model (the same MLP, layers sharded the
same way), as the peak resident memory each rank reaches over what it held before the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cloudtrain import runtime
from cloudtrain.runtime import parallel, progress
from tests.unit.runtime.ranks import TORCHRUN_ENV, join, run_ranks


@pytest.fixture(autouse=True)
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*TORCHRUN_ENV, "CLOUDTRAIN_STRATEGY", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "_step", 0)


def _kib(field: str) -> int:
    """A ``VmRSS``/``VmHWM`` figure of this process, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def train_and_measure(rank: int, world: int, port: int, strategy: str, out: str) -> None:
    """20 Adam steps of the example's 64-2048-2048-10 MLP under `strategy`; writes how far
    this rank's peak resident memory rose over what it held before the model (KiB)."""
    join(rank, world, port)
    torch.manual_seed(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from now
    before = _kib("VmRSS")
    h = 2048
    mlp = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in mlp:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
    model = runtime.wrap(mlp, strategy)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(20):
        optimizer.zero_grad()
        torch.autograd.backward(nn.functional.cross_entropy(model(x), y))
        optimizer.step()
    runtime.barrier()
    Path(out, f"{strategy}-{rank}.json").write_text(json.dumps(_kib("VmHWM") - before))
    runtime.shutdown()


def test_fsdp_on_cpu_rises_less_per_rank_than_ddp(tmp_path: Path) -> None:
    for strategy in ("ddp", "fsdp"):
        run_ranks(train_and_measure, 2, strategy, str(tmp_path))
    rise = {
        s: max(json.loads((tmp_path / f"{s}-{r}.json").read_text()) for r in (0, 1))
        for s in ("ddp", "fsdp")
    }
    print(f"peak RSS over the start, KiB: {rise}")
    # The training state alone: 69.6 MB a replica under ddp, 34.8 MB a shard under fsdp.
    assert rise["fsdp"] < rise["ddp"], rise


def test_a_threshold_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    assert parallel._pin_mmap_threshold() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert parallel._pin_mmap_threshold() is False
