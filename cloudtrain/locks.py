"""One writer per cluster: an exclusive lock that `up`, `down` and job submission hold.

The lock is ``flock(2)`` on ``<home>/locks/<cluster>.lock`` (0600 in a 0700 folder). The kernel
releases it when its holder exits, however it exits (a crash or a kill leaves no stale lock to
clean). The holder writes its pid and what it does into the file, so a second command that
must wait can say for whom; it waits up to ``$CLOUDTRAIN_LOCK_TIMEOUT_S`` (default 900 s) and
then raises `ClusterBusyError`. The cluster's name is checked first: it becomes a path.
"""

from __future__ import annotations

import fcntl
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cloudtrain.errors import ClusterBusyError, ConfigError
from cloudtrain.node import procs
from cloudtrain.spec import validate_name

TIMEOUT_ENV = "CLOUDTRAIN_LOCK_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 900.0
POLL_S = 0.1


def timeout_s() -> float:
    """The wait from ``$CLOUDTRAIN_LOCK_TIMEOUT_S`` (seconds, >= 0), else the default."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{TIMEOUT_ENV} {raw!r} is not a number of seconds (>= 0)")
    return value


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 200).decode(errors="replace").strip()
    return text or "another cloudtrain command"


@contextmanager
def cluster_lock(
    home: Path,
    cluster: str,
    what: str,
    *,
    wait_s: float | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold `cluster`'s lock for the block. When another process holds it, say so once
    through `on_wait` and wait up to `wait_s` (default `timeout_s()`); then raise
    `ClusterBusyError` naming the holder. Raises `ConfigError` for a name that is not a
    cluster name."""
    validate_name(cluster, "cluster")
    limit = timeout_s() if wait_s is None else wait_s
    fd = os.open(_path(home, cluster), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _acquire(fd, cluster, limit, on_wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({what})".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _path(home: Path, key: str) -> Path:
    folder = home / "locks"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / f"{key}.lock"


@contextmanager
def held_if_free(home: Path, key: str) -> Iterator[bool]:
    """Hold the lock `key` (``<home>/locks/<key>.lock``, with this pid in it) for the block if
    no other process holds it; never waits. Yields whether this process holds it (one
    managed job's watcher: ``watch-<job>``). `key` must be checked by the caller."""
    with procs.held_if_free(_path(home, key)) as mine:
        yield mine


def holder(home: Path, key: str) -> int | None:
    """The pid holding the lock `key` (-1 when it wrote none yet), or None when it is free."""
    with held_if_free(home, key) as mine:
        if mine:
            return None
    text = _path(home, key).read_text().strip()
    return int(text) if text.isdigit() else -1


def _acquire(fd: int, cluster: str, limit: float, on_wait: Callable[[str], None] | None) -> None:
    deadline = time.monotonic() + limit
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _holder(fd)
        if time.monotonic() >= deadline:
            raise ClusterBusyError(
                cluster,
                f"cluster {cluster!r} is busy: {holder} holds it; gave up after "
                f"{limit:.0f} s (set {TIMEOUT_ENV} to wait longer)",
            )
        if not told and on_wait is not None:
            on_wait(f"cluster {cluster!r} is busy: {holder} holds it; waiting up to {limit:.0f} s")
            told = True
        time.sleep(POLL_S)
