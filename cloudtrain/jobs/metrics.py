"""A job's metrics at home: what its script reported (`cloudtrain.runtime.metrics`), copied from
its nodes and kept after `down`.

Each node's ``metrics.jsonl`` of each attempt is copied to
``<home>/logs/<job>/metrics/<attempt>-<node>.jsonl``, whole lines only and only the new ones:
``<copy>.offset`` holds the offset in the node's file the next copy asks from (``python -m
cloudtrain.node metrics DIR --offset N``, which answers with the offset after what it sends)
and the copy's size when it was written, so any process, at any time, can bring it up to date
(under a lock on the copy: two at once add each line once), and a copy interrupted halfway is
cut back to its last recorded size and taken up where it stopped.

A node's file is untrusted: only lines that parse as a metrics line are kept, written again
from what they hold (`_clean`), none longer than `MAX_LINE`, and a copy stops growing at
`MAX_COPY` bytes (later lines of that node and attempt are not copied; a warning says so).
`read` streams the copies and merges them in time order.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["columns", "copy_path", "latest", "pull", "read"]

log = logging.getLogger(__name__)

#: The most one node's metrics of one attempt hold at home (about 300k lines of a few metrics).
MAX_COPY = 32 << 20
#: The longest metrics line kept: a line of `runtime.report` is far shorter.
MAX_LINE = 16 << 10
_COPY = re.compile(r"^(\d+)-(\d+)\.jsonl$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: The fields of a line that are not metrics, in the order a table shows them.
FIELDS = ("attempt", "step", "at", "rank")


def folder(home: Path, job_id: str) -> Path:
    return home / "logs" / job_id / "metrics"


def copy_path(home: Path, job_id: str, attempt: int, node: int) -> Path:
    return folder(home, job_id) / f"{attempt}-{node}.jsonl"


def pull(copy: Path, fetch: Callable[[int], str]) -> int:
    """Append to `copy` the metrics lines `fetch(offset)` returns from the node's file (the
    offset after them on a first line, then the whole lines from `offset` on), until it
    returns nothing new or the copy holds `MAX_COPY` bytes; how many lines were added."""
    copy.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    added = 0
    fd = os.open(copy, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+b") as out:
        fcntl.flock(out, fcntl.LOCK_EX)  # two processes at once: one copy, no line twice
        offset, size = _mark(copy)
        out.truncate(size)  # what was written after the last mark was never marked: again
        out.seek(size)
        full = offset < 0
        while not full:
            head, _, text = fetch(offset).partition("\n")
            after = int(head) if head.isdigit() else offset
            if after <= offset:
                return added
            data = b"".join(c for c in (_line(t) for t in text.splitlines()) if c is not None)
            if len(data) > MAX_COPY - size:
                data = data[: MAX_COPY - size]
                data, full = data[: data.rfind(b"\n") + 1], True
                why = "the node's later lines are not copied"
                log.warning("the metrics copied to %s reached %d MB: %s", copy, MAX_COPY >> 20, why)
            out.write(data)
            out.flush()
            size += len(data)
            added += data.count(b"\n")
            offset = -1 if full else after  # a full copy asks for nothing more
            _set_mark(copy, offset, size)
    return added


def _mark_path(copy: Path) -> Path:
    return copy.with_name(copy.name + ".offset")


def _mark(copy: Path) -> tuple[int, int]:
    """(the node's offset, the copy's size) as last recorded (an offset of -1: the copy is
    full); a copy without a record is one made before it was kept, whose size was the
    offset."""
    try:
        offset, size = (int(w) for w in _mark_path(copy).read_text().split())
    except (OSError, ValueError):
        size = copy.stat().st_size
        return size, size
    return offset, size


def _set_mark(copy: Path, offset: int, size: int) -> None:
    tmp = _mark_path(copy).with_suffix(".tmp")
    tmp.write_text(f"{offset} {size}\n")
    os.replace(tmp, _mark_path(copy))


def _line(text: str) -> bytes | None:
    """A node's line as the copy keeps it: what `_clean` keeps of it, or None."""
    if len(text) > MAX_LINE:
        return None
    try:
        line = json.loads(text)
    except ValueError:
        return None
    if not isinstance(line, dict) or not isinstance(line.get("step"), int):
        return None
    return json.dumps(_clean(line), separators=(",", ":")).encode() + b"\n"


def read(home: Path, job_id: str) -> list[dict[str, Any]]:
    """Every line kept of `job_id`, each with its ``attempt``, ordered by time (then rank);
    each copy is read a line at a time (its size is bounded by `pull`)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(folder(home, job_id).glob("*.jsonl")):
        named = _COPY.match(path.name)
        if not named:
            continue
        attempt = int(named.group(1))
        with path.open(errors="replace") as copy:
            for text in copy:
                try:
                    line = json.loads(text) if len(text) <= MAX_LINE else None
                except ValueError:
                    continue
                if isinstance(line, dict) and isinstance(line.get("step"), int):
                    lines.append({"attempt": attempt, **_clean(line)})
    lines.sort(key=lambda ln: (ln.get("at") or 0, ln.get("rank") or 0))
    return lines


def _clean(line: Mapping[str, Any]) -> dict[str, Any]:
    """What `runtime.report` writes and nothing else: names that are identifiers, values that
    are numbers or None (a node's file is not trusted to hold only what the script wrote: a
    name must not reach a terminal or a spreadsheet as a command)."""
    return {
        k: v
        for k, v in line.items()
        if _NAME.fullmatch(k)
        and (v is None or (isinstance(v, int | float) and not isinstance(v, bool)))
    }


def columns(lines: Iterable[Mapping[str, Any]]) -> list[str]:
    """The fields, then every metric's name in the order first reported."""
    names: dict[str, None] = dict.fromkeys(FIELDS)
    for line in lines:
        names.update(dict.fromkeys(line))
    return list(names)


def latest(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The last value of every metric (and the last step, and ``total_steps`` if said)."""
    found: dict[str, Any] = {}
    for line in lines:
        found.update({k: v for k, v in line.items() if v is not None})
    return found
