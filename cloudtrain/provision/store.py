"""A cloud's object storage as the checkpoint bucket sees it (`cloudtrain.jobs.buckets`).

`cloudtrain.jobs.buckets.Bucket` keeps a job's snapshots in a bucket the user names
(``checkpoint: s3://BUCKET/PREFIX``): the manifests, what a push copies inside the bucket,
which snapshots are kept, the checks of a restore. All of that is the same on every cloud; what
differs is the handful of calls below, which a provider's plugin gives as its `Store` (the URL
scheme it serves and how to open a bucket of it). Keys are whole object names in the bucket.

Each method raises cloudtrain's errors, never its SDK's: the store maps them inside `errors`,
naming the bucket, and `check` says, with no call, when its SDK is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cloudtrain.spec import BucketRule, BucketURL


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class ObjectStore(Protocol):
    """One bucket (the URL's); every call inside ``with store.errors():``."""

    def check(self) -> None:
        """`ConfigError` unless its SDK can be imported (nothing is called)."""
        ...

    def errors(self) -> AbstractContextManager[None]:
        """The SDK's errors raised in the block as cloudtrain's (`ProviderError`, `AuthError`
        …), each naming the bucket."""
        ...

    def listing(self, prefix: str) -> tuple[list[str], list[str]]:
        """The keys right under `prefix` (which ends in '/') and the names of the folders
        there, each whole (``prefix + name`` for a folder, without its '/')."""
        ...

    def keys(self, prefix: str) -> Iterator[str]:
        """Every key that starts with `prefix`, however deep."""
        ...

    def open(self, key: str) -> Readable:
        """The object's bytes, read as they are asked for."""
        ...

    def upload(self, path: Path, key: str) -> None: ...

    def copy(self, source: str, key: str) -> None:
        """The object `source` as `key` too, inside the bucket (no byte passes here)."""
        ...

    def put(self, key: str, data: bytes, content_type: str) -> None: ...

    def delete(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """Remove `keys`; the ones that could not be, each with why."""
        ...


@dataclass(frozen=True)
class Store:
    """What a provider's plugin gives for checkpoints kept in its cloud: the URL scheme it
    serves (``s3``), how to open a bucket of it (no SDK imported until a call needs it), its
    rule for the URL's bucket and prefix (why it refuses one, or None), which `spec` applies
    before anything is made, and its URLs' form after ``SCHEME://`` for the user (a
    `spec.BucketStore`)."""

    scheme: str
    open: Callable[[BucketURL], ObjectStore]
    refused: BucketRule
    form: str = "BUCKET/PREFIX"
