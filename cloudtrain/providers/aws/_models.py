"""botocore's API models, kept parsed on disk: a new process builds its EC2 client without
reading JSON.

botocore reads the model of a service from its data files each time a process builds its
first client of that service: EC2's is 0.55 MB gzipped, 5 MB of JSON, and with the endpoint
table about 0.1 s of the 0.16 s a client costs here (most of `up`'s fixed cost beyond what the
bare SDK pays, `bench/aws_scale.py`). `CachedModels` is botocore's own file loader with a cache
in front: a data file larger than ``SMALLEST`` is kept as ``marshal`` (Python's own format
for its bytecode: plain dicts, lists and strings load ≈5× faster than JSON is parsed) under
``<home>/cache/botocore/``, and read from there while the file it came from is unchanged.

A cache file names the data file's path, size and modification time, the Python that wrote
it, and a digest of its body keyed with a secret of this home (``<folder>/key``, 32 random
bytes, 0600: BLAKE2b's keyed mode, a MAC): a file that differs in any of them, that cannot
be read, or that is not this user's, is a miss: the JSON is read, as without a cache, and
written over it (atomically: a crash or two processes at once leave an old whole file or a
new one). Someone who can write the folder but not read the key cannot make a file that
passes; a folder another user owns or can write is refused (`ConfigError`) before any use,
and a key that is not this user's alone is replaced (every file keyed with it is then a
miss). botocore's loader gives ``OrderedDict``s; this gives plain dicts, which keep their
order too, and botocore builds its own ordered maps from either.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import marshal
import os
import struct
import sys
from pathlib import Path
from stat import S_IMODE, S_ISREG
from typing import Any

log = logging.getLogger(__name__)

#: Data files smaller than this are parsed as they are (fast enough; no file per model).
SMALLEST = 64 * 1024
#: The cache file's format; with the Python that wrote it (marshal's format is its own).
VERSION = f"cloudtrain-models 2 {sys.implementation.cache_tag} {marshal.version}".encode()
_DIGEST = 32
#: The secret the digests are keyed with, in the cache's folder.
KEY_FILE = "key"
_HEADER = struct.Struct(f"<{len(VERSION)}sQQ{_DIGEST}s")


def _source(file_path: str) -> Path | None:
    """The data file botocore would read for `file_path` (which has no extension)."""
    for ext in (".json", ".json.gz"):
        path = Path(file_path + ext)
        if path.is_file():
            return path
    return None


def secret(folder: Path) -> bytes:
    """The key of `folder`'s digests: made on first use (published with one ``link(2)``: the
    first process wins, the others read it); one that is not a 0600 regular file of this
    user's, or not 32 bytes, is replaced with a new one (someone else may know it)."""
    path = folder / KEY_FILE
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            _publish(path, os.urandom(_DIGEST), replace=False)
            continue
        except OSError:  # a symlink in its place
            fd = -1
        if fd >= 0:
            with os.fdopen(fd, "rb") as f:
                found = os.fstat(f.fileno())
                mine = S_ISREG(found.st_mode) and found.st_uid == os.getuid()
                if mine and not S_IMODE(found.st_mode) & 0o077:
                    key = f.read(_DIGEST + 1)
                    if len(key) == _DIGEST:
                        return key
        log.info("replacing the cache key %s: not a private file of this user's", path)
        _publish(path, os.urandom(_DIGEST), replace=True)
    raise OSError(f"cannot keep a key at {path}")


def _publish(path: Path, key: bytes, *, replace: bool) -> None:
    from cloudtrain.access import atomic_write

    if replace:
        atomic_write(path, key, 0o600)
        return
    made = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        with contextlib.suppress(FileExistsError):  # another process's won: it is read next
            os.link(made, path)
    finally:
        made.unlink()


def file_loader(folder: Path) -> Any:
    """botocore's JSON file loader with the cache of this module under `folder`. Raises
    `ConfigError` when `folder` or the one above it (``<home>/cache``) is another user's or
    writable by others (`cloudtrain.access.private_folder`); one that cannot be made only
    costs the JSON."""
    from botocore.loaders import JSONFileLoader

    from cloudtrain.access import private_folder

    try:
        private_folder(folder, "cache folder")
        private_folder(folder.parent, "cache folder", tighten=False)  # <home>/cache
        key = secret(folder)
    except OSError as exc:  # no key, no cache: botocore reads its JSON
        log.info("not keeping botocore's models in %s: %s", folder, exc)
        return JSONFileLoader()

    class CachedModels(JSONFileLoader):  # type: ignore[misc]  # botocore has no types
        def load_file(self, file_path: str) -> Any:
            source = _source(file_path)
            if source is None:
                return None
            stat = source.stat()
            if stat.st_size < SMALLEST:
                return super().load_file(file_path)
            cached = folder / f"{hashlib.sha256(str(source).encode()).hexdigest()[:32]}.marshal"
            found = read(cached, stat, key)
            if found is not None:
                return found
            data = super().load_file(file_path)
            if data is not None:
                write(cached, stat, data, key)
            return data

    return CachedModels()


def read(path: Path, stat: os.stat_result, key: bytes) -> Any:
    """The model kept at `path` for a data file of `stat`, or None (absent, stale, damaged,
    another user's, or not sealed with `key`)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                return None
            blob = f.read()
    except OSError:
        return None
    if len(blob) < _HEADER.size:
        return None
    version, size, mtime, digest = _HEADER.unpack_from(blob)
    body = memoryview(blob)[_HEADER.size :]
    if (version, size, mtime) != (VERSION, stat.st_size, stat.st_mtime_ns):
        return None
    if not hmac.compare_digest(_seal(body, key), digest):
        return None
    try:
        return marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return None


def _seal(body: bytes | memoryview, key: bytes) -> bytes:
    """`body`'s digest keyed with `key` (BLAKE2b's keyed mode: a MAC)."""
    return hashlib.blake2b(body, digest_size=_DIGEST, key=key).digest()


def write(path: Path, stat: os.stat_result, data: Any, key: bytes) -> None:
    """Keep `data` (botocore's model of a data file of `stat`) at `path`, sealed with `key`; a
    cache that cannot be written is only logged."""
    from cloudtrain.access import atomic_write

    try:
        body = marshal.dumps(_plain(data))
        digest = _seal(body, key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(path, _HEADER.pack(VERSION, stat.st_size, stat.st_mtime_ns, digest) + body,
                     0o600)  # fmt: skip
    except (OSError, ValueError) as exc:
        log.info("could not keep botocore's model at %s: %s", path, exc)


def _plain(data: Any) -> Any:
    """`data` (JSON, with ``OrderedDict``s) as plain dicts and lists, which marshal takes."""
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    return data
