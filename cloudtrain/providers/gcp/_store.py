"""Google Cloud Storage, the GCP plugin's checkpoint store (`cloudtrain.provision.store`):
``gs://BUCKET/PREFIX``.

google-cloud-storage is imported when the bucket is first used (``pip install
'cloudtrain[gcp]'``). Credentials are google.auth's default chain, as the provider's
(``gcloud auth application-default login``, ``GOOGLE_APPLICATION_CREDENTIALS``, the metadata
server); no project is needed for a bucket's objects. ``STORAGE_EMULATOR_HOST`` (the SDK's own
variable, with its scheme) points every call at an emulator, and then, as the SDK does, no
credentials are sent (anonymous ones). ``CLOUDTRAIN_GCS_RETRY_S`` bounds how long a call that
failed on the way (HTTP 429/5xx, a dropped connection) is tried again (60 s; 0: never).

The calls: listings through the SDK's iterator (every page), uploads through the SDK (a file
past 8 MiB resumable, in chunks of 8 MiB), a copy with the JSON API's rewrite (inside Google,
repeated while it says it is not done), deletes in batches, and a read as one streamed GET
(``alt=media``) whose body is taken off the connection as it is asked for. Errors are the
provider's mapping (`gcp_errors`), each naming the bucket; an error whose body the SDK kept
as text (an upload's) is read as the JSON API's error first, so that each carries its reason.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cloudtrain.errors import AuthError, ConfigError, ProviderError, one_line
from cloudtrain.provision.store import Readable
from cloudtrain.spec import BucketURL

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
RETRY_ENV = "CLOUDTRAIN_GCS_RETRY_S"
_RETRY_S = 60.0
#: Seconds a call waits on the endpoint (the SDK's own default).
_TIMEOUT_S = 60.0
#: A resumable upload's chunk: a multiple of 256 KiB; what one upload holds in memory.
_UPLOAD_CHUNK = 8 << 20
#: The JSON API takes at most 100 calls in one batch.
_DELETE_BATCH = 100
_HINT = (
    "a proxy or load balancer in the way, or an endpoint that is not GCS (STORAGE_EMULATOR_HOST)"
)
_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]

#: A GCS bucket name: 3 to 63 lowercase letters, digits, '-', '_' and '.', a letter or digit at
#: each end; with dots up to 222, each dot-separated part at most 63.
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_IPV4_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")
#: 'google' and its close misspellings (digits for letters: 'g00gle', 'goog1e').
_GOOGLE_RE = re.compile(r"g[o0][o0]g[l1]e")
_ALLOWED = (
    "3 to 63 lowercase letters, digits, '-', '_' and '.' (a letter or digit at each end; "
    "with dots up to 222, each dot-separated part at most 63)"
)


def refused(url: BucketURL) -> str | None:
    """Why GCS refuses `url`'s bucket name (what it allows), or None."""
    name = url.bucket
    parts = name.split(".")
    why = None
    if not _NAME_RE.fullmatch(name) or any(not 0 < len(p) <= 63 for p in parts):
        why = _ALLOWED
    elif _IPV4_RE.fullmatch(name):
        why = "it reads as an IP address"
    elif name.startswith("goog"):
        why = "it may not start with 'goog'"
    elif _GOOGLE_RE.search(name):
        why = "it may not contain 'google' or a close misspelling of it"
    return None if why is None else f"{name!r} is not a GCS bucket name: {why}"


def _sdk() -> Any:
    try:
        import google.cloud.storage  # type: ignore[import-untyped]
    except ImportError:
        return None
    return google.cloud.storage


class GcsStore:
    """One GCS bucket. `client`: a ``google.cloud.storage.Client`` to use (default: one made
    with the default credentials when a call first needs it)."""

    def __init__(self, url: BucketURL, client: Any = None) -> None:
        self.url = url
        self._client = client
        self._session: Any = None

    def check(self) -> None:
        with self.errors():
            pass

    @contextmanager
    def errors(self) -> Iterator[None]:
        if _sdk() is None:
            raise ConfigError(
                f"checkpoint {self.url}: a bucket needs google-cloud-storage: "
                "pip install 'cloudtrain[gcp]'"
            )
        from google.api_core.exceptions import GoogleAPICallError, RetryError
        from google.auth.exceptions import GoogleAuthError
        from google.cloud.storage.exceptions import (  # type: ignore[import-untyped]
            DataCorruption,
            InvalidResponse,
        )

        from cloudtrain.providers.gcp._client import gcp_errors

        where = str(self.url)
        with gcp_errors(where):
            try:
                yield
            except (GoogleAPICallError, InvalidResponse) as exc:
                raise _mapped(_plain(exc), where) from exc
            except RetryError as exc:  # retried until its deadline: the last error, as said
                raise _mapped(RetryError(exc.message, _plain(exc.cause)), where) from exc
            except GoogleAuthError as exc:
                raise _mapped(exc, where) from exc
            except DataCorruption as exc:
                raise ProviderError(
                    "gcp",
                    "DataCorruption",
                    f"{one_line(str(exc))} (in {where}): the bytes were not the ones sent",
                    retryable=True,
                ) from exc

    def listing(self, prefix: str) -> tuple[list[str], list[str]]:
        found = self._gcs().list_blobs(
            self.url.bucket, prefix=prefix, delimiter="/", retry=self._retry()
        )
        keys = [str(blob.name) for blob in found]  # every page; then its prefixes are known
        return keys, sorted(str(p).rstrip("/") for p in found.prefixes)

    def keys(self, prefix: str) -> Iterator[str]:
        for blob in self._gcs().list_blobs(self.url.bucket, prefix=prefix, retry=self._retry()):
            yield str(blob.name)

    def open(self, key: str) -> Readable:
        """One GET of the object's bytes, streamed: nothing is read off the connection before
        it is asked for (a restore reads no more than a file's manifest says, plus one byte)."""
        from google.api_core.exceptions import from_http_response

        client = self._gcs()
        url = (
            f"{client.api_endpoint}/download/storage/v1/b/{quote(self.url.bucket, safe='')}"
            f"/o/{quote(key, safe='')}?alt=media"
        )

        def get() -> Any:  # the stored bytes as they are: no decompressive transcoding
            answer = self._session.get(
                url, stream=True, headers={"Accept-Encoding": "gzip"}, timeout=_TIMEOUT_S
            )
            if answer.status_code != 200:
                try:
                    raise from_http_response(answer)
                finally:
                    answer.close()
            return answer

        retry = self._retry()
        return _Body(retry(get)() if retry is not None else get())

    def upload(self, path: Path, key: str) -> None:
        blob = self._bucket().blob(key, chunk_size=_UPLOAD_CHUNK)
        blob.upload_from_filename(
            str(path), content_type="application/octet-stream", retry=self._retry()
        )

    def copy(self, source: str, key: str) -> None:
        """The JSON API's rewrite: the bytes stay inside Google; a large object (another
        location or storage class) takes more calls, each going on from the last one's token."""
        bucket = self._bucket()
        origin, blob, retry = bucket.blob(source), bucket.blob(key), self._retry()
        token, _, _ = blob.rewrite(origin, retry=retry)
        while token is not None:
            token, _, _ = blob.rewrite(origin, token=token, retry=retry)

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self._bucket().blob(key).upload_from_string(
            data, content_type=content_type, retry=self._retry()
        )

    def delete(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """In batches of the JSON API (one request per 100 keys); a key already gone counts as
        removed."""
        client, bucket = self._gcs(), self._bucket()
        failed = []
        for start in range(0, len(keys), _DELETE_BATCH):
            chunk = keys[start : start + _DELETE_BATCH]
            with client.batch(raise_exception=False) as batch:
                for key in chunk:
                    bucket.delete_blob(key)
            # the answer to each call, in order (what `finish` returned; the SDK keeps it there)
            for key, answer in zip(chunk, batch._responses, strict=True):
                if not (200 <= answer.status_code < 300 or answer.status_code == 404):
                    failed.append((key, _why(answer)))
        return failed

    def _bucket(self) -> Any:
        return self._gcs().bucket(self.url.bucket)

    def _gcs(self) -> Any:
        if self._session is None:
            from google.auth.transport.requests import AuthorizedSession

            credentials = self._credentials()
            storage = _sdk()
            if self._client is None:
                self._client = storage.Client(project=None, credentials=credentials)
                # its tracing's cache of bucket metadata would GET the bucket in a thread of
                # its own on the first call (storage.buckets.get): no call but the store's
                self._client._bucket_metadata_cache = None
            self._session = AuthorizedSession(credentials)
        return self._client

    def _credentials(self) -> Any:
        if self._client is not None:
            return self._client._credentials
        if os.environ.get(EMULATOR_ENV):
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        import google.auth

        found, _ = google.auth.default(scopes=_SCOPES)
        return found

    def _retry(self) -> Any:
        """The SDK's retry, bounded by ``CLOUDTRAIN_GCS_RETRY_S``; None: no retry."""
        from google.cloud.storage.retry import DEFAULT_RETRY  # type: ignore[import-untyped]

        raw = os.environ.get(RETRY_ENV, "").strip()
        try:
            seconds = float(raw) if raw else _RETRY_S
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):
            raise ConfigError(f"{RETRY_ENV} {raw!r} is not a number of seconds (0: no retry)")
        return DEFAULT_RETRY.with_timeout(seconds) if seconds else None


class _Body:
    """A streamed GET's body: each read takes what is asked off the connection, which is given
    back once the body ends (or this goes)."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def read(self, size: int = -1, /) -> bytes:
        from requests.exceptions import ChunkedEncodingError, ReadTimeout
        from requests.exceptions import ConnectionError as Dropped
        from urllib3.exceptions import HTTPError, ProtocolError, ReadTimeoutError

        try:  # urllib3's errors as requests' (what the mapping knows)
            data: bytes = self._answer.raw.read(None if size < 0 else size, decode_content=False)
        except ReadTimeoutError as exc:
            raise ReadTimeout(str(exc)) from exc
        except ProtocolError as exc:
            raise ChunkedEncodingError(str(exc)) from exc
        except HTTPError as exc:
            raise Dropped(str(exc)) from exc
        if size < 0 or len(data) < size:  # its end
            self.close()
        return data

    def close(self) -> None:
        self._answer.close()

    def __del__(self) -> None:
        self.close()


def _plain(exc: Any) -> Any:
    """`exc` as the JSON API said it, with its own message and reasons: the SDK's errors of a
    call say the request's URL first, those of an upload or a read hold the whole error
    document as text, and its media layer's carry only the answer. An answer that was no error
    document stays as it is (the mapping says what it was, by its status)."""
    from google.api_core.exceptions import GoogleAPICallError, from_http_status

    response: Any = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if not isinstance(status, int):
        return exc
    try:
        error = json.loads(response.text)["error"]
    except (ValueError, TypeError, KeyError, AttributeError):  # no error document
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        errors = [e for e in error.get("errors") or [] if isinstance(e, dict)]
        return from_http_status(status, error["message"], errors=errors, response=response)
    if isinstance(exc, GoogleAPICallError):
        return exc
    return from_http_status(status, one_line(str(exc)), response=response)


def _mapped(exc: Exception, where: str) -> ProviderError:
    """The provider's mapping of `exc`, saying what a bucket needs where it speaks of Compute
    Engine (credentials, an endpoint)."""
    from cloudtrain.providers.gcp._errors import ENDPOINT_HINT, map_sdk_error

    mapped = map_sdk_error(exc, where)
    if getattr(exc, "code", None) == 429:  # too many requests: another time will do
        mapped.retryable = True
    if ENDPOINT_HINT in str(mapped):
        said = str(mapped).removeprefix(f"gcp: {mapped.code}: ").replace(ENDPOINT_HINT, _HINT)
        return ProviderError("gcp", mapped.code, said, retryable=mapped.retryable)
    if not isinstance(mapped, AuthError):
        return mapped
    said = one_line(str(getattr(exc, "message", exc))).rstrip(".")
    return AuthError(
        "gcp",
        mapped.code,
        f"{said} (in {where}). Check the credentials (gcloud auth application-default login, "
        "or GOOGLE_APPLICATION_CREDENTIALS) and that they may read, write and delete the "
        "bucket's objects (roles/storage.objectAdmin)",
    )


def _why(answer: Any) -> str:
    """A batch's answer to one call, in a line."""
    try:
        said = str(json.loads(answer.content)["error"]["message"])
    except (ValueError, TypeError, KeyError):
        said = answer.reason or "no reason given"
    return f"HTTP {answer.status_code}: {one_line(said)}"


def open_store(url: BucketURL) -> GcsStore:
    return GcsStore(url)
