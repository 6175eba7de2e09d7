"""Azure Blob for the checkpoint stores' contract (`tests/contract/stores.py`): Azurite,
Microsoft's own storage emulator, behind a small recorder, started once per session.

Azurite (``npm install azurite@3.37.0``; `.ci/run` installs it) is found at
``$CLOUDTRAIN_TEST_AZURITE`` or as ``azurite-blob`` on PATH; without it the tests skip, or fail
where ``CLOUDTRAIN_TEST_TOOLS=required``. It serves one port the OS picks, from memory. In front
of it a threaded proxy on 127.0.0.1 forwards each request as it came (its shared-key signature
stays good), records it in the bucket's terms, and answers the ones `fail` picks with Azure's
own ``InternalError`` (HTTP 500) instead. The fixture's own reads and writes go to Azurite
directly: nothing it does is seen or failed.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.storage.blob import BlobServiceClient

from tests.contract.stores import Recorded, Recording, Seen

ACCOUNT = "devstoreaccount1"
#: Azurite's well-known key of its account (published in its README, as Azure's docs do)
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "ckpts"
#: The SDK speaks a newer storage API than Azurite 3.37 knows; the calls used are old ones.
FLAGS = ("--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry")
_LISTENS = re.compile(r"listens on (https?)://127\.0\.0\.1:(\d+)")
_SUB_REQUEST = re.compile(rb"^(DELETE|PUT) (\S+) HTTP/1\.1\r?$", re.MULTILINE)
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"})
_FAILED = (
    b'<?xml version="1.0" encoding="utf-8"?><Error><Code>InternalError</Code>'
    b"<Message>The server encountered an internal error (the test cut it).</Message></Error>"
)


def azurite_path() -> str:
    """Azurite's blob service: ``$CLOUDTRAIN_TEST_AZURITE`` or on PATH (skip or fail)."""
    from tests.integration.conftest import require

    found = os.environ.get("CLOUDTRAIN_TEST_AZURITE") or shutil.which("azurite-blob")
    require(
        bool(found) and os.access(str(found), os.X_OK),
        "no Azurite: npm install azurite@3.37.0 and set CLOUDTRAIN_TEST_AZURITE to its "
        "node_modules/.bin/azurite-blob (.ci/run does)",
    )
    return str(found)


class Azurite:
    """An Azurite blob service in a folder of its own, on the port the OS gave it; a context
    manager that stops it. `extra`: more flags (``--oauth basic``, ``--cert``, ``--key``)."""

    def __init__(self, *extra: str) -> None:
        program = azurite_path()  # first: a skip here leaves no folder behind
        self._folder = tempfile.TemporaryDirectory(prefix="azurite-")
        folder = Path(self._folder.name)
        self._log = folder / "azurite.log"
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(
                [program, "--blobHost", "127.0.0.1", "--blobPort", "0", *FLAGS, *extra],
                cwd=folder, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            self.base = self._wait()
        except BaseException:
            self.close()
            raise

    def _wait(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = _LISTENS.search(self._log.read_text(errors="replace"))
            if found:
                return f"{found[1]}://127.0.0.1:{found[2]}"
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(
            f"Azurite did not start: {self._log.read_text(errors='replace')[-2000:]}"
        )

    @property
    def port(self) -> int:
        return int(self.base.rpartition(":")[2])

    def client(self) -> BlobServiceClient:
        """A client of its account, straight to it, with the account's key."""
        credential = AzureNamedKeyCredential(ACCOUNT, KEY)
        return BlobServiceClient(f"{self.base}/{ACCOUNT}", credential=credential, retry_total=0)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._folder.cleanup()

    def __enter__(self) -> Azurite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _key(path: str) -> str:
    """The whole key (``CONTAINER/blob``) of a path-style URL's path (``/ACCOUNT/…``)."""
    return unquote(urlsplit(path).path).lstrip("/").partition("/")[2]


def seen_of(method: str, target: str, headers: Message, body: bytes) -> list[Seen]:
    """A request in the contract's terms. A block upload is its blocks, each a write, and
    the block list that commits them is ``other``; a batch is its deletes, one each."""
    host = headers.get("Host", "")
    query = parse_qs(urlsplit(target).query, keep_blank_values=True)
    comp = query.get("comp", [""])[0]
    key = _key(target)
    container, _, blob = key.partition("/")
    if comp == "batch":
        keys = [_key(m[2].decode()) for m in _SUB_REQUEST.finditer(body)]
        return [Seen("delete", k, None, host) for k in keys] or [Seen("other", "", None, host)]
    if not blob:  # the account or a container
        return [Seen("list" if comp == "list" and container else "other", "", None, host)]
    source = headers.get("x-ms-copy-source")
    if source and method == "PUT":
        return [Seen("copy", key, _key(source), host)]
    action = {
        "GET": "read" if not comp else "other",
        "PUT": "write" if comp in ("", "block") else "other",
        "DELETE": "delete" if not comp else "other",
    }.get(method, "other")
    return [Seen(action, key, None, host)]


class Recorder(ThreadingHTTPServer):
    """The proxy: every request recorded in `seen`, forwarded to `upstream` as it came unless
    `fail` picks it."""

    daemon_threads = True

    def __init__(self, upstream: int) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream = upstream
        self.recording = Recording()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Recorder

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding"):
            self._answer(411, b"", "the recorder takes bodies with a Content-Length")
            return
        body = self.rfile.read(length) if length else b""
        seen = seen_of(self.command, self.path, self.headers, body)
        if self.server.recording.record(*seen):
            self._answer(500, _FAILED, "InternalError")
            return
        self._forward(body)

    do_PUT = do_POST = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _answer(self, status: int, body: bytes, code: str) -> None:
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-ms-error-code", code)
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self, body: bytes) -> None:
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=60)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                upstream.putheader(name, value)
            upstream.endheaders(body or None)
            answer = upstream.getresponse()
            self.send_response_only(answer.status, answer.reason)
            length = answer.getheader("Content-Length")
            whole = None
            if length is None and self.command != "HEAD" and answer.status not in (204, 304):
                whole = answer.read()
                self.send_header("Content-Length", str(len(whole)))
            for name, value in answer.getheaders():
                if name.lower() not in _HOP:
                    self.send_header(name, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            if whole is not None:
                self.wfile.write(whole)
                return
            while chunk := answer.read(1 << 16):  # as it comes: a reader may stop early
                self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            upstream.close()


class AzureBlobStandIn(Recorded):
    """The contract's `StoreStandIn` over Azurite's account ``devstoreaccount1``."""

    url = f"az://{ACCOUNT}/{CONTAINER}/runs/bert"
    prefix = f"{CONTAINER}/runs/bert"

    def __init__(
        self, recorder: Recorder, direct: BlobServiceClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self._direct = direct
        self._monkeypatch = monkeypatch
        self.recording = recorder.recording

    def keys(self) -> set[str]:
        return {
            f"{c.name}/{name}"
            for c in self._direct.list_containers()
            for name in self._direct.get_container_client(c.name).list_blob_names()
        }

    def body(self, key: str) -> bytes:
        container, _, name = key.partition("/")
        return self._direct.get_blob_client(container, name).download_blob().readall()

    def put(self, key: str, data: bytes) -> None:
        container, _, name = key.partition("/")
        self._direct.get_blob_client(container, name).upload_blob(data, overwrite=True)

    def missing(self) -> tuple[str, str]:
        return f"az://{ACCOUNT}/no-such-container/x", "ContainerNotFound"

    def unreachable(self) -> str:
        self._monkeypatch.setenv("CLOUDTRAIN_AZURE_BLOB_ENDPOINT", "http://127.0.0.1:9/{account}")
        return "ConnectionError"


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[tuple[Recorder, BlobServiceClient]]:
    """Azurite and the recorder in front of it, for the session; a client straight to it."""
    with Azurite() as azurite:
        recorder = Recorder(azurite.port)
        thread = threading.Thread(target=recorder.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        direct = azurite.client()
        try:
            yield recorder, direct
        finally:
            direct.close()
            recorder.shutdown()
            recorder.server_close()
            thread.join(timeout=10)


@pytest.fixture
def azure_store(
    azurite_server: tuple[Recorder, BlobServiceClient], monkeypatch: pytest.MonkeyPatch
) -> AzureBlobStandIn:
    """Azurite emptied, with container ``ckpts`` made; azure-storage-blob in this process
    pointed at the recorder with the account's key, and no retries."""
    recorder, direct = azurite_server
    for container in direct.list_containers():
        direct.delete_container(container.name)
    direct.create_container(CONTAINER)
    monkeypatch.setenv(
        "CLOUDTRAIN_AZURE_BLOB_ENDPOINT", f"http://127.0.0.1:{recorder.port}/{{account}}"
    )
    monkeypatch.setenv("AZURE_STORAGE_KEY", KEY)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    monkeypatch.setattr("cloudtrain.providers.azure._store.RETRIES", 0)
    recorder.recording.reset()
    return AzureBlobStandIn(recorder, direct, monkeypatch)
