"""S3's stand-in for the checkpoint stores' contract (`tests/contract/stores.py`): moto's own
server app on 127.0.0.1, behind a small recorder, started once per session.

The suite's AWS stand-in (``standin.py``) reads every signed body as a query string, which an
S3 object's bytes are not; so this serves moto's server app as it is. ``AWS_ENDPOINT_URL_S3``
points boto3 at it while ``AWS_ENDPOINT_URL`` stays at the closed loopback port of the autouse
fixture: S3's own variable is honoured, and nothing else is reached.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs, unquote
from wsgiref.types import StartResponse, WSGIEnvironment

import boto3
import pytest
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.test import Client

from tests.contract.stores import Recorded, Recording, Seen

BUCKET = "ckpts"


def _seen(environ: WSGIEnvironment) -> Seen:
    """A request to a path-style URL (``/ckpts/KEY``) in the contract's terms: a multipart
    upload is its parts, each a write, or a copy when it carries a copy source."""
    path = unquote(environ.get("PATH_INFO", "")).lstrip("/")
    _, _, key = path.partition("/")
    method = environ["REQUEST_METHOD"]
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    source = environ.get("HTTP_X_AMZ_COPY_SOURCE")
    if source:
        whole = unquote(source).split("?")[0].lstrip("/")
        return Seen("copy", key, whole.partition("/")[2], environ.get("HTTP_HOST", ""))
    if not key:
        action = "delete" if "delete" in query else "list" if method == "GET" else "other"
    elif method in ("POST", "DELETE") and {"uploads", "uploadId"} & set(query):
        action = "other"  # a multipart upload begun, completed or aborted: its parts are seen
    else:
        action = {"GET": "read", "PUT": "write", "POST": "write", "DELETE": "delete"}.get(
            method, "other"
        )
    return Seen(action, key, None, environ.get("HTTP_HOST", ""))


class Recorder:
    """moto's server app, recording each request, and failing those `fail` picks (an S3 error
    document, HTTP 500: botocore makes it a `ClientError`; ``AWS_MAX_ATTEMPTS=1``)."""

    def __init__(self) -> None:
        self.inner = DomainDispatcherApplication(create_backend_app)
        self.recording = Recording()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self.recording.record(_seen(environ)):
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            body = b"<Error><Code>InternalError</Code><Message>cut short</Message></Error>"
            start_response("500 Internal Server Error", [("Content-Type", "application/xml")])
            return [body]
        answer: Iterable[bytes] = self.inner(environ, start_response)
        return answer


class S3StandIn(Recorded):
    """The contract's `StoreStandIn` over moto's S3."""

    url = f"s3://{BUCKET}/runs/bert"
    prefix = "runs/bert"

    def __init__(self, recorder: Recorder, endpoint: str, monkeypatch: pytest.MonkeyPatch):
        self._endpoint = endpoint
        self._monkeypatch = monkeypatch
        self.recording = recorder.recording

    def keys(self) -> set[str]:
        pages = _client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        return {o["Key"] for page in pages for o in page.get("Contents", [])}

    def body(self, key: str) -> bytes:
        data: bytes = _client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return data

    def put(self, key: str, data: bytes) -> None:
        _client().put_object(Bucket=BUCKET, Key=key, Body=data)

    def missing(self) -> tuple[str, str]:
        return "s3://no-such-bucket/x", "NoSuchBucket"

    def unreachable(self) -> str:
        self._monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # closed
        return "EndpointConnectionError"


def _client() -> Any:
    return boto3.client("s3", region_name="us-east-1")


class _Quiet(MotoRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


@pytest.fixture(scope="session")
def s3_server() -> Iterator[tuple[Recorder, str]]:
    app = Recorder()
    server: BaseWSGIServer = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def s3_store(s3_server: tuple[Recorder, str], monkeypatch: pytest.MonkeyPatch) -> S3StandIn:
    """moto's S3, emptied, with the bucket made; boto3 in this process pointed at it."""
    app, endpoint = s3_server
    Client(app.inner).post("/moto-api/reset").close()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    app.recording.reset()
    return S3StandIn(app, endpoint, monkeypatch)
