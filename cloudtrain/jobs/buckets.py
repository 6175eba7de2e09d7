"""Checkpoints kept in a bucket as well, named in the task (``checkpoint: s3://BUCKET/PREFIX``,
``gs://…``, ``az://ACCOUNT/CONTAINER/…``).

No cloud credential ever reaches a node, so the bucket is written and read from the user's
machine: a snapshot that `cloudtrain.jobs.checkpoints.Kept` made is pushed after it was made,
and a job resumed where the home keeps nothing of the job it resumes (another machine, a lost
home) has the newest complete snapshot restored from the bucket first. In the bucket::

    PREFIX/<job>/<snapshot>/<file> ...       the files, as in the home's <job>/<snapshot>/
    PREFIX/<job>/<snapshot>.complete.json    the manifest (each file's size and sha256),
                                             written last: a snapshot without it (an upload
                                             that was cut) is never the newest, and goes
                                             once a newer one is complete

A push uploads only what changed: a file whose size and sha256 match a file of the newest
complete snapshot in the bucket is copied inside the bucket (no byte passes this machine); the
others are uploaded. Then the bucket keeps the `keep` newest complete snapshots of the job.
Idempotent: a snapshot already complete there is not pushed again. A restore checks every file
against the manifest and renames the whole snapshot into place, as `Kept` does.

The calls themselves are the cloud's: the plugin whose `Store` serves the URL's scheme opens
the bucket (`cloudtrain.provision.store`: S3, GCS and Azure Blob are the AWS, GCP and Azure
plugins' ``_store.py``),
imports its SDK when a call first needs it and maps its errors, each naming the bucket.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from cloudtrain.errors import CheckpointError
from cloudtrain.executors import received
from cloudtrain.provision import registry
from cloudtrain.provision.store import ObjectStore

log = logging.getLogger(__name__)

#: What ends the key of a snapshot's manifest, the object that makes it complete.
MARKER = ".complete.json"
_CHUNK = 1 << 20
#: The most of a manifest read (a snapshot of a million files fits).
_MANIFEST_MAX = 256 << 20


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Pushed:
    """What a push did: files uploaded, files copied inside the bucket, snapshots removed."""

    uploaded: int = 0
    copied: int = 0
    removed: int = 0


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def manifest(snapshot: Path) -> dict[str, dict[str, Any]]:
    """Each file of `snapshot` (by its path inside, with '/') with its size and sha256."""
    files = {}
    for dirpath, _, names in os.walk(snapshot):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(snapshot).as_posix()
            files[rel] = {"size": path.stat().st_size, "sha256": _digest(path)}
    return dict(sorted(files.items()))


def _safe(rel: str) -> bool:
    """Whether a path read from a manifest stays inside the snapshot it is restored into."""
    parts = PurePosixPath(rel).parts
    return bool(parts) and not rel.startswith("/") and not {"..", "."} & set(parts)


class Bucket:
    """A job's checkpoints under ``SCHEME://BUCKET/PREFIX/<job>/``, through `store` (default:
    the one the plugin of the URL's scheme opens). Nothing is imported or called until a
    method needs it; a bad URL, or a scheme no plugin serves, is a `ConfigError` at once."""

    def __init__(self, url: str, store: ObjectStore | None = None) -> None:
        self.url = registry.bucket_url(url)
        self.store = store or registry.store(self.url)

    def __str__(self) -> str:
        return str(self.url)

    def check(self) -> None:
        """`ConfigError` unless the store's SDK can be imported (nothing is called)."""
        self.store.check()

    # -- reading ------------------------------------------------------------------------------

    def snapshots(self, job_id: str) -> list[str]:
        """The names of the job's complete snapshots, oldest first."""
        with self.store.errors():
            return self._listing(job_id)[0]

    def newest(self, job_id: str) -> str | None:
        found = self.snapshots(job_id)
        return found[-1] if found else None

    def restore(self, job_id: str, into: Path) -> Path | None:
        """Download the job's newest complete snapshot into ``into/<name>`` (the folder of
        `Kept`), whole or not at all; None when the bucket has none. Blocks for the download.
        Raises `CheckpointError` when a file does not match the manifest."""
        with self.store.errors():
            complete = self._listing(job_id)[0]
            if not complete:
                return None
            name = complete[-1]
            target = into / name
            if target.is_dir():
                return target
            files = self._manifest(job_id, name)
            tmp = into / f".{name}.restore"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                for rel, entry in files.items():
                    self._download(job_id, name, rel, entry, tmp)
                os.replace(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        log.info("restored checkpoint %s of %s from %s", name, job_id, self)
        return target

    def _download(
        self, job_id: str, name: str, rel: str, entry: dict[str, Any], into: Path
    ) -> None:
        """One file of a snapshot into `into`, checked against its `entry` of the manifest."""
        key = self._key(job_id, name, rel)
        if not _safe(rel):
            raise CheckpointError(into.parent / name, f"{self}: its manifest names {rel!r}")
        dest = into / rel
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        expected = int(entry["size"])
        body = self.store.open(key)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:  # no more than the manifest says, plus one byte
            while out.tell() <= expected:
                chunk = body.read(min(_CHUNK, expected + 1 - out.tell()))
                if not chunk:
                    break
                out.write(chunk)
        size, digest = dest.stat().st_size, _digest(dest)
        if (size, digest) != (entry.get("size"), entry.get("sha256")):
            raise CheckpointError(
                into.parent / name,
                f"{self.url.scheme}://{self.url.bucket}/{key} ({size} bytes) does not match its "
                f"snapshot's manifest ({entry.get('size')} bytes)",
            )

    # -- writing ------------------------------------------------------------------------------

    def push(self, job_id: str, snapshot: Path, *, keep: int) -> Pushed:
        """Copy the local `snapshot` (a folder named by its time, as `Kept` makes them) to the
        bucket, its manifest last, then keep the `keep` newest complete snapshots there.
        Idempotent; blocks for the upload."""
        name = snapshot.name
        uploaded = copied = 0
        with self.store.errors():
            complete = self._listing(job_id)[0]
            if name not in complete:
                files = manifest(snapshot)
                have: dict[tuple[object, object], str] = {}
                if complete:  # what the newest complete one holds: copied inside the bucket
                    previous = complete[-1]
                    for rel, entry in self._manifest(job_id, previous).items():
                        key = self._key(job_id, previous, rel)
                        have[entry.get("size"), entry.get("sha256")] = key
                for rel, entry in files.items():
                    key = self._key(job_id, name, rel)
                    same = have.get((entry["size"], entry["sha256"]))
                    if same is not None:
                        self.store.copy(same, key)
                        copied += 1
                    else:
                        self.store.upload(snapshot / rel, key)
                        uploaded += 1
                body = {"job": job_id, "snapshot": name, "files": files}
                self.store.put(self._key(job_id, name + MARKER),
                               json.dumps(body, indent=1).encode(), "application/json")  # fmt: skip
                log.info(
                    "pushed checkpoint %s of %s to %s (%d uploaded, %d copied)",
                    *(name, job_id, self, uploaded, copied),
                )
        removed = self.prune(job_id, keep=keep)
        return Pushed(uploaded, copied, removed)

    def prune(self, job_id: str, *, keep: int) -> int:
        """Remove all but the `keep` newest complete snapshots of the job, and every incomplete
        one older than the newest complete one (an upload that was cut). A snapshot's manifest
        goes first, so a half-removed one is never complete. The number removed."""
        with self.store.errors():
            complete, folders = self._listing(job_id)
            if not complete:
                return 0
            newest = int(complete[-1])
            doomed = complete[:-keep] + [
                n for n in folders if n not in complete and int(n) < newest
            ]
            if not doomed:
                return 0
            self._delete([self._key(job_id, n + MARKER) for n in doomed if n in complete])
            for n in doomed:
                self._delete(list(self.store.keys(self._key(job_id, n) + "/")))
        return len(doomed)

    # -- the bucket ---------------------------------------------------------------------------

    def _key(self, job_id: str, *parts: str) -> str:
        return "/".join(p for p in (self.url.prefix, job_id, *parts) if p)

    def _listing(self, job_id: str) -> tuple[list[str], list[str]]:
        """The job's complete snapshots and its snapshot folders, each oldest first."""
        base = self._key(job_id) + "/"
        keys, subs = self.store.listing(base)
        complete, folders = set(), set()
        for key in keys:
            name = key[len(base) :]
            if name.endswith(MARKER) and name[: -len(MARKER)].isdigit():
                complete.add(name[: -len(MARKER)])
        for sub in subs:
            name = sub[len(base) :]
            if name.isdigit():
                folders.add(name)
        return sorted(complete, key=int), sorted(folders, key=int)

    def _manifest(self, job_id: str, name: str) -> dict[str, dict[str, Any]]:
        key = self._key(job_id, name + MARKER)
        body = self.store.open(key).read(_MANIFEST_MAX)
        try:
            files = json.loads(body)["files"]
            if not isinstance(files, dict):
                raise TypeError("files is not a mapping")
            sizes = [e.get("size") if isinstance(e, dict) else None for e in files.values()]
            total = sum(n for n in sizes if _count(n))
            if len(sizes) != len([n for n in sizes if _count(n)]):
                raise TypeError("a file's size is no whole number")
            if total > received.limit():
                raise ValueError(f"its files hold {total} bytes, more than the bound allows")
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                Path(key), f"in {self}: not a snapshot manifest ({exc})"
            ) from None
        return files

    def _delete(self, keys: list[str]) -> None:
        for key, why in self.store.delete(keys):
            log.warning("%s: could not remove %s: %s", self, key, why)
