"""S3, the AWS plugin's checkpoint store (`cloudtrain.provision.store`): ``s3://BUCKET/PREFIX``.

boto3 is imported when the bucket is first used (``pip install 'cloudtrain[aws]'``); it finds its
endpoint (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``), credentials and ``AWS_PROFILE`` the way
any AWS tool does. botocore's errors are mapped by the provider's own mapping (`aws_errors`),
each naming the bucket; boto3's transfer errors wrap the botocore error they met, which is
the one mapped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cloudtrain.errors import ConfigError, ProviderError, one_line
from cloudtrain.provision.store import Readable
from cloudtrain.spec import BucketURL

#: DeleteObjects takes this many keys at most.
_DELETE_BATCH = 1000

#: An S3 bucket name as AWS allows new ones: 3 to 63 lowercase letters, digits, '.' and '-', a
#: letter or digit at each end, no '..', not an IPv4 address, none of the reserved affixes.
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4_RE = re.compile(r"[0-9]+(\.[0-9]+){3}")
_RESERVED = (("xn--", "sthree-", "amzn-s3-demo-"), ("-s3alias", "--ol-s3", ".mrap", "--x-s3"))


def refused(url: BucketURL) -> str | None:
    """Why S3 refuses `url`'s bucket name (what it allows), or None."""
    name = url.bucket
    if (
        _NAME_RE.fullmatch(name)
        and ".." not in name
        and not _IPV4_RE.fullmatch(name)
        and not name.startswith(_RESERVED[0])
        and not name.endswith(_RESERVED[1])
    ):
        return None
    return (
        f"{name!r} is not an S3 bucket name: 3 to 63 lowercase letters, digits, '.' and '-' "
        "(a letter or digit at each end)"
    )


class S3Store:
    """One S3 bucket. `client`: an S3 client to use (default: one of boto3's session, with
    ``AWS_PROFILE``), made when a call first needs it."""

    def __init__(self, url: BucketURL, client: Any = None) -> None:
        self.url = url
        self._client = client

    def check(self) -> None:
        with self.errors():
            pass

    @contextmanager
    def errors(self) -> Iterator[None]:
        try:
            from boto3.exceptions import Boto3Error
        except ImportError:
            raise ConfigError(
                f"checkpoint {self.url}: a bucket needs boto3: pip install 'cloudtrain[aws]'"
            ) from None
        from botocore.exceptions import BotoCoreError, ClientError

        from cloudtrain.providers.aws._client import aws_errors

        with aws_errors(str(self.url)):
            try:
                yield
            except Boto3Error as exc:
                inner = getattr(exc, "last_exception", None) or exc.__context__
                if isinstance(inner, ClientError | BotoCoreError):
                    raise inner from exc
                raise ProviderError(
                    "s3", type(exc).__name__, f"{one_line(str(exc))} in {self.url}"
                ) from exc

    def listing(self, prefix: str) -> tuple[list[str], list[str]]:
        keys, folders = [], []
        for page in self._pages(Prefix=prefix, Delimiter="/"):
            keys += [obj["Key"] for obj in page.get("Contents", [])]
            folders += [sub["Prefix"].rstrip("/") for sub in page.get("CommonPrefixes", [])]
        return keys, folders

    def keys(self, prefix: str) -> Iterator[str]:
        for page in self._pages(Prefix=prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"]

    def open(self, key: str) -> Readable:
        body: Readable = self._s3().get_object(Bucket=self.url.bucket, Key=key)["Body"]
        return body

    def upload(self, path: Path, key: str) -> None:
        self._s3().upload_file(str(path), self.url.bucket, key)

    def copy(self, source: str, key: str) -> None:
        self._s3().copy({"Bucket": self.url.bucket, "Key": source}, self.url.bucket, key)

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self._s3().put_object(Bucket=self.url.bucket, Key=key, Body=data, ContentType=content_type)

    def delete(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        failed = []
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": k} for k in keys[start : start + _DELETE_BATCH]]
            answer = self._s3().delete_objects(Bucket=self.url.bucket, Delete={"Objects": batch})
            failed += [(str(e.get("Key")), str(e.get("Message"))) for e in answer.get("Errors", [])]
        return failed

    def _pages(self, **query: str) -> Iterator[dict[str, Any]]:
        paginator = self._s3().get_paginator("list_objects_v2")
        yield from paginator.paginate(Bucket=self.url.bucket, **query)

    def _s3(self) -> Any:
        if self._client is None:
            from cloudtrain.providers.aws._client import Clients

            clients = Clients()
            region = clients.session().region_name or "us-east-1"
            self._client = clients.get("s3", region)
        return self._client


def open_store(url: BucketURL) -> S3Store:
    return S3Store(url)
