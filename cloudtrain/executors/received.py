"""What comes back from a node is untrusted: the one place that says what of it is kept.

A node's files are written by whoever runs there: the training script, any job before it, a
user of the node's machine. A copy from a node (`Executor.get`: checkpoints, FSDP shards) or
from a bucket keeps only what a checkpoint is made of, and nothing that could act on this
machine or reach back into the user's files:

=====================  =====================================================================
what arrives           what is kept
=====================  =====================================================================
a regular file         the file, private (0600), its bytes counted against `limit`
a folder               the folder, private (0700), walked from the top down
a symlink              nothing: never kept, never followed (``creds -> ../../../../secret``
                       would otherwise make the user's own files part of a snapshot, which
                       ``--resume-from`` and a managed recovery upload to the nodes)
a device, FIFO, socket nothing (opening one could block or read a device)
a save in progress     nothing: a file or folder named as `IN_PROGRESS` says (a save's temp,
                       renamed into place once whole): only whole checkpoints travel
more than `limit`      the copy is stopped and refused (`NodeDataError`): the copy and the
bytes in all           snapshots made before it stand
=====================  =====================================================================

Snapshots are made from such a copy by hard links (`link_tree`), which again take regular
files only. ``$CLOUDTRAIN_MAX_PULL_GB`` sets the bound (default 256 GB).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import stat
import subprocess
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, cast

from cloudtrain.errors import ConfigError, NodeDataError

LIMIT_ENV = "CLOUDTRAIN_MAX_PULL_GB"
DEFAULT_LIMIT_GB = 256
#: How often a running copy's size is read while it runs.
POLL_S = 0.2
_CHUNK = 1 << 20
#: What a node is still writing, never copied from it: a save's temp file or folder (the
#: runtime's ``.digits.pt.XXXX.tmp`` and ``.ckpt-N.tmp/``, torch's and most tools' ``*.tmp``)
#: and a copy's own (`copy_if_changed`). Matched against each name, as rsync's ``--exclude``.
IN_PROGRESS = ("*.tmp", "*.cloudtrain-tmp")
#: Open a node's file to read it: never through a link, never blocking on a FIFO.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def limit() -> int:
    """The most bytes one copy from a node may hold: ``$CLOUDTRAIN_MAX_PULL_GB`` (a positive
    number, `ConfigError` otherwise), default 256 GB."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_LIMIT_GB * 10**9
    try:
        gb = float(text)
    except ValueError:
        gb = -1.0
    if not 0 < gb < 1e9:
        raise ConfigError(f"{LIMIT_ENV}={text!r}: use a positive number of GB, e.g. 500")
    return int(gb * 10**9)


def in_progress(name: str) -> bool:
    """Whether the file or folder `name` is a save still being written (`IN_PROGRESS`)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in IN_PROGRESS)


def regular_files(tree: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Each regular file below `tree` (its path inside, with '/') with its `lstat`, walked
    without following any link; nothing when `tree` is no folder or is a link."""
    for dirpath, _, filenames, dirfd in os.fwalk(tree, follow_symlinks=False):
        rel_dir = Path(dirpath).relative_to(tree)
        for name in filenames:
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield (rel_dir / name).as_posix(), st


def size(tree: Path) -> int:
    """The bytes of the regular files below `tree`."""
    return sum(st.st_size for _, st in regular_files(tree))


def scrub(tree: Path) -> list[str]:
    """Make `tree` hold only private regular files and folders: remove anything else (never
    following a link), tighten looser modes; the paths removed (inside `tree`). Raises
    `NodeDataError` when its files hold more than `limit()` bytes."""
    removed: list[str] = []
    total, bound = 0, limit()
    for dirpath, dirnames, filenames, dirfd in os.fwalk(tree, follow_symlinks=False):
        rel_dir = Path(dirpath).relative_to(tree)
        os.chmod(dirfd, 0o700)
        folders = []
        for name in [*dirnames, *filenames]:
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                folders.append(name)
            elif not stat.S_ISREG(st.st_mode):
                os.unlink(name, dir_fd=dirfd)
                removed.append((rel_dir / name).as_posix())
            else:
                total += st.st_size
                if stat.S_IMODE(st.st_mode) & 0o177:
                    _private(name, dirfd)
        dirnames[:] = folders
    if total > bound:
        raise NodeDataError(too_large(tree, bound))
    return removed


def _private(name: str, dirfd: int) -> None:
    """chmod 0600 of the file `name` in `dirfd`, never through a link (Linux has no lchmod)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=dirfd)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def too_large(tree: Path, bound: int) -> str:
    return (
        f"the copy into {tree} passed {bound / 1e9:g} GB; refused, and what was kept before "
        f"it stands (raise {LIMIT_ENV} if the checkpoint is really that large)"
    )


def _is(kind: Callable[[int], bool], name: str, dirfd: int) -> bool:
    """Whether `name` in `dirfd` is of `kind` (``stat.S_ISDIR``…) itself, not through a link
    (`os.fwalk` lists a link to a folder among the folders, though it does not enter it)."""
    try:
        return kind(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def link_tree(source: Path, target: Path, *, keep_existing: bool = False) -> None:
    """Make `target` hold `source`'s folders (0700) and hard links to its regular files,
    never following a link; a file already in `target` stays when `keep_existing`, else it
    is an error."""
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    for dirpath, dirnames, filenames, dirfd in os.fwalk(source, follow_symlinks=False):
        rel_dir = Path(dirpath).relative_to(source)
        dirnames[:] = [d for d in dirnames if _is(stat.S_ISDIR, d, dirfd)]
        for name in dirnames:
            (target / rel_dir / name).mkdir(mode=0o700, exist_ok=True)
        for name in filenames:
            dest = target / rel_dir / name
            if not _is(stat.S_ISREG, name, dirfd):
                continue
            if keep_existing and os.path.lexists(dest):
                continue
            os.link(name, dest, src_dir_fd=dirfd, follow_symlinks=False)


def copy_tree(source: Path, target: Path) -> bool:
    """Make `target` a copy of the folder `source` (a node's folder on this machine): only
    regular files and folders, a file copied only when its size or mtime differ (rsync's
    quick check) and as a new file (a hard link to the old one keeps it), what `source` no
    longer has removed; nothing `in_progress`. False, and nothing done, when `source` is no
    folder or is a link. `NodeDataError` past `limit()` bytes."""
    try:
        if not stat.S_ISDIR(os.lstat(source).st_mode):
            return False
    except FileNotFoundError:
        return False
    bound, total = limit(), 0
    wanted: set[str] = {"."}
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    for dirpath, dirnames, filenames, dirfd in os.fwalk(source, follow_symlinks=False):
        rel_dir = Path(dirpath).relative_to(source)
        (target / rel_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        wanted.add(rel_dir.as_posix())
        dirnames[:] = [d for d in dirnames if not in_progress(d)]
        for name in filenames:
            if in_progress(name):
                continue
            try:
                fd = os.open(name, _READ, dir_fd=dirfd)
            except OSError:  # a symlink (ELOOP), gone, or unreadable: not copied
                continue
            with os.fdopen(fd, "rb") as src:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                total += st.st_size
                if total > bound:
                    raise NodeDataError(too_large(target, bound))
                rel = (rel_dir / name).as_posix()
                wanted.add(rel)
                copy_if_changed(src, st, target / rel, budget=bound - total + st.st_size)
    remove_stale(target, wanted)
    return True


def copy_if_changed(
    src: IO[bytes], st: os.stat_result, dest: Path, *, budget: int, mode: int = 0o600
) -> None:
    """Copy the open file `src` (whose `fstat` is `st`) to `dest` unless their sizes and
    mtimes agree (rsync's quick check, to the nanosecond: a checkpoint saved again within the
    same second, at the same size, is a new one), as a new file (a hard link to the old one
    keeps it) made `mode`, with `src`'s mtime; `NodeDataError` when more than `budget` bytes
    come."""
    try:
        dt = os.lstat(dest)
        if stat.S_ISREG(dt.st_mode) and (dt.st_size, dt.st_mtime_ns) == (
            st.st_size,
            st.st_mtime_ns,
        ):
            return
    except FileNotFoundError:
        pass
    tmp = dest.with_name(f".{dest.name}.cloudtrain-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, mode)
    with os.fdopen(fd, "wb") as out:
        try:
            copied = 0
            while chunk := src.read(_CHUNK):
                copied += len(chunk)
                if copied > budget:  # it grew while it was copied
                    raise NodeDataError(too_large(dest.parent, limit()))
                out.write(chunk)
        except BaseException:  # too large, or a read that failed (an archive cut short)
            tmp.unlink(missing_ok=True)
            raise
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, dest)


def remove_stale(target: Path, wanted: set[str]) -> None:
    """Delete what an earlier copy made below `target` and the source no longer has (rsync
    ``--delete``): whatever is not in `wanted` (paths inside, with '/'; "." for the top)."""
    for dirpath, dirnames, filenames, dirfd in os.fwalk(target, topdown=False):
        rel_dir = Path(dirpath).relative_to(target)
        for name in filenames:
            if (rel_dir / name).as_posix() not in wanted:
                os.unlink(name, dir_fd=dirfd)
        for name in dirnames:
            if (rel_dir / name).as_posix() not in wanted:
                shutil.rmtree(Path(dirpath) / name, ignore_errors=True)


def untar(archive: Path, target: Path) -> None:
    """Make `target` a copy of the folder packed in the tar file `archive` (a node's), read as
    a stream, as `copy_tree` makes one: only regular files and folders, private, a file
    written only when its size or mtime differ and as a new file, nothing `in_progress`, no
    link made or followed, what the archive does not name removed once it was read whole.
    `NodeDataError` for a name that is no plain path inside, an archive cut short or corrupt
    (nothing is removed then), or past `limit()` bytes."""
    bound, total = limit(), 0
    wanted, files = {"."}, set[str]()
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    scrub(target)  # a copy made before these rules held may keep a link
    try:
        with tarfile.open(archive, "r|") as tar:
            for member in tar:
                parts = _parts(archive, member.name, files)
                rel = "/".join(parts) or "."
                if not (member.isreg() or member.isdir()) or any(map(in_progress, parts)):
                    continue  # a link, device or FIFO; a save in progress
                if rel in wanted and (rel in files) != member.isreg():
                    raise NodeDataError(f"{archive}: {member.name!r} is both a file and a folder")
                folder = parts if member.isdir() else parts[:-1]
                for sub in ("/".join(folder[: i + 1]) for i in range(len(folder))):
                    if sub not in wanted:
                        _make_way(target / sub, folder=True)
                        wanted.add(sub)
                if not member.isreg():
                    continue
                total += member.size
                if member.size < 0 or total > bound:
                    raise NodeDataError(too_large(target, bound))
                files.add(rel)
                wanted.add(rel)
                _make_way(target / rel, folder=False)
                ns = int(member.mtime * 10**9) if 0 <= member.mtime < 2**34 else 0
                times = {"st_atime_ns": ns, "st_mtime_ns": ns}
                st = os.stat_result((0o100600, 0, 0, 1, 0, 0, member.size, 0, 0, 0), times)
                src = cast(IO[bytes], tar.extractfile(member))  # a regular file's: never None
                copy_if_changed(src, st, target / rel, budget=bound - total + member.size)
            # A header cut short or garbled ends `tar` quietly: the end block must follow it.
            with open(archive, "rb") as raw:
                raw.seek(tar.offset)
                if raw.read(tarfile.BLOCKSIZE) != bytes(tarfile.BLOCKSIZE):
                    raise tarfile.ReadError("no end-of-archive block")
    except (tarfile.TarError, EOFError) as e:
        raise NodeDataError(f"{archive} is cut short or corrupt ({e}); nothing removed") from e
    remove_stale(target, wanted)


def _parts(archive: Path, name: str, files: set[str]) -> list[str]:
    """The components of the tar member `name` (none for the folder packed itself), a leading
    ``./`` dropped; `NodeDataError` unless it is a relative path below no file of `files`."""
    rel = name
    while rel.startswith("./"):
        rel = rel[2:]
    parts = [] if rel == "." else rel.split("/")
    bad = any(p in ("", ".", "..") for p in parts) or any(c < " " or c == "\x7f" for c in rel)
    if bad or any("/".join(parts[:i]) in files for i in range(1, len(parts))):
        raise NodeDataError(f"{archive}: {name!r} is no plain path inside the folder it packs")
    return parts


def _make_way(path: Path, *, folder: bool) -> None:
    """Make `path` a folder (0700) when `folder`, else free it for a file: what an earlier
    copy left there of the other kind is removed, never through a link."""
    with contextlib.suppress(FileNotFoundError):
        if not folder and stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        elif folder and not stat.S_ISDIR(os.lstat(path).st_mode):
            path.unlink()
    if folder:
        path.mkdir(mode=0o700, exist_ok=True)


def run_bounded(argv: Sequence[str], tree: Path, *, timeout: float) -> tuple[int, str]:
    """Run the copy `argv` (rsync) into `tree`, stopping it once `tree` holds more than
    `limit()` bytes (`NodeDataError`) or after `timeout` s (`subprocess.TimeoutExpired`); its
    exit status and the last lines it printed (a node may make it print without end: only a
    tail is kept)."""
    bound = limit()
    deadline = time.monotonic() + timeout
    tail: deque[str] = deque(maxlen=20)
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    reader = threading.Thread(target=lambda: tail.extend(ln[:500] for ln in proc.stdout or ()))
    reader.start()
    try:
        while proc.poll() is None:
            if size(tree) > bound:
                raise NodeDataError(too_large(tree, bound))
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(list(argv), timeout)
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join()
        if proc.stdout is not None:
            proc.stdout.close()
    return proc.returncode, "".join(tail)


#: The most of one node's log a copy at home keeps (`log_copy`).
LOG_MAX = 256 << 20


class _Full(Exception):
    """A log copy reached its bound: the command feeding it is stopped."""


@contextlib.contextmanager
def log_copy(path: Path, limit: int = LOG_MAX) -> Iterator[Callable[[str], None]]:
    """A writer of a node's log lines to `path` (0600), as a streamed command's `on_output`:
    past `limit` bytes it raises, which stops the command, and the copy ends with a line
    saying where it was cut. A copy that got no line is removed."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", errors="replace") as out:

        def write(line: str) -> None:
            nonlocal written
            written += len(line) + 1
            if written > limit:
                raise _Full
            out.write(line + "\n")

        try:
            yield write
        except _Full:
            out.write(f"[cloudtrain: the copy of this log was cut here, at {limit >> 20} MB]\n")
    if written == 0:
        path.unlink(missing_ok=True)
