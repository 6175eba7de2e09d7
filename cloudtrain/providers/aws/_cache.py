"""The plan's read-only answers (the zones that offer a type, the image to boot), kept on disk
for a day per region and caller, so that a second `up` asks EC2 and SSM nothing of them.

Where: ``<home>/cache/aws/<digest>.json``, one file per (caller, region); the digest is of
`Clients.caller` (the endpoints, the profile and the access key id: another account,
profile or endpoint never reads another's answers) and the region. An entry older than
``MAX_AGE_S``, a file that is not what this module writes, a value of the wrong shape: all
read as "not cached", and the answer is asked for again and written over them. Writes are
atomic (a temp file renamed over the old one), so a crash leaves the old file or the new one;
two `up`s at once each write a whole file, the last one wins. A cache folder another user owns
or can write is refused (`ConfigError`), and a file of another user's is not read.

What is cached must stay true for a day or fail safe: an offering withdrawn from a zone makes
``RunInstances`` fail there (``Unsupported``: the next zone is tried), and an image that is
gone (``InvalidAMIID.*``) drops the region's file (`forget`), so the next `up` reads it anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: How long an answer is used: a day.
MAX_AGE_S = 24 * 3600.0
#: The file format; a file of another version is ignored.
VERSION = 1


class PlanCache:
    """The cached read-only answers of one region for one caller. Not thread-safe: one per
    region and thread (`AwsProvider.plan` gives each region its own)."""

    def __init__(
        self,
        folder: Path,
        caller: str | None,
        region: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        #: None: no caller known (no credentials): nothing is read or written
        self.path: Path | None = None
        if caller is not None:
            digest = hashlib.sha256(f"{caller}\0{region}".encode()).hexdigest()[:32]
            self.path = folder / f"{digest}.json"
        self.region = region
        self._clock = clock
        self._entries: dict[str, Any] | None = None

    def get(self, name: str) -> Any:
        """The answer cached under `name`, or None when there is none younger than a day."""
        entry = self._load().get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), (int, float)):
            return None
        if not 0 <= self._clock() - entry["at"] < MAX_AGE_S:
            return None
        return entry.get("value")

    def put(self, name: str, value: Any) -> None:
        """Keep `value` (JSON) under `name`; a cache that cannot be written is only logged."""
        if self.path is None:
            return
        from cloudtrain.access import atomic_write

        entries = self._load()
        entries[name] = {"at": self._clock(), "value": value}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"version": VERSION, "region": self.region, "entries": entries})
            atomic_write(self.path, text, 0o600)
        except OSError as exc:
            log.info("could not write the plan cache %s: %s", self.path, exc)

    def forget(self) -> None:
        """Drop every answer of this region (one turned out wrong)."""
        self._entries = {}
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = {}
            if self.path is not None:
                from cloudtrain.access import private_folder

                try:
                    private_folder(self.path.parent, "cache folder")  # ConfigError: not ours
                    private_folder(self.path.parent.parent, "cache folder", tighten=False)
                    with self.path.open() as f:  # another user's file: not cached
                        mine = os.fstat(f.fileno()).st_uid == os.getuid()
                        data = json.loads(f.read()) if mine else None
                except (OSError, ValueError):  # absent, unreadable or corrupt: not cached
                    data = None
                if (
                    isinstance(data, dict)
                    and data.get("version") == VERSION
                    and isinstance(data.get("entries"), dict)
                ):
                    self._entries = data["entries"]
        return self._entries


def str_list(value: Any) -> list[str] | None:
    """`value` when it is a list of strings (a cached answer of that shape), else None."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None
