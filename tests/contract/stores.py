"""What `test_checkpoint_stores.py` asks of each cloud's object storage stand-in.

A cloud joins the contract with a `StoreStandIn`: its stand-in served on 127.0.0.1, its SDK in
this process pointed at it (the test's environment), an empty bucket made, and a view of every
request the stand-in got. A fixture per cloud (``s3_store``, ``gcs_store``, ``azure_store``)
gives one; `STORES` names them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

#: The fixture of each scheme's stand-in.
STORES = {
    "s3": "s3_store",
    "gs": "gcs_store",
    "az": "azure_store",
}


@dataclass(frozen=True)
class Seen:
    """One request as the stand-in got it, in the bucket's keys (whole keys, as `Bucket`
    writes them): what it did (``read``, ``write``, ``copy``, ``delete``, ``list``, or
    ``other``), the key (``""`` for a listing) and, for a copy, the key it came from. `host`:
    the ``Host`` header it came with."""

    action: str
    key: str
    source: str | None
    host: str


class StoreStandIn(Protocol):
    #: a URL of the emptied bucket with a prefix of two parts (``s3://ckpts/runs/bert``)
    url: str
    #: the whole key that prefix is in the store (``runs/bert``; an Azure container's name first)
    prefix: str
    #: the requests since the fixture gave it (or since `seen.clear()`)
    seen: list[Seen]
    #: when set, each request it picks is answered with the store's own "internal error"
    #: (HTTP 500), which its SDK raises as its error (no retry: the fixture sets none)
    fail: Callable[[Seen], bool] | None

    def keys(self) -> set[str]:
        """Every key of the bucket, read behind cloudtrain's back."""
        ...

    def body(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None:
        """Write an object behind cloudtrain's back (a bucket is as untrusted as a node)."""
        ...

    def missing(self) -> tuple[str, str]:
        """A URL of a bucket that does not exist, and the error code its SDK says it with."""
        ...

    def unreachable(self) -> str:
        """Point the SDK at a closed port; the error code a call then gets."""
        ...


class Recording:
    """What a recorder in front of a stand-in saw, and which requests it fails."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.fail: Callable[[Seen], bool] | None = None
        self._lock = threading.Lock()

    def record(self, *seen: Seen) -> bool:
        """Note one request (a batch's parts are several); whether `fail` picks it."""
        with self._lock:
            self.seen.extend(seen)
            pick = self.fail
        return pick is not None and any(pick(s) for s in seen)

    def reset(self) -> None:
        with self._lock:
            self.seen.clear()
            self.fail = None


class Recorded:
    """A `StoreStandIn`'s `seen` and `fail`, its recorder's `Recording`."""

    recording: Recording

    @property
    def seen(self) -> list[Seen]:
        return self.recording.seen

    @property
    def fail(self) -> Callable[[Seen], bool] | None:
        return self.recording.fail

    @fail.setter
    def fail(self, pick: Callable[[Seen], bool] | None) -> None:
        self.recording.fail = pick
