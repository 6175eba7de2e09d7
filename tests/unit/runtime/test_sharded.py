"""strategy(), and save_sharded / load_sharded: DCP checkpoints of FSDP2 models saved by real
gloo groups, loaded on other world sizes, atomic, and written per node without a shared folder."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.tensor import DTensor

from cloudtrain import runtime
from cloudtrain.errors import CheckpointError
from cloudtrain.runtime import progress
from cloudtrain.runtime import sharded as sharded_mod
from tests.unit.runtime.ranks import TORCHRUN_ENV, join, run_ranks


@pytest.fixture(autouse=True)
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A plain process: any group a test makes is destroyed after it, and the step count it
    resumes goes back to what it was."""
    for name in (*TORCHRUN_ENV, "CLOUDTRAIN_STRATEGY", "CLOUDTRAIN_RUN_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "_step", 0)
    monkeypatch.setattr(progress, "_resumed_from", None)
    yield
    runtime.shutdown()


# -- the job's strategy -----------------------------------------------------------------------


def test_the_strategy_comes_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runtime.strategy() == "ddp"
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", "")
    assert runtime.strategy() == "ddp"
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", "fsdp")
    assert runtime.strategy() == "fsdp"
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", "FSDP")
    with pytest.raises(
        ValueError, match=r"CLOUDTRAIN_STRATEGY='FSDP' is not a strategy; allowed: ddp, fsdp"
    ):
        runtime.strategy()


def test_wrap_uses_the_jobs_strategy_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.fsdp import FSDPModule

    runtime.init()
    assert isinstance(runtime.wrap(nn.Linear(3, 2)), nn.parallel.DistributedDataParallel)
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", "fsdp")
    assert isinstance(runtime.wrap(nn.Linear(3, 2)), FSDPModule)
    assert isinstance(runtime.wrap(nn.Linear(3, 2), "ddp"), nn.parallel.DistributedDataParallel)
    monkeypatch.setenv("CLOUDTRAIN_STRATEGY", "zero3")
    with pytest.raises(ValueError, match="CLOUDTRAIN_STRATEGY='zero3'"):
        runtime.wrap(nn.Linear(3, 2))


# -- helpers the ranks share ------------------------------------------------------------------


def tiny(seed: int) -> nn.Module:
    """5 output rows: shards of uneven size over 2 and 3 ranks."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    """`steps` Adam steps on this rank's own batch (so the ranks' gradients differ)."""
    gen = torch.Generator().manual_seed(100 + runtime.rank())
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        runtime.step()


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole model and optimizer state, gathered on every rank (collective)."""
    options = StateDictOptions(full_state_dict=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return {"model": model_state, "optimizer": optim_state}


def assert_same(got: Any, want: Any, where: str = "state") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert torch.equal(got, want), f"{where}: {got} != {want}"
    elif isinstance(want, dict):
        assert isinstance(got, dict), where
        assert got.keys() == want.keys(), f"{where}: {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def fresh_fsdp(seed: int = 1) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Other initial weights and another lr than the saved ones: a load must replace both."""
    model = runtime.wrap(tiny(seed), "fsdp")
    return model, torch.optim.Adam(model.parameters(), lr=0.5)


# -- saved by 2 ranks, loaded by 3 and by 1 ---------------------------------------------------


def save_on_two(rank: int, world: int, port: int, folder: str) -> None:
    join(rank, world, port)
    model = runtime.wrap(tiny(0), "fsdp")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, optimizer, steps=3)
    extra = {"epoch": 3, "saved_by": rank, "rng": torch.get_rng_state()}
    path = runtime.save_sharded(folder, model, optimizer, extra=extra)
    assert path == Path(folder) / "ckpt-000000"
    reference = full_state(model, optimizer)
    if rank == 0:
        torch.save({**reference, "extra": extra}, Path(folder).parent / "reference.pt")
    runtime.shutdown()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A checkpoint of an FSDP2 model and its Adam state after 3 steps, saved by 2 ranks."""
    folder = tmp_path_factory.mktemp("two") / "ckpt"
    run_ranks(save_on_two, 2, str(folder))
    reference = torch.load(folder.parent / "reference.pt", weights_only=True)
    return folder, reference


def check_loaded(
    extra: dict[str, Any] | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: dict[str, Any],
) -> None:
    assert extra is not None
    assert extra["epoch"] == 3
    assert extra["saved_by"] == 0  # rank 0's extra, on every rank
    assert torch.equal(extra["rng"], reference["extra"]["rng"])
    assert progress.current() == 3  # the steps the saving job counted
    got = full_state(model, optimizer)
    assert_same(got["model"], reference["model"], "model")
    assert_same(got["optimizer"], reference["optimizer"], "optimizer")
    assert optimizer.param_groups[0]["lr"] == 0.01


def load_on_three(rank: int, world: int, port: int, folder: str) -> None:
    join(rank, world, port)
    reference = torch.load(Path(folder).parent / "reference.pt", weights_only=True)
    model, optimizer = fresh_fsdp()
    extra = runtime.load_sharded(folder, model, optimizer)
    check_loaded(extra, model, optimizer, reference)
    weight = model.get_parameter("2.weight")
    assert isinstance(weight, DTensor)
    assert weight.to_local().shape[0] == (2 if rank < 2 else 1)  # 5 rows over 3 ranks
    train(model, optimizer, steps=1)  # and training goes on from there
    runtime.shutdown()


def test_fsdp_state_saved_by_two_ranks_loads_on_three(
    saved: tuple[Path, dict[str, Any]],
) -> None:
    folder, _ = saved
    run_ranks(load_on_three, 3, str(folder))


def test_fsdp_state_saved_by_two_ranks_loads_in_one_process(
    saved: tuple[Path, dict[str, Any]],
) -> None:
    folder, reference = saved
    runtime.init()
    model, optimizer = fresh_fsdp()
    check_loaded(runtime.load_sharded(folder, model, optimizer), model, optimizer, reference)


def test_fsdp_state_loads_into_a_plain_model_without_a_group(
    saved: tuple[Path, dict[str, Any]],
) -> None:
    folder, reference = saved
    model = tiny(1)
    assert runtime.load_sharded(folder, model) is not None  # no optimizer: the model only
    assert_same(model.state_dict(), reference["model"], "model")


# -- one process: atomicity and what a load says ----------------------------------------------


def plain(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = tiny(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, optimizer, steps=1)
    return model, optimizer


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_no_checkpoint_loads_as_none(tmp_path: Path) -> None:
    assert runtime.load_sharded(tmp_path / "nope", tiny(0)) is None
    assert runtime.load_sharded(tmp_path, tiny(0)) is None


def test_a_plain_model_round_trips_and_only_the_newest_two_are_kept(tmp_path: Path) -> None:
    for epoch in range(3):
        model, optimizer = plain(seed=epoch)
        runtime.save_sharded(tmp_path, model, optimizer, extra={"epoch": epoch})
    assert names(tmp_path) == ["ckpt-000001", "ckpt-000002"]
    assert names(tmp_path / "ckpt-000002") == [".metadata", "__0_0.distcp", "complete-0.json"]
    fresh, fresh_optimizer = plain(seed=9)
    assert runtime.load_sharded(tmp_path, fresh, fresh_optimizer) == {"epoch": 2}
    assert_same(fresh.state_dict(), model.state_dict(), "model")
    assert_same(fresh_optimizer.state_dict(), optimizer.state_dict(), "optimizer")


def test_without_extra_a_load_returns_an_empty_dict(tmp_path: Path) -> None:
    model, _ = plain(seed=0)
    runtime.save_sharded(tmp_path, model)
    assert runtime.load_sharded(tmp_path, tiny(1)) == {}


def test_a_crash_before_the_rename_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = plain(seed=0)
    runtime.save_sharded(tmp_path, first, extra={"epoch": 1})

    def killed(tmp: Path, final: Path) -> None:
        raise KeyboardInterrupt  # the process dies between the write and the rename

    monkeypatch.setattr(sharded_mod, "_rename", killed)
    second, _ = plain(seed=1)
    with pytest.raises(KeyboardInterrupt):
        runtime.save_sharded(tmp_path, second, extra={"epoch": 2})
    monkeypatch.undo()
    # the new one is whole, marker included, but it was never renamed: it is not loaded
    assert names(tmp_path) == [".ckpt-000001.tmp", "ckpt-000000"]
    assert "complete-0.json" in names(tmp_path / ".ckpt-000001.tmp")
    model = tiny(2)
    assert runtime.load_sharded(tmp_path, model) == {"epoch": 1}
    assert_same(model.state_dict(), first.state_dict(), "model")

    # the next save takes a new name and clears the leftover
    runtime.save_sharded(tmp_path, second, extra={"epoch": 2})
    assert names(tmp_path) == ["ckpt-000000", "ckpt-000002"]
    # a folder renamed but without its marker (a crash within a rename, another node's) is
    # skipped, with a warning
    (tmp_path / "ckpt-000002" / "complete-0.json").unlink()
    with caplog.at_level(logging.WARNING, logger=sharded_mod.__name__):
        assert runtime.load_sharded(tmp_path, model) == {"epoch": 1}
    assert (
        "ckpt-000002 lacks a complete-*.json marker (its save did not finish); loading ckpt-000000"
        in caplog.text
    )


def test_a_crash_mid_write_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = plain(seed=0)
    runtime.save_sharded(tmp_path, first, extra={"epoch": 1})

    def half_save(state: object, *, storage_writer: Any) -> None:
        folder = Path(storage_writer.path)
        folder.mkdir()
        (folder / "__0_0.distcp").write_bytes(b"half a shard")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sharded_mod, "dcp_save", half_save)
    with pytest.raises(OSError, match="No space left"):
        runtime.save_sharded(tmp_path, plain(seed=1)[0], extra={"epoch": 2})
    monkeypatch.undo()
    assert runtime.load_sharded(tmp_path, tiny(2)) == {"epoch": 1}


def test_missing_metadata_is_an_error_saying_so(tmp_path: Path) -> None:
    model, _ = plain(seed=0)
    runtime.save_sharded(tmp_path, model)
    (tmp_path / "ckpt-000000" / ".metadata").unlink()
    with pytest.raises(CheckpointError) as info:
        runtime.load_sharded(tmp_path, tiny(1))
    message = str(info.value)
    assert "\n" not in message
    assert "ckpt-000000 lacks .metadata (written on global rank 0's node)" in message
    assert "give every node the union of all nodes' checkpoint folders" in message


def test_a_missing_shard_file_is_an_error_naming_it(tmp_path: Path) -> None:
    model, _ = plain(seed=0)
    runtime.save_sharded(tmp_path, model)
    (tmp_path / "ckpt-000000" / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointError, match=r"ckpt-000000 lacks shard file\(s\) __0_0\.distcp"):
        runtime.load_sharded(tmp_path, tiny(1))


def test_an_unreadable_metadata_file_is_an_error_saying_so(tmp_path: Path) -> None:
    model, _ = plain(seed=0)
    runtime.save_sharded(tmp_path, model)
    (tmp_path / "ckpt-000000" / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match=r"ckpt-000000 lacks a readable \.metadata \("):
        runtime.load_sharded(tmp_path, tiny(1))


def test_a_model_that_does_not_fit_the_checkpoint_is_a_one_line_error(tmp_path: Path) -> None:
    model, _ = plain(seed=0)
    runtime.save_sharded(tmp_path, model)
    other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 7))
    mismatch = r"loading failed: rank 0: ValueError: Size mismatch between saved torch\.Size"
    with pytest.raises(CheckpointError, match=mismatch) as info:
        runtime.load_sharded(tmp_path, other)
    assert "\n" not in str(info.value)


# -- two nodes, each with its own folder ------------------------------------------------------


def two_nodes(rank: int, world: int, port: int, base: str) -> None:
    """Rank 0 on node A, rank 1 on node B: one process each, LOCAL_RANK 0 on both."""
    join(rank, world, port, one_per_node=True)
    root = Path(base)
    own = root / ("A" if rank == 0 else "B")
    model = runtime.wrap(tiny(0), "fsdp")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in (1, 2):
        train(model, optimizer, steps=1)
        runtime.save_sharded(own, model, optimizer, extra={"epoch": epoch})
        reference = full_state(model, optimizer)
        if rank == 0:
            torch.save(reference, root / f"reference{epoch}.pt")
    # each node holds its own rank's shard and marker; the metadata is where rank 0 is
    ckpt = own / "ckpt-000001"
    mine = {f"__{rank}_0.distcp", f"complete-{rank}.json"}
    assert set(names(ckpt)) == (mine | {".metadata"} if rank == 0 else mine)

    # not merged: every rank refuses, saying what its folder lacks
    fresh, fresh_optimizer = fresh_fsdp()
    with pytest.raises(CheckpointError) as info:
        runtime.load_sharded(own, fresh, fresh_optimizer)
    lacks = "the marker and shards of the node(s) of rank(s) 1" if rank == 0 else ".metadata"
    assert f"ckpt-000001 lacks {lacks}" in str(info.value), info.value

    # merged (the union of both folders, given to both nodes): both load epoch 2
    merged = root / ("mergedA" if rank == 0 else "mergedB")
    for part in ("A", "B"):
        shutil.copytree(root / part, merged, dirs_exist_ok=True)
    assert runtime.load_sharded(merged, fresh, fresh_optimizer) == {"epoch": 2}
    want = torch.load(root / "reference2.pt", weights_only=True)
    assert_same(full_state(fresh, fresh_optimizer), want)
    runtime.shutdown()


def test_two_nodes_without_a_shared_folder_load_once_merged(tmp_path: Path) -> None:
    run_ranks(two_nodes, 2, str(tmp_path))
    assert names(tmp_path / "A") == names(tmp_path / "B") == ["ckpt-000000", "ckpt-000001"]

    # node B died before its rename of ckpt-000001: the merged ckpt-000001 lacks B's marker
    # and shards, so a load goes back to ckpt-000000, which both nodes finished
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "A", crashed)
    b = tmp_path / "B"
    (b / "ckpt-000001").rename(b / ".ckpt-000001.tmp")
    shutil.copytree(b, crashed, dirs_exist_ok=True)
    runtime.init()
    model, optimizer = fresh_fsdp()
    assert runtime.load_sharded(crashed, model, optimizer) == {"epoch": 1}
    want = torch.load(tmp_path / "reference1.pt", weights_only=True)
    assert_same(full_state(model, optimizer), want)


def test_ranks_that_see_different_checkpoints_raise_together(tmp_path: Path) -> None:
    """The choice is collective: a rank whose folder has no checkpoint the others have."""
    views: list[tuple[list[int], str | None]] = [([1, 0], None), ([], None)]
    with pytest.raises(CheckpointError, match="this rank's newest is ckpt-000001") as info:
        sharded_mod._agree(tmp_path, views)
    assert "rank 1's folder: no checkpoint" in str(info.value)
    assert sharded_mod._agree(tmp_path, [([1, 0], None), ([0], "ckpt-000001 lacks x")]) == 0
    assert sharded_mod._agree(tmp_path, [([], None), ([], None)]) is None
    assert not dist.is_initialized()
