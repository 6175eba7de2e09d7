"""Azure Blob Storage, the Azure plugin's checkpoint store (`cloudtrain.provision.store`):
``az://ACCOUNT/CONTAINER/PREFIX``.

The URL's bucket is the storage account; the first part of its prefix is the container. A key
(``CONTAINER/rest/of/key``, as `cloudtrain.jobs.buckets` writes them: each starts with the
URL's prefix) is the blob ``rest/of/key`` of that container, and listings give whole keys back.

azure-storage-blob is imported when the bucket is first used (``pip install
'cloudtrain[azure]'``). Endpoint: ``https://ACCOUNT.blob.core.windows.net``, or
``CLOUDTRAIN_AZURE_BLOB_ENDPOINT``, a template where ``{account}`` goes
(``http://127.0.0.1:10000/{account}`` for Azurite). Credentials: the account's shared key when
``AZURE_STORAGE_KEY`` is set (the variable the az CLI reads; ignored when
``AZURE_STORAGE_ACCOUNT`` names another account), else the Azure provider's azure-identity chain,
whose identity needs the "Storage Blob Data Contributor" role on the account (its bearer tokens
go over https only). azure-core's errors are mapped here, each naming the bucket URL.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import AuthError, CloudtrainError, ConfigError, ProviderError, one_line
from cloudtrain.provision.store import Readable
from cloudtrain.spec import BucketURL

if TYPE_CHECKING:
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobClient, BlobServiceClient, ContainerClient

ENDPOINT_ENV = "CLOUDTRAIN_AZURE_BLOB_ENDPOINT"
PUBLIC_ENDPOINT = "https://{account}.blob.core.windows.net"
KEY_ENV = "AZURE_STORAGE_KEY"
ACCOUNT_ENV = "AZURE_STORAGE_ACCOUNT"
EXTRA = "pip install 'cloudtrain[azure]'"
#: How often azure-core retries a failed request (None: its default; the tests set 0).
RETRIES: int | None = None
#: An upload past this size goes in blocks of this size (Put Block, then Put Block List).
BLOCK = 8 << 20
#: A blob batch takes this many sub-requests at most.
_BATCH = 256
#: How long a copy still pending is waited for between looks, at most (seconds).
_COPY_POLL_MAX = 2.0

_ACCOUNT_RE = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER_RE = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
#: What a service answers when the caller may not: with these, the credential is the cause.
_AUTH_CODES = frozenset(
    {
        "AuthenticationFailed",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "AuthorizationPermissionDenied",
        "AuthorizationResourceTypeMismatch",
        "InsufficientAccountPermissions",
        "InvalidAuthenticationInfo",
        "NoAuthenticationInformation",
    }
)
_BUSY_CODES = frozenset({"ServerBusy", "OperationTimedOut", "InternalError"})


def refused(url: BucketURL) -> str | None:
    """Why Azure refuses `url`'s account or container name (what it allows), or None."""
    if not _ACCOUNT_RE.fullmatch(url.bucket):
        return (
            f"{url.bucket!r} is not an Azure storage account name: 3 to 24 lowercase letters "
            "and digits"
        )
    container = url.prefix.partition("/")[0]
    if not container:
        return "an Azure URL needs a container: write az://ACCOUNT/CONTAINER/PREFIX"
    if not _CONTAINER_RE.fullmatch(container) or "--" in container:
        return (
            f"{container!r} is not an Azure container name: 3 to 63 lowercase letters, digits "
            "and '-' (a letter or digit at each end, no '--')"
        )
    return None


def _split(key: str) -> tuple[str, str]:
    """A whole key as its container and the blob's name there."""
    container, _, name = key.partition("/")
    return container, name


class BlobStore:
    """One storage account's containers, the URL's first. `service`: a client to use
    (default: one made when a call first needs it, from the environment)."""

    def __init__(self, url: BucketURL, service: BlobServiceClient | None = None) -> None:
        self.url = url
        self._service = service
        self._keyed = False
        self._endpoint = ""

    def check(self) -> None:
        with self.errors():
            pass

    @contextmanager
    def errors(self) -> Iterator[None]:
        try:
            import azure.storage.blob  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"checkpoint {self.url}: a container needs azure-storage-blob: {EXTRA}"
            ) from None
        from azure.core.exceptions import AzureError

        try:
            yield
        except AzureError as exc:
            raise self._mapped(exc) from exc

    def _mapped(self, exc: Exception) -> CloudtrainError:
        from azure.core.exceptions import ClientAuthenticationError, DecodeError, HttpResponseError

        from cloudtrain.providers.azure._errors import map_azure_error, map_decode_error

        where = str(self.url)
        if isinstance(exc, ClientAuthenticationError) and exc.response is None:
            text = one_line(str(exc).split("To mitigate")[0]).rstrip(". ") or type(exc).__name__
            return AuthError("azure", "NoCredentials", f"{text} ({where}). {self._hint()}")
        if isinstance(exc, DecodeError):
            return map_decode_error(exc, where)
        if isinstance(exc, HttpResponseError):
            return self._http_error(exc)
        return map_azure_error(exc, where, self._endpoint)

    def _http_error(self, exc: HttpResponseError) -> ProviderError:
        """A service's answer: its ``x-ms-error-code`` (or the status) and the first line of
        its message, which azure-storage-blob follows with the request's id and time."""
        status = exc.status_code or 0
        code = getattr(exc, "error_code", None)  # a `StorageErrorCode` (a str enum), or a str
        code = str(getattr(code, "value", code) or f"HTTP{status}")
        lines = str(exc.message or exc.reason or "").strip().splitlines()
        message = f"{one_line(lines[0] if lines else '').rstrip('.')} in {self.url}"
        if code in _AUTH_CODES or status in (401, 403):
            return AuthError("azure", code, f"{message}. {self._hint()}")
        busy = status >= 500 or status == 429 or code in _BUSY_CODES
        return ProviderError("azure", code, message, retryable=busy)

    def _hint(self) -> str:
        if self._keyed:
            return f"Check {KEY_ENV}: it must be a key of storage account {self.url.bucket}"
        return (
            "Check the credentials (`az login`, or AZURE_CLIENT_ID/AZURE_TENANT_ID/"
            "AZURE_CLIENT_SECRET) and that they hold the 'Storage Blob Data Contributor' role on "
            f"storage account {self.url.bucket}, or set {KEY_ENV} to one of its keys"
        )

    # -- the calls ----------------------------------------------------------------------------

    def listing(self, prefix: str) -> tuple[list[str], list[str]]:
        from azure.storage.blob import BlobPrefix

        container, start = _split(prefix)
        keys, folders = [], []
        for item in self._container(container).walk_blobs(name_starts_with=start, delimiter="/"):
            if isinstance(item, BlobPrefix):
                folders.append(f"{container}/{str(item.name).rstrip('/')}")
            else:
                keys.append(f"{container}/{item.name}")
        return keys, folders

    def keys(self, prefix: str) -> Iterator[str]:
        container, start = _split(prefix)
        for name in self._container(container).list_blob_names(name_starts_with=start):
            yield f"{container}/{name}"

    def open(self, key: str) -> Readable:
        return _Ranges(self._blob(key))

    def upload(self, path: Path, key: str) -> None:
        with path.open("rb") as f:
            self._blob(key).upload_blob(
                f, length=os.fstat(f.fileno()).st_size, overwrite=True, max_concurrency=4
            )

    def copy(self, source: str, key: str) -> None:
        """A server-side copy (Copy Blob from the source's URL, in the same account), waited
        for while it is pending."""
        target = self._blob(key)
        status = str(target.start_copy_from_url(self._blob(source).url).get("copy_status"))
        delay, why = 0.1, ""
        while status == "pending":
            time.sleep(delay)
            delay = min(delay * 2, _COPY_POLL_MAX)
            copy = target.get_blob_properties().copy
            status, why = str(copy.status), str(copy.status_description or "")
        if status != "success":
            raise ProviderError(
                "azure",
                "CopyFailed",
                f"the copy of {source} to {key} in {self.url} ended {status}"
                + (f": {one_line(why)}" if why else ""),
                retryable=True,
            )

    def put(self, key: str, data: bytes, content_type: str) -> None:
        from azure.storage.blob import ContentSettings

        self._blob(key).upload_blob(
            data, overwrite=True, content_settings=ContentSettings(content_type=content_type)
        )

    def delete(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """In batches (one request each); a blob already gone is not a failure."""
        failed: list[tuple[str, str]] = []
        by_container: dict[str, list[str]] = {}
        for key in keys:
            container, name = _split(key)
            by_container.setdefault(container, []).append(name)
        for container, names in by_container.items():
            client = self._container(container)
            for start in range(0, len(names), _BATCH):
                batch = names[start : start + _BATCH]
                answers = client.delete_blobs(
                    *batch, delete_snapshots="include", raise_on_any_failure=False
                )
                for name, answer in zip(batch, answers, strict=True):
                    if answer.status_code not in (200, 202, 404):
                        code = answer.headers.get("x-ms-error-code") or "an error"
                        why = f"HTTP {answer.status_code}, {code}"
                        failed.append((f"{container}/{name}", why))
        return failed

    # -- the clients --------------------------------------------------------------------------

    def _container(self, name: str) -> ContainerClient:
        return self._account().get_container_client(name)

    def _blob(self, key: str) -> BlobClient:
        container, name = _split(key)
        return self._account().get_blob_client(container, name)

    def _account(self) -> BlobServiceClient:
        if self._service is None:
            self._service = self._connect()
        return self._service

    def _connect(self) -> BlobServiceClient:
        from azure.core.credentials import AzureNamedKeyCredential, TokenCredential
        from azure.storage.blob import BlobServiceClient

        account = self.url.bucket
        template = os.environ.get(ENDPOINT_ENV) or PUBLIC_ENDPOINT
        if "{account}" not in template or not template.startswith(("https://", "http://")):
            raise ConfigError(
                f"checkpoint {self.url}: {ENDPOINT_ENV}={template!r} is not an endpoint template: "
                "write an http(s) URL with {account} where the account goes "
                "(http://127.0.0.1:10000/{account}), or unset it for Azure's public cloud"
            )
        self._endpoint = template.replace("{account}", account).rstrip("/")
        key = os.environ.get(KEY_ENV)
        credential: AzureNamedKeyCredential | TokenCredential
        if key and os.environ.get(ACCOUNT_ENV, account) in ("", account):
            credential, self._keyed = AzureNamedKeyCredential(account, key), True
        elif not self._endpoint.startswith("https://"):
            raise ConfigError(
                f"checkpoint {self.url}: {ENDPOINT_ENV}={template!r} is http, and azure-core "
                f"sends bearer tokens over TLS only: use https, or set {KEY_ENV} to a key of "
                f"storage account {account}"
            )
        else:
            from cloudtrain.providers.azure._client import Clients

            credential = Clients().credential()
        options: dict[str, Any] = {"max_single_put_size": BLOCK, "max_block_size": BLOCK}
        if RETRIES is not None:
            options["retry_total"] = RETRIES
        return BlobServiceClient(self._endpoint, credential=credential, **options)


class _Ranges:
    """A blob read as it is asked for: each `read` is one ranged GET of what it asks (or a few,
    for more than the SDK gets at once), of the version the first one read."""

    def __init__(self, blob: BlobClient) -> None:
        self._blob = blob
        self._at = 0
        self._size: int | None = None
        self._etag: str | None = None

    def read(self, size: int = -1, /) -> bytes:
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError

        if size == 0 or (self._size is not None and self._at >= self._size):
            return b""
        same: dict[str, Any] = {}  # (no etag at all without a condition: the SDK sends it on)
        if self._etag is not None:
            same = {"etag": self._etag, "match_condition": MatchConditions.IfNotModified}
        try:
            stream = self._blob.download_blob(
                offset=self._at, length=size if size > 0 else None, max_concurrency=1, **same
            )
        except HttpResponseError as exc:
            if exc.status_code == 416:  # nothing from here on (an empty blob, or its end)
                self._size = self._at
                return b""
            raise
        data: bytes = stream.readall()
        whole = str(stream.properties.content_range or "").rpartition("/")[2]
        self._size = int(whole) if whole.isdigit() else None
        self._etag = stream.properties.etag
        self._at += len(data)
        return data


def open_store(url: BucketURL) -> BlobStore:
    return BlobStore(url)
