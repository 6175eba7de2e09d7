"""Atomic, per-node checkpoints that a restarted job resumes from.

The local main process of each node (``LOCAL_RANK`` 0) writes its own copy, so resuming needs
no shared filesystem: DDP replicas hold identical state. On a shared filesystem the nodes'
writes race harmlessly, since each goes to its own temp file and the rename is atomic.
This suits replicated state (DDP); FSDP's sharded state belongs in ``torch.distributed.checkpoint``.

Copies may disagree: a node that joined an elastic job, or one given the copy the user's machine
kept, can hold an older checkpoint than the nodes that kept training. So each checkpoint carries
when it was saved (`STAMP`, inside the file: it travels with every copy), and `load_checkpoint`
in a group of several ranks hands every rank the newest any rank holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cloudtrain.errors import CheckpointError
from cloudtrain.runtime import progress
from cloudtrain.runtime.dist import barrier, local_rank

log = logging.getLogger(__name__)

__all__ = ["CheckpointError", "checkpoint_dir", "load_checkpoint", "save_checkpoint"]

StrPath = str | os.PathLike[str]
#: The keys `save_checkpoint` adds to the state (the wall-clock time of the save, and the
#: steps counted: `cloudtrain.runtime.progress`) and `load_checkpoint` removes again.
STAMP, STEP = "_cloudtrain_saved_at", "_cloudtrain_step"


def checkpoint_dir() -> Path:
    """Where checkpoints go: ``$CLOUDTRAIN_CHECKPOINT_DIR``, else ``./checkpoints``. Not created."""
    return Path(os.environ.get("CLOUDTRAIN_CHECKPOINT_DIR") or "checkpoints").expanduser()


_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


def _explain(error: Exception) -> str:
    """A one-line reason for a failed ``torch.load`` (torch's own messages span paragraphs)."""
    text = str(error).strip()
    unsafe = _UNSAFE_GLOBAL.search(text)
    if unsafe:
        return (
            f"holds a {unsafe[1]}, which weights_only loading refuses; if you trust the file, "
            "allow the type with torch.serialization.add_safe_globals"
        )
    if isinstance(error, EOFError):
        detail = "the file ends early"
    elif text.startswith("Weights only load failed"):
        detail = "not a pickle torch can read"
    else:
        detail = text.splitlines()[0].split(". ")[0] if text else type(error).__name__
    return f"is corrupt, truncated or not a torch checkpoint ({detail})"


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX; skipped where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, state: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({**state, STAMP: time.time(), STEP: progress.current()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    log.info("checkpoint saved: %s", path)


def save_checkpoint(path: StrPath, state: Mapping[str, Any]) -> None:
    """Save `state` to `path` atomically on every node; collective when a group is initialised.

    Only ``LOCAL_RANK`` 0 writes: to a unique temp file in the same folder, fsynced, then
    renamed over `path`, so a crash leaves the previous checkpoint intact. Every rank then meets
    at a barrier, so no rank reads a half-written file. Call it on all ranks. Raises what
    writing raises (OSError, pickling errors) on the writer.
    """
    target = Path(path)
    try:
        if local_rank() == 0:
            _write_atomic(target, state)
            progress.saved()  # the marker that brings it home (`cloudtrain.jobs.saves`)
    finally:
        barrier()


def load_checkpoint(path: StrPath) -> dict[str, Any] | None:
    """The state saved at `path`, or None when there is no such file.

    Collective when a group of several ranks is initialised (call it on all ranks, as
    `save_checkpoint`): every rank gets the newest checkpoint any rank's `path` holds (by when
    it was saved), sent from that rank only when the ranks' copies differ. Without a group it
    does not block.

    Tensors are loaded to CPU (move them with ``load_state_dict``) with
    ``weights_only=True``: the file can hold tensors, numbers, strings and the usual
    containers (what model and optimizer ``state_dict()`` give) and cannot run code when
    loaded. Other types must be registered with ``torch.serialization.add_safe_globals``.
    Raises CheckpointError, naming the path, when the file is corrupt or holds anything else.
    """
    state = _read(Path(path))
    if dist.is_initialized() and dist.get_world_size() > 1:
        state = _newest_of_all(state)
    if state is not None:
        state.pop(STAMP, None)
        step = state.pop(STEP, None)
        if isinstance(step, int):
            progress.resume(step)
    return state


def _read(target: Path) -> dict[str, Any] | None:
    try:
        f = target.open("rb")
    except FileNotFoundError:
        return None
    with f:
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(target, _explain(e)) from e
    if not isinstance(state, dict):
        raise CheckpointError(target, f"holds a {type(state).__name__}, expected a dict")
    log.info("checkpoint loaded: %s", target)
    return state


def _newest_of_all(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The state of the rank whose checkpoint was saved last (none: -1; one saved before
    stamps: 0), on every rank; nothing is sent when all ranks hold the same one."""
    stamp = -1.0 if state is None else float(state.get(STAMP, 0.0))
    stamps: list[float] = [0.0] * dist.get_world_size()
    dist.all_gather_object(stamps, stamp)
    newest = max(stamps)
    if all(s == newest for s in stamps):
        return state
    source = stamps.index(newest)
    box = [state if dist.get_rank() == source else None]
    dist.broadcast_object_list(box, src=source)
    if dist.get_rank() != source:
        log.info("checkpoint taken from rank %d: it is newer than this rank's", source)
    return box[0]
