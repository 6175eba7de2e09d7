"""A job's metrics at home: what its script reported (`cloudtrain.runtime.metrics`), copied from
its nodes and kept after `down`.

Each node's ``metrics.jsonl`` of each attempt is copied to
``<home>/logs/<job>/metrics/<attempt>-<node>.jsonl``, whole lines only and only the new ones:
the copy's size is the offset the next copy asks the node for (``python -m cloudtrain.node
metrics DIR --offset N``), so any process, at any time, can bring it up to date (under a lock
on the copy: two at once add each line once), and a copy interrupted halfway is taken up where
it stopped. `read` merges the copies of every attempt and node in time order; a line that does
not parse (a node's file cut short) is skipped.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["columns", "copy_path", "latest", "pull", "read"]

_COPY = re.compile(r"^(\d+)-(\d+)\.jsonl$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: The fields of a line that are not metrics, in the order a table shows them.
FIELDS = ("attempt", "step", "at", "rank")


def folder(home: Path, job_id: str) -> Path:
    return home / "logs" / job_id / "metrics"


def copy_path(home: Path, job_id: str, attempt: int, node: int) -> Path:
    return folder(home, job_id) / f"{attempt}-{node}.jsonl"


def pull(copy: Path, fetch: Callable[[int], str]) -> int:
    """Append to `copy` the whole lines `fetch(offset)` returns from the node's file (the
    bytes from `offset` on), until it returns nothing new; how many lines were added."""
    copy.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    added = 0
    fd = os.open(copy, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "ab") as out:
        fcntl.flock(out, fcntl.LOCK_EX)  # two processes at once: one copy, no line twice
        out.seek(0, os.SEEK_END)
        while True:
            data = fetch(out.tell()).encode()
            if not data:
                return added
            out.write(data)
            out.flush()
            added += data.count(b"\n")


def read(home: Path, job_id: str) -> list[dict[str, Any]]:
    """Every line kept of `job_id`, each with its ``attempt``, ordered by time (then rank)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(folder(home, job_id).glob("*.jsonl")):
        named = _COPY.match(path.name)
        if not named:
            continue
        attempt = int(named.group(1))
        for text in path.read_text(errors="replace").splitlines():
            try:
                line = json.loads(text)
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
