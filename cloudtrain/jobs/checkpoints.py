"""Checkpoints that outlive their nodes, kept on the user's machine.

A job's checkpoints are what its scripts write to ``CLOUDTRAIN_CHECKPOINT_DIR`` (by default
``<node root>/checkpoints/<job>``, the job's own: a new job on the same cluster starts afresh, not
from the weights of the one before it, and its snapshots hold none of that one's files;
`runtime.save_checkpoint`). The head node's folder (rank 0's, the
one writer of a DDP job) is copied to ``$CLOUDTRAIN_HOME/checkpoints/<job>/`` while the job is
followed, when it ends and before `down`::

    <job>/.incoming/        the copy being brought up to date: only what changed moves
    <job>/<ms since epoch>/ a whole snapshot of it, made by hard links once a copy finished
                            (a file the next copy changes is a new file: the link keeps the old)

so the newest snapshot is never a half-copied one, and `keep` of them are kept (the task's
``checkpoint_keep``, default `KEEP`). A later job, on any cluster, starts from the newest of them
with ``train --resume-from JOB``: every node gets it in its checkpoint folder before the job
starts, and `runtime.load_checkpoint` finds it.

With a bucket (the task's ``checkpoint: SCHEME://BUCKET/PREFIX``, `cloudtrain.jobs.buckets`), each
new snapshot is pushed there from this machine as well (``<job>/.pushed`` names the last one
pushed, so a push that failed is tried again after the next pull), and a job resumed from one
that this home keeps nothing of has the bucket's newest complete snapshot restored first.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, overload

from cloudtrain.errors import CloudtrainError, NodeDataError, NotFoundError
from cloudtrain.executors import received
from cloudtrain.executors.base import Executor
from cloudtrain.jobs import shards
from cloudtrain.spec import validate_checkpoint_keep

if TYPE_CHECKING:
    from cloudtrain.jobs.buckets import Bucket, Pushed

#: How many snapshots of a job are kept.
KEEP = 2
CHECKPOINT_ENV = "CLOUDTRAIN_CHECKPOINT_DIR"


@overload
def bucket_of(url: str) -> Bucket: ...
@overload
def bucket_of(url: None) -> None: ...
def bucket_of(url: str | None) -> Bucket | None:
    """The bucket of a job's ``checkpoint_url`` (None: none), with boto3 at hand; a bad URL
    or a missing boto3 is a `ConfigError` (nothing is called)."""
    if url is None:
        return None
    from cloudtrain.jobs.buckets import Bucket

    bucket = Bucket(url)
    bucket.check()
    return bucket


def node_folder(root: str, job_id: str, override: str | None) -> str:
    """A node's checkpoint folder for `job_id`: the job's ``CLOUDTRAIN_CHECKPOINT_DIR``, else
    the job's own under the node's root (every attempt of the job, restarts and recoveries
    included, finds it; another job does not)."""
    return override or f"{root}/checkpoints/{job_id}"


def _get(ex: Executor, remote: str, copy: Path) -> bool:
    """`ex.get` into `copy`; a copy refused past the bound (`NodeDataError`) is removed, so
    that what came before the refusal is never kept nor counted against the next copy."""
    try:
        return ex.get(remote, copy)
    except NodeDataError:
        shutil.rmtree(copy, ignore_errors=True)
        raise


def _listing(folder: Path) -> list[tuple[str, int, int]]:
    return sorted((rel, st.st_size, st.st_mtime_ns) for rel, st in received.regular_files(folder))


def age(snapshot: Path, at: float) -> float:
    """How old, at `at` (seconds since the epoch), the checkpoint in `snapshot` is: from the
    newest of its files as the node wrote it (the copies keep the node's times), else from when
    the snapshot was kept. A snapshot is taken after the files in it were written, so a newer
    time (a node whose clock runs ahead) counts as 0 s."""
    times = [st.st_mtime_ns for _, st in received.regular_files(snapshot)]
    written = max(times) / 1e9 if times else int(snapshot.name) / 1000
    return max(0.0, at - written)


class Kept:
    """The checkpoints of one job kept under cloudtrain's home; the `keep` newest of them
    (a whole number, 1 or more: else `ConfigError`)."""

    def __init__(self, home: Path, job_id: str, *, keep: int = KEEP) -> None:
        self.job_id = job_id
        self.folder = home / "checkpoints" / job_id
        self.keep = validate_checkpoint_keep(keep)

    def snapshots(self) -> list[Path]:
        """The whole snapshots, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(
            (p for p in self.folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )

    def newest(self) -> Path | None:
        found = self.snapshots()
        return found[-1] if found else None

    def pull(self, ex: Executor, remote: str) -> Path | None:
        """Bring the copy up to date from the node's folder `remote`, then keep a snapshot
        of it unless it equals the newest. The newest snapshot; None when there is none (the
        node's folder does not exist or is empty)."""
        incoming = self.folder / ".incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        if not _get(ex, remote, incoming) or not any(incoming.iterdir()):
            return self.newest()
        return self._keep(incoming)

    def pull_sharded(
        self,
        sources: Sequence[tuple[int, Executor, str]],
        on_error: Callable[[int, Exception], None],
    ) -> Path | None:
        """A sharded job's checkpoints (FSDP): each node's folder holds its own ranks' shards.
        Each of `sources` (node index, executor, folder) is copied to ``.parts/<index>/``,
        where a node that cannot be read (`on_error` is told) keeps its last copy, and the
        union of all parts (the first source's file where two hold one path) is what the
        snapshot is made of: the whole checkpoint, which DCP reshards on load."""
        parts = self.folder / ".parts"
        for index, ex, remote in sources:
            part = parts / str(index)
            part.mkdir(parents=True, exist_ok=True)
            try:
                _get(ex, remote, part)
            except (CloudtrainError, OSError) as exc:
                on_error(index, exc)
        union = self.folder / ".union"
        shutil.rmtree(union, ignore_errors=True)
        order = [str(i) for i, _, _ in sources]
        known = sorted(
            (p for p in parts.iterdir() if p.is_dir()),
            key=lambda p: (order.index(p.name) if p.name in order else len(order), p.name),
        )
        for part in known:
            received.link_tree(part, union, keep_existing=True)
        if not union.is_dir() or not any(union.iterdir()):
            return self.newest()
        return self._keep(union, spare=shards.newest_usable)

    def _keep(self, copy: Path, spare: Callable[[list[Path]], Path | None] | None = None) -> Path:
        """A snapshot of `copy` (hard links) unless it equals the newest; the newest. Then
        the `keep` newest are kept, and the one `spare` picks among them all (a sharded job's
        newest whole checkpoint, which newer snapshots that lack a lost node's shards must
        not push out)."""
        newest = self.newest()
        if newest is not None and _listing(newest) == _listing(copy):
            return newest
        ms = time.time_ns() // 1_000_000  # after the newest, even within its millisecond
        name = str(max(ms, int(newest.name) + 1) if newest is not None else ms)
        tmp = self.folder / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # left by a process killed while making it
        received.link_tree(copy, tmp)
        snapshot = self.folder / name
        os.replace(tmp, snapshot)
        found = self.snapshots()
        kept = spare(found) if spare is not None else None  # a sharded job's newest whole one
        for old in found[: -self.keep]:
            if old == kept:
                continue
            shutil.rmtree(old, ignore_errors=True)
        return snapshot

    def required(self, bucket: Bucket | None = None) -> Path:
        """The newest snapshot; when none is kept here, the newest complete one of `bucket`,
        restored first (blocks for the download). `NotFoundError` when neither has one."""
        newest = self.newest()
        if newest is None and bucket is not None:
            newest = bucket.restore(self.job_id, self.folder)
            if newest is not None:
                self._pushed().write_text(newest.name)
        if newest is None:
            also = f" nor in {bucket}" if bucket is not None else ""
            raise NotFoundError(
                f"job {self.job_id} has no checkpoint kept here ({self.folder}){also}: it "
                "wrote none to CLOUDTRAIN_CHECKPOINT_DIR, or it was not followed to its end"
            )
        return newest

    def push(self, bucket: Bucket, *, sharded: bool = False) -> Pushed | None:
        """Push the newest snapshot (`sharded`: the newest that holds a checkpoint complete
        on every rank, `shards.newest_usable`) to `bucket` unless it was pushed already (then
        prune the bucket to `keep`); None when there was nothing to push. Blocks for the
        upload; raises what `Bucket.push` raises (the snapshot stays unpushed, and the next
        call tries it)."""
        newest = shards.newest_usable(self.snapshots()) if sharded else self.newest()
        marker = self._pushed()
        if newest is None or (marker.is_file() and marker.read_text() == newest.name):
            return None
        done = bucket.push(self.job_id, newest, keep=self.keep)
        marker.write_text(newest.name)
        return done

    def _pushed(self) -> Path:
        return self.folder / ".pushed"
