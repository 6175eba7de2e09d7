"""Checkpoints that outlive their nodes, kept on the user's machine.

A job's checkpoints are what its scripts write to ``CLOUDTRAIN_CHECKPOINT_DIR`` (by default
``<node root>/checkpoints``; `runtime.save_checkpoint`). The head node's folder (rank 0's, the
one writer of a DDP job) is copied to ``$CLOUDTRAIN_HOME/checkpoints/<job>/`` while the job is
followed, when it ends and before `down`::

    <job>/.incoming/        the copy being brought up to date: only what changed moves
    <job>/<ms since epoch>/ a whole snapshot of it, made by hard links once a copy finished
                            (a file the next copy changes is a new file: the link keeps the old)

so the newest snapshot is never a half-copied one, and `KEEP` of them are kept. A later job,
on any cluster, starts from the newest of them with ``train --resume-from JOB``: every node gets
it in its checkpoint folder before the job starts, and `runtime.load_checkpoint` finds it.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from cloudtrain.errors import NotFoundError
from cloudtrain.executors.base import Executor

#: How many snapshots of a job are kept.
KEEP = 2
CHECKPOINT_ENV = "CLOUDTRAIN_CHECKPOINT_DIR"


def node_folder(root: str, override: str | None) -> str:
    """A node's checkpoint folder: the job's ``CLOUDTRAIN_CHECKPOINT_DIR``, else its root's."""
    return override or f"{root}/checkpoints"


def _listing(folder: Path) -> list[tuple[str, int, int]]:
    found = []
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            st = (Path(dirpath) / name).stat()
            rel = (Path(dirpath) / name).relative_to(folder).as_posix()
            found.append((rel, st.st_size, st.st_mtime_ns))
    return sorted(found)


class Kept:
    """The checkpoints of one job kept under cloudtrain's home."""

    def __init__(self, home: Path, job_id: str) -> None:
        self.job_id = job_id
        self.folder = home / "checkpoints" / job_id

    def snapshots(self) -> list[Path]:
        """The whole snapshots, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted((p for p in self.folder.iterdir() if p.name.isdigit()),
                      key=lambda p: int(p.name))  # fmt: skip

    def newest(self) -> Path | None:
        found = self.snapshots()
        return found[-1] if found else None

    def pull(self, ex: Executor, remote: str) -> Path | None:
        """Bring the copy up to date from the node's folder `remote`, then keep a snapshot
        of it unless it equals the newest. The newest snapshot; None when there is none (the
        node's folder does not exist or is empty)."""
        incoming = self.folder / ".incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        if not ex.get(remote, incoming) or not any(incoming.iterdir()):
            return self.newest()
        newest = self.newest()
        if newest is not None and _listing(newest) == _listing(incoming):
            return newest
        name = str(time.time_ns() // 1_000_000)
        tmp = self.folder / f".{name}.tmp"
        shutil.copytree(incoming, tmp, copy_function=os.link)
        snapshot = self.folder / name
        os.replace(tmp, snapshot)
        for old in self.snapshots()[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
        return snapshot

    def required(self) -> Path:
        """The newest snapshot, or `NotFoundError` saying there is none."""
        newest = self.newest()
        if newest is None:
            raise NotFoundError(
                f"job {self.job_id} has no checkpoint kept here ({self.folder}): it wrote none "
                "to CLOUDTRAIN_CHECKPOINT_DIR, or it was not followed to its end"
            )
        return newest
