"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank writes its shard.

    runtime.save_sharded(folder, model, optimizer, extra={"epoch": 3})  # collective
    extra = runtime.load_sharded(folder, model, optimizer)             # None: start fresh

For FSDP2 (``fully_shard``) models, where no rank holds the whole state, and for plain and DDP
models too (their replicated tensors are written once, spread over the ranks). The state goes
through ``get_state_dict``/``set_state_dict``, so a checkpoint saved by N ranks loads on M:
DCP reshards it on load.

`folder` on each node (it need not be shared)::

    folder/
      ckpt-000007/          a finished save: the newest
        .metadata           DCP's index of every shard: on global rank 0's node only
        __0_0.distcp        a rank's shard, on the node that rank runs on
        __1_0.distcp
        complete-0.json     one marker per node, named after the global rank of the node's
                            LOCAL_RANK 0: {"checkpoint", "step", "world_size", "writers",
                            "save" (one token per save), "files" (the node's, with sizes), ...}
      ckpt-000006/          the one before (`keep` = 2)
      .ckpt-000008.tmp/     a save in progress, or one a crash cut short: never loaded

A save, on all ranks:

1. agree on the next number: the newest any node's folder holds (temp folders included), plus 1;
2. ``dcp.save`` into ``.ckpt-N.tmp``: each rank writes its shard; rank 0 adds ``.metadata``
   once every rank has written (files fsynced);
3. each node's LOCAL_RANK 0 writes its marker into the temp folder; barrier;
4. each node's LOCAL_RANK 0 renames ``.ckpt-N.tmp`` to ``ckpt-N`` (atomic); barrier;
5. each node's LOCAL_RANK 0 removes all but the newest `keep` and any stale temp folders.

A crash before 4 leaves ``ckpt-(N-1)`` the newest on every node. A crash within 4 (one node
renamed, another not) leaves a ``ckpt-N`` that lacks that node's marker: incomplete, so a load
goes back to ``ckpt-(N-1)``.

Without a shared filesystem each node's folder holds its own ranks' shards and marker, and only
global rank 0's node holds ``.metadata``; the coordinator gives every node the union of all
nodes' folders before a resume. A checkpoint is complete when it has ``.metadata``, the marker
of every node its markers name, all of one save, every file they list at its size, and every
file ``.metadata`` refers to (`cloudtrain.jobs.shards`, which the user's machine reads too, to
choose what a resumed job gets); `load_sharded` loads the newest that is complete on every
rank, and raises CheckpointError saying what is missing when none is (a folder that was not
merged, say).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from cloudtrain.errors import CheckpointError, one_line
from cloudtrain.jobs import shards
from cloudtrain.runtime import progress
from cloudtrain.runtime.checkpoint import _explain, _fsync_dir
from cloudtrain.runtime.dist import barrier, local_rank, rank, world_size

log = logging.getLogger(__name__)

__all__ = ["load_sharded", "save_sharded"]

StrPath = str | os.PathLike[str]
METADATA = shards.METADATA
#: The key of cloudtrain's own entry in the DCP state: `extra` and the step, as one blob.
ENTRY = "cloudtrain"
_DONE, _TEMP = re.compile(r"ckpt-(\d+)"), re.compile(r"\.ckpt-(\d+)\.tmp")


def _name(seq: int) -> str:
    return f"ckpt-{seq:06d}"


def _marker(writer: int) -> str:
    return f"complete-{writer}.json"


def save_sharded(
    folder: StrPath,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: Mapping[str, Any] | None = None,
    *,
    keep: int = 2,
) -> Path:
    """Save `model` (and `optimizer`) sharded into `folder`; the new checkpoint's path.

    Collective: call it on every rank, with the same `folder` path (which may be a different
    disk on each node). Blocks until every rank has written. `extra` (epoch, RNG state: what
    ``torch.load(weights_only=True)`` can read) is taken from global rank 0 and comes back from
    `load_sharded` on every rank; the step count of `cloudtrain.runtime.progress` is saved
    with it. Atomic (see the module's docstring): a crash leaves the previous checkpoint
    loadable. Keeps the newest `keep` checkpoints. Raises ValueError for `keep` < 1, and
    what writing raises (OSError; DCP's failures as CheckpointError).
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    root = Path(folder)
    node_writer = local_rank() == 0 or not _grouped()
    views = _gather((_newest_seq(root), node_writer, rank(), secrets.token_hex(8)))
    seq = max(n for n, _, _, _ in views) + 1
    writers = [r for _, first, r, _ in views if first]
    save = views[0][3]  # rank 0's: the same in every node's marker of this save
    name = _name(seq)
    tmp, final = root / f".{name}.tmp", root / name

    if optimizer is None:
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    step = progress.current()
    if rank() == 0:  # DCP saves a value every rank holds once: make it rank 0's
        state[ENTRY] = _pack({"extra": None if extra is None else dict(extra), "step": step})
    try:
        with _quiet_without_a_group():
            dcp_save(state, storage_writer=FileSystemWriter(tmp))
    except CheckpointException as e:
        raise CheckpointError(tmp, f"saving failed: {_failure(e)}") from None

    if node_writer:
        marker = {
            "checkpoint": name,
            "step": step,
            "world_size": world_size(),
            "writers": writers,
            "rank": rank(),
            "saved_at": time.time(),
            "save": save,
            "files": _files(tmp),
        }
        _write_json(tmp / _marker(rank()), marker)
        _fsync_dir(tmp)
    barrier()  # every node's marker is in: on a shared folder a rename must not come first
    if node_writer:
        _rename(tmp, final)
    barrier()
    if node_writer:
        _prune(root, keep)
        progress.saved()  # the marker that brings it home (`cloudtrain.jobs.saves`)
        log.info("sharded checkpoint saved: %s (step %d)", final, step)
    barrier()
    return final


def load_sharded(
    folder: StrPath, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any] | None:
    """Load the newest complete checkpoint in `folder` into `model` (and `optimizer`), in place.

    Collective: call it on every rank, after wrapping the model and making the optimizer, as
    for `save_sharded`; the world size may differ from the one that saved. Returns the saved
    `extra` (an empty dict when none was saved), or None when `folder` holds no checkpoint.
    Restores the step count of `cloudtrain.runtime.progress`. Raises CheckpointError with one
    line saying what is missing when the newest checkpoint is incomplete on some rank and no
    older one is complete everywhere (the nodes' folders were not merged), or what DCP
    reported when the state does not fit the model or optimizer.
    """
    root = Path(folder)
    chosen = _agree(root, _gather(_scan(root)))
    if chosen is None:
        return None
    path = root / _name(chosen)
    if optimizer is None:
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    state[ENTRY] = b""
    try:
        with _quiet_without_a_group():
            dcp_load(state, storage_reader=FileSystemReader(path))
    except CheckpointException as e:
        raise CheckpointError(path, f"loading failed: {_failure(e)}") from None
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
    saved = _unpack(path, state[ENTRY])
    if isinstance(saved.get("step"), int):
        progress.resume(saved["step"])
    log.info("sharded checkpoint loaded: %s", path)
    extra = saved.get("extra")
    return dict(extra) if isinstance(extra, Mapping) else {}


# -- the folder -------------------------------------------------------------------------------


def _seqs(root: Path, *, temp: bool) -> list[int]:
    """The numbers of the checkpoints in `root` (with `temp`: the temp folders' too), newest
    first."""
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = set()
    for entry in entries:
        m = _DONE.fullmatch(entry.name) or (_TEMP.fullmatch(entry.name) if temp else None)
        if m and entry.is_dir():
            found.add(int(m[1]))
    return sorted(found, reverse=True)


def _newest_seq(root: Path) -> int:
    seqs = _seqs(root, temp=True)
    return seqs[0] if seqs else -1


def _files(tmp: Path) -> dict[str, int]:
    """The files this node wrote into the checkpoint (its ranks' shards; ``.metadata`` on rank
    0's node), with their sizes: what its marker vouches for."""
    return {
        f.name: f.stat().st_size
        for f in sorted(tmp.iterdir())
        if f.is_file() and not f.name.startswith("complete-")
    }


def _missing(path: Path) -> str | None:
    """What checkpoint `path` lacks to be loaded (None: complete): what its markers say
    (`cloudtrain.jobs.shards.missing`), then every file ``.metadata`` refers to."""
    gap = shards.missing(path)
    if gap is not None:
        return gap
    try:
        files = _referenced_files(path)
    except Exception as e:  # a pickle: anything can go wrong, all of it means unreadable
        return (
            f"{path.name} lacks a readable {METADATA} ({one_line(f'{type(e).__name__}: {e}', 120)})"
        )
    lost = sorted(f for f in files if not (path / f).is_file())
    return f"{path.name} lacks shard file(s) {', '.join(lost)}" if lost else None


def _referenced_files(path: Path) -> set[str]:
    """The files ``.metadata`` says the shards are in."""
    storage = FileSystemReader(path).read_metadata().storage_data or {}
    return {str(info.relative_path) for info in storage.values() if hasattr(info, "relative_path")}


def _scan(root: Path) -> tuple[list[int], str | None]:
    """The complete checkpoints in `root` (newest first), and what the newest incomplete one
    newer than all of them lacks."""
    complete: list[int] = []
    problem = None
    for seq in _seqs(root, temp=False):
        gap = _missing(root / _name(seq))
        if gap is None:
            complete.append(seq)
        elif problem is None and not complete:
            problem = gap
    return complete, problem


def _agree(root: Path, views: list[tuple[list[int], str | None]]) -> int | None:
    """The newest checkpoint every rank sees complete; None when no rank sees any checkpoint.
    Raises CheckpointError (on every rank) when ranks see some but none in common."""
    own_seqs, own_problem = views[_me(views)]
    common = set(own_seqs).intersection(*(set(seqs) for seqs, _ in views))
    if common:
        chosen = max(common)
        if own_problem or own_seqs[0] > chosen:
            newest = own_problem or f"{_name(own_seqs[0])} is not complete on every rank"
            log.warning("%s; loading %s", newest, _name(chosen))
        return chosen
    if not any(seqs or problem for seqs, problem in views):
        return None
    if own_problem:
        reason = own_problem
    elif not own_seqs:
        reason = "this rank's folder holds no checkpoint"
    else:
        r, (seqs, problem) = next(
            (r, v) for r, v in enumerate(views) if v[1] or not set(v[0]) & set(own_seqs)
        )
        theirs = problem or (f"only {_name(seqs[0])}" if seqs else "no checkpoint")
        reason = f"rank {r}'s folder: {theirs}; this rank's newest is {_name(own_seqs[0])}"
    hint = "give every node the union of all nodes' checkpoint folders before resuming"
    raise CheckpointError(root, f"no checkpoint is complete on every rank: {reason}; {hint}")


def _rename(tmp: Path, final: Path) -> None:
    """`tmp` becomes `final`; on a shared folder another node may have done it already."""
    try:
        os.rename(tmp, final)
    except OSError:
        if tmp.exists() or not final.is_dir():
            raise
    _fsync_dir(final.parent)


def _prune(root: Path, keep: int) -> None:
    """Remove all checkpoints but the newest `keep`, and every temp folder (the one saved last
    was renamed: the others are leftovers of crashes)."""
    for seq in _seqs(root, temp=False)[keep:]:
        shutil.rmtree(root / _name(seq), ignore_errors=True)
    for entry in root.glob(".ckpt-*.tmp"):
        shutil.rmtree(entry, ignore_errors=True)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    with path.open("w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())


# -- helpers ----------------------------------------------------------------------------------


def _grouped() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _gather(value: Any) -> list[Any]:
    """`value` of every rank, in rank order (this rank's alone without a group)."""
    if not _grouped():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


@contextlib.contextmanager
def _quiet_without_a_group() -> Iterator[None]:
    """Without a process group DCP saves and loads in this process alone, which is what a
    one-process job means: drop the warning DCP gives about it every time."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _me(views: list[Any]) -> int:
    """This rank's index in what `_gather` returned."""
    return rank() if len(views) > 1 else 0


def _pack(saved: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(dict(saved), buf)
    return buf.getvalue()


def _unpack(path: Path, blob: Any) -> dict[str, Any]:
    if not isinstance(blob, bytes) or not blob:
        raise CheckpointError(path, f"has no {ENTRY!r} entry: not saved by save_sharded")
    try:
        saved = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(path, f"its extra {_explain(e)}") from e
    if not isinstance(saved, dict):
        raise CheckpointError(path, f"its {ENTRY!r} entry holds a {type(saved).__name__}")
    return saved


def _failure(e: CheckpointException) -> str:
    """DCP's first failure on one line (its own message holds every rank's traceback)."""
    for r, (exc, _) in sorted(e.failures.items()):
        return f"rank {r}: {one_line(f'{type(exc).__name__}: {exc}', 240)}"
    return one_line(str(e), 240)
