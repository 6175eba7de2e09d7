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
it, and a digest of its body; a file that differs in any of them, or that cannot be read, is
a miss: the JSON is read, as without a cache, and written over it (atomically: a crash or
two processes at once leave an old whole file or a new one). botocore's loader gives
``OrderedDict``s; this gives plain dicts, which keep their order too, and botocore builds its
own ordered maps from either.
"""

from __future__ import annotations

import hashlib
import logging
import marshal
import os
import struct
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Data files smaller than this are parsed as they are (fast enough; no file per model).
SMALLEST = 64 * 1024
#: The cache file's format; with the Python that wrote it (marshal's format is its own).
VERSION = f"cloudtrain-models 1 {sys.implementation.cache_tag} {marshal.version}".encode()
_DIGEST = 32
_HEADER = struct.Struct(f"<{len(VERSION)}sQQ{_DIGEST}s")


def _source(file_path: str) -> Path | None:
    """The data file botocore would read for `file_path` (which has no extension)."""
    for ext in (".json", ".json.gz"):
        path = Path(file_path + ext)
        if path.is_file():
            return path
    return None


def file_loader(folder: Path) -> Any:
    """botocore's JSON file loader with the cache of this module under `folder`."""
    from botocore.loaders import JSONFileLoader

    class CachedModels(JSONFileLoader):  # type: ignore[misc]  # botocore has no types
        def load_file(self, file_path: str) -> Any:
            source = _source(file_path)
            if source is None:
                return None
            stat = source.stat()
            if stat.st_size < SMALLEST:
                return super().load_file(file_path)
            cached = folder / f"{hashlib.sha256(str(source).encode()).hexdigest()[:32]}.marshal"
            found = read(cached, stat)
            if found is not None:
                return found
            data = super().load_file(file_path)
            if data is not None:
                write(cached, stat, data)
            return data

    return CachedModels()


def read(path: Path, stat: os.stat_result) -> Any:
    """The model kept at `path` for a data file of `stat`, or None (absent, stale, damaged)."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    if len(blob) < _HEADER.size:
        return None
    version, size, mtime, digest = _HEADER.unpack_from(blob)
    body = memoryview(blob)[_HEADER.size :]
    if (version, size, mtime) != (VERSION, stat.st_size, stat.st_mtime_ns):
        return None
    if hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
        return None
    try:
        return marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return None


def write(path: Path, stat: os.stat_result, data: Any) -> None:
    """Keep `data` (botocore's model of a data file of `stat`) at `path`; a cache that cannot
    be written is only logged."""
    from cloudtrain.access import atomic_write

    try:
        body = marshal.dumps(_plain(data))
        digest = hashlib.blake2b(body, digest_size=_DIGEST).digest()
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
