"""What a training script reports: numbers per step, kept with the job, shown while it runs.

    runtime.report(step=epoch, loss=0.31, accuracy=0.92)      # rank 0 writes; the others: no-op
    runtime.report(total_steps=args.epochs)                   # once: `train` shows an ETA
    runtime.report(step=i, all_ranks=True, samples_s=812.0)   # every rank, each line its rank

Each call appends one JSON line to ``$CLOUDTRAIN_RUN_DIR/metrics.jsonl`` (the attempt's folder on
the node, beside its log): ``{"step": S, "at": EPOCH_S, "rank": R, NAME: VALUE...}``. The
coordinator copies new lines home while it follows the job, when it ends and before `down`
(`cloudtrain.jobs.metrics`); ``cloudtrain metrics JOB`` prints them. Guarantees:

=================  ===============================================================================
one line, whole    a line is written with a single ``write`` on an ``O_APPEND`` file: ranks of one
                   node appending at once never interleave, and a crash leaves whole lines (a
                   reader skips a torn last line)
numbers only       every value is a finite number, or None for NaN and infinities (JSON has
                   neither); anything else is a TypeError naming the metric and its value
no cloudtrain, no  without ``CLOUDTRAIN_RUN_DIR`` (a script run by hand) nothing is written
file
=================  ===============================================================================

``step`` defaults to `runtime.step`'s count. The rank is read from the environment (``RANK``
under torchrun and cloudtrain's TensorFlow workers, ``HOROVOD_RANK`` under Horovod), not from a
process group: it works in a script of any runtime, before or without ``runtime.init()``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from cloudtrain.runtime import progress

__all__ = ["FILE", "RESERVED", "report"]

FILE = "metrics.jsonl"
#: What every line holds besides the metrics: not a metric's name.
RESERVED = frozenset({"step", "at", "rank", "total_steps"})


def _rank() -> int:
    for name in ("RANK", "HOROVOD_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _number(name: str, value: object) -> float | int | None:
    if isinstance(value, bool | int):
        return int(value)
    try:
        number = float(value)  # type: ignore[arg-type]  # a float, a 0-d tensor, numpy's
    except (TypeError, ValueError):
        raise TypeError(
            f"runtime.report: {name}={value!r} is not a number (report numbers: floats, ints, "
            "0-d tensors)"
        ) from None
    return number if math.isfinite(number) else None


def report(
    step: int | None = None,
    *,
    all_ranks: bool = False,
    total_steps: int | None = None,
    **metrics: object,
) -> dict[str, object] | None:
    """Record `metrics` at `step` (default: the steps counted by `runtime.step`); on rank 0
    only unless `all_ranks`. `total_steps` says how many steps the job will take (for the
    ETA `train` shows). Returns the line written, or None when this rank writes nothing."""
    rank = _rank()
    if rank != 0 and not all_ranks:
        return None
    line: dict[str, object] = {
        "step": int(progress.current() if step is None else step),
        "at": round(time.time(), 3),
        "rank": rank,
    }
    if total_steps is not None:
        line["total_steps"] = int(total_steps)
    for name, value in metrics.items():
        if name in RESERVED:
            raise TypeError(f"runtime.report: {name!r} is the line's own, not a metric's name")
        line[name] = _number(name, value)
    folder = os.environ.get("CLOUDTRAIN_RUN_DIR")
    if not folder:
        return line
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(Path(folder) / FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                     0o644)  # fmt: skip
    except OSError:  # the job's folder went away (a teardown): nobody reads it any more
        return line
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return line
