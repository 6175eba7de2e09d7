"""How far a job got: a step counter that outlives restarts, which the coordinator reads.

Call ``runtime.step()`` once per optimizer step. The count is saved in every checkpoint
(`save_checkpoint`) and restored by `load_checkpoint`, so it goes on across a job's attempts;
``resumed_from`` says where the current process started counting. Local rank 0 writes
``{"step", "at", "resumed_from"}`` to ``$CLOUDTRAIN_RUN_DIR/progress.json`` (the attempt's
folder on the node) at most once a second and at each checkpoint, and ``python -m
cloudtrain.node status`` returns it: the watcher of a managed job counts the steps a recovery
redid from it. Without ``CLOUDTRAIN_RUN_DIR`` (not under cloudtrain) nothing is written.

Each finished save (`save_checkpoint`, `save_sharded`: after its rename) calls `saved`, which
adds ``"saved": {"step", "at", "count"}`` to the file at once: the completion marker the
coordinator watches to bring that checkpoint home as soon as it is whole
(`cloudtrain.jobs.saves`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

WRITE_EVERY_S = 1.0

_step = 0
_resumed_from: int | None = None
_written = 0.0
_saved: dict[str, float | int] | None = None


def step() -> int:
    """Count one optimizer step; the count so far."""
    global _step
    _step += 1
    if time.monotonic() - _written >= WRITE_EVERY_S:
        write()
    return _step


def current() -> int:
    """The steps counted so far (with those of the checkpoint this process resumed from)."""
    return _step


def resume(at: int) -> None:
    """Go on counting from `at` (the step a checkpoint was saved at)."""
    global _step, _resumed_from
    _step = _resumed_from = at
    write()


def saved() -> None:
    """Say that a checkpoint of the current step is complete on this node (written and
    renamed into place): written at once, for the coordinator to bring it home."""
    global _saved
    count = int(_saved["count"]) + 1 if _saved else 1
    _saved = {"step": _step, "at": time.time(), "count": count}
    write()


def write() -> None:
    """Write the count where the coordinator reads it (local rank 0 only; atomic)."""
    global _written
    folder = os.environ.get("CLOUDTRAIN_RUN_DIR")
    if not folder or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    _written = time.monotonic()
    path = Path(folder) / "progress.json"
    tmp = path.with_name(f".progress.{os.getpid()}.tmp")
    try:
        now = {"step": _step, "at": time.time(), "resumed_from": _resumed_from, "saved": _saved}
        tmp.write_text(json.dumps(now))
        os.replace(tmp, path)
    except OSError:  # the job's folder went away (a teardown): nobody reads it any more
        return
