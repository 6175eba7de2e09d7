"""Which checkpoints of a sharded (FSDP) job are whole, read from their markers alone.

`cloudtrain.runtime.sharded` saves each checkpoint into a folder ``ckpt-NNNNNN/`` of the
script's choosing, with one marker per node, ``complete-<rank>.json``, written once the node's
ranks have written their shards::

    {"checkpoint": "ckpt-000007", "step": 120, "world_size": 4, "writers": [0, 2],
     "rank": 2, "saved_at": 1764000000.0, "save": "<one token per save, the same on every
     node>", "files": {"__2_0.distcp": 1048576, "__3_0.distcp": 1048576}}

A checkpoint is complete when the marker of every node its markers name (``writers``) is there,
all of one save (a folder that mixes the shards of two saves of the same number, one node's
from before a recovery and another's from after, is not), every file a marker lists is there
at its size, and ``.metadata`` (DCP's index, written on global rank 0's node) is there too.
Markers written before ``save`` and ``files`` existed are taken on their word for those.

Nothing here unpickles: ``.metadata`` is a pickle, and on the user's machine what came from a
node is never loaded (the node that resumes reads it, and `load_sharded` checks what it names).
Stdlib only: the home reads this without torch; `cloudtrain.runtime.sharded` reads it too.

Which snapshot a resumed job gets (`usable`, `newest_usable`): every node's folder holds only its
own ranks' shards, so the snapshot kept at home is the union of every node's last copy. When a
node is lost between two copies, the union of its last copy with the survivors' newer folders
may hold no checkpoint that is complete, while an older snapshot does: the job resumes from the
newest snapshot in which every checkpoint folder holds a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["METADATA", "missing", "newest_usable", "usable"]

METADATA = ".metadata"
CHECKPOINT = re.compile(r"ckpt-(\d+)")
MARKER = re.compile(r"complete-(\d+)\.json")
#: A marker is a few hundred bytes (a line per file it lists): more is not one.
MAX_MARKER_BYTES = 1 << 20


def _size(path: Path) -> int | None:
    """The size of `path` when it is a regular file (never through a link), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _markers(path: Path) -> dict[int, dict[str, Any]]:
    """The readable markers in checkpoint folder `path`, by the rank in their name."""
    found: dict[int, dict[str, Any]] = {}
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return found
    for name in names:
        m = MARKER.fullmatch(name)
        size = _size(path / name)
        if m is None or size is None or size > MAX_MARKER_BYTES:
            continue
        try:
            data = json.loads((path / name).read_bytes())
        except (OSError, ValueError):
            continue  # unreadable: as if absent
        if isinstance(data, dict):
            found[int(m[1])] = data
    return found


def _writers(marker: dict[str, Any]) -> set[int]:
    writers = marker.get("writers")
    if not isinstance(writers, list):
        return set()
    return {w for w in writers if isinstance(w, int) and not isinstance(w, bool) and w >= 0}


def missing(path: Path) -> str | None:
    """What the checkpoint in folder `path` lacks to be loaded, from its markers and the sizes
    of its files (None: nothing). Reads nothing but the markers; raises nothing."""
    markers = _markers(path)
    writers = set().union(*(_writers(m) for m in markers.values()))
    if not writers:
        return f"{path.name} lacks a complete-*.json marker (its save did not finish)"
    gaps = []
    if _size(path / METADATA) is None:
        gaps.append(f"{METADATA} (written on global rank 0's node)")
    absent = sorted(writers - markers.keys())
    if absent:
        nodes = ", ".join(str(w) for w in absent)
        gaps.append(f"the marker and shards of the node(s) of rank(s) {nodes}")
    saves = {str(m["save"]) for m in markers.values() if "save" in m}
    if len(saves) > 1:
        return f"{path.name} mixes the shards of {len(saves)} different saves"
    if not gaps:
        lost = sorted(
            str(name)
            for m in markers.values()
            if isinstance(m.get("files"), dict)
            for name, size in m["files"].items()
            if not _plain(name) or _size(path / str(name)) != size
        )
        if METADATA in lost:
            lost.remove(METADATA)
            gaps.append(f"a readable {METADATA} (not the size its marker gives)")
        if lost:
            gaps.append(f"shard file(s) {', '.join(lost)}")
    return f"{path.name} lacks {' and '.join(gaps)}" if gaps else None


def _plain(name: object) -> bool:
    """A file name in the folder itself, not a path elsewhere."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name


def _roots(snapshot: Path) -> Iterable[Path]:
    """The folders under `snapshot` (itself included) that hold ``ckpt-*`` folders."""
    for folder, dirs, _ in os.walk(snapshot):  # os.walk follows no link to a folder
        if any(CHECKPOINT.fullmatch(d) for d in dirs):
            yield Path(folder)
        dirs[:] = [d for d in dirs if not CHECKPOINT.fullmatch(d)]


def usable(snapshot: Path) -> bool:
    """Whether every folder of sharded checkpoints in `snapshot` holds a complete one (a
    snapshot with none at all is usable: it has nothing sharded to be incomplete)."""
    for root in _roots(snapshot):
        names = [d for d in os.listdir(root) if CHECKPOINT.fullmatch(d)]
        if all(missing(root / name) is not None for name in names):
            return False
    return True


def newest_usable(snapshots: Iterable[Path]) -> Path | None:
    """The newest of `snapshots` (given oldest first) that is `usable`; None when none is."""
    for snapshot in reversed(list(snapshots)):
        if usable(snapshot):
            return snapshot
    return None
