"""`saves.marker`: a node's save marker read through a real executor, with the node's file
treated as untrusted (bounded, and anything but a marker reads as none)."""

from __future__ import annotations

import json
from pathlib import Path

from cloudtrain.executors.local import LocalExecutor
from cloudtrain.jobs import saves


def test_the_marker_is_read_and_a_huge_or_odd_file_is_no_marker(tmp_path: Path) -> None:
    ex = LocalExecutor()
    progress = tmp_path / "progress.json"
    assert saves.marker(ex, str(tmp_path)) is None  # no save yet
    progress.write_text(json.dumps({"step": 7, "saved": {"step": 5, "at": 1.0, "count": 2}}))
    assert saves.marker(ex, str(tmp_path)) == {"step": 5, "at": 1.0, "count": 2}
    for odd in ('{"saved": 3}', "[1, 2]", "not json"):
        progress.write_text(odd)
        assert saves.marker(ex, str(tmp_path)) is None
    big = {"saved": {"step": 1}, "pad": "x" * (4 * saves.MARKER_BYTES)}
    progress.write_text(json.dumps(big))  # a node that lies: cut at the bound, no marker
    assert saves.marker(ex, str(tmp_path)) is None
