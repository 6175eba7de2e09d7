"""GCS's stand-in for the checkpoint stores' contract (`tests/contract/stores.py`): `gcs.Gcs`,
the JSON API's part that google-cloud-storage speaks, served on 127.0.0.1 (an OS-assigned port)
from a thread of the test process, started once per session. ``STORAGE_EMULATOR_HOST`` (the
SDK's own variable) points the SDK at it, which then sends no credentials (anonymous ones).

gcp-storage-emulator was the first choice; but it answers a missing bucket or object with an
empty 404 (GCS sends its JSON error document, which the store's errors are made of), serves one
request at a time, and always rewrites in one call (a copy's further calls went untested).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.gcp.gcs import Gcs, Obj, Request

BUCKET = "ckpts"


class GcsStandIn(Gcs):
    """The contract's `StoreStandIn`: `Gcs` with the bucket ``ckpts``, for the test its fixture
    gave it to (`monkeypatch`)."""

    url = f"gs://{BUCKET}/runs/bert"
    prefix = "runs/bert"
    monkeypatch: pytest.MonkeyPatch

    def keys(self) -> set[str]:
        with self.lock:
            return set(self.buckets[BUCKET])

    def body(self, key: str) -> bytes:
        with self.lock:
            return self.buckets[BUCKET][key].data

    def put(self, key: str, data: bytes) -> None:
        with self.lock:
            self.buckets[BUCKET][key] = Obj(data, "application/octet-stream")

    def missing(self) -> tuple[str, str]:
        return "gs://no-such-bucket/x", "NOT_FOUND"

    def unreachable(self) -> str:
        self.monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # closed
        return "EndpointConnectionError"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _serve(self) -> None:
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        req = Request(self.command, url.path, query, headers, body, self.headers.get("Host", ""))
        status, got, answer = self.server.gcs.answer(req)
        self.send_response(status)
        sized = {"Content-Length": str(len(answer))} if status != 204 else {}
        for key, value in (got | sized).items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(answer)
        except ConnectionError:  # a streamed read the client stopped reading
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    gcs: GcsStandIn

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[tuple[GcsStandIn, str]]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.gcs = GcsStandIn()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.gcs, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def gcs_store(gcs_server: tuple[GcsStandIn, str], monkeypatch: pytest.MonkeyPatch) -> GcsStandIn:
    """The stand-in, emptied, with the bucket made; google-cloud-storage in this process
    pointed at it, trying nothing twice."""
    gcs, endpoint = gcs_server
    gcs.reset(BUCKET)
    gcs.monkeypatch = monkeypatch
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    monkeypatch.setenv("CLOUDTRAIN_GCS_RETRY_S", "0")
    return gcs
