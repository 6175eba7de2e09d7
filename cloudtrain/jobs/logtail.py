"""How much of a node's log `cloudtrain logs` prints: the tail, at most `LINES` lines and
`BYTES` bytes, from the node (``cloudtrain.node follow --once --tail``) or from the copy kept
at home, with one line saying what was left out and where the whole log is.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["BYTES", "LINES", "left_out", "read", "skipped"]

#: The most lines of one node's log that `cloudtrain logs` prints.
LINES = 5000
#: The most bytes of it read (the node's ``follow --tail`` goes back as far, `node.TAIL_BYTES`).
BYTES = 1 << 20

_SKIPPED = re.compile(r"^cloudtrain: left out (\d+) bytes of node\.log$", re.MULTILINE)


def skipped(stderr: str) -> int:
    """How many bytes of node.log the node's ``follow --once --tail`` left out (0: none)."""
    found = _SKIPPED.search(stderr)
    return int(found.group(1)) if found else 0


def read(path: Path) -> tuple[str, int]:
    """The last `LINES` whole lines of `path` within its last `BYTES` bytes, and how many
    bytes before them were left out. Reads at most `BYTES`."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        start = max(0, size - BYTES)
        f.seek(start)
        data = f.read(BYTES)
    cut = 0
    if start:  # begin at a whole line
        cut = data.find(b"\n") + 1
    lines = data[cut:].splitlines(keepends=True)
    if len(lines) > LINES:
        cut += sum(len(line) for line in lines[:-LINES])
        lines = lines[-LINES:]
    return b"".join(lines).decode(errors="replace"), start + cut


def left_out(count: int, where: str) -> str:
    """The line printed before a log's tail when `count` bytes of it were left out."""
    return (
        f"cloudtrain: {count} bytes of earlier output left out (at most the last {LINES} lines "
        f"or {BYTES >> 20} MiB are printed); the whole log is {where}"
    )
