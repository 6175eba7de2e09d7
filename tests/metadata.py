"""A local stand-in for the three clouds' instance metadata endpoints, as far as preemption
notices go, with the checks the real ones make (IMDSv2's token, GCP's ``Metadata-Flavor``,
Azure's ``Metadata: true``) and controls for a test to announce a preemption."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Metadata:
    """What the endpoints answer; a test sets `aws_action`, `gcp_preempted`, `azure_events`
    (through `announce` for the one whose clients are waiting)."""

    def __init__(self) -> None:
        self.aws_action: dict[str, str] | None = None
        self.aws_tokens: set[str] = set()
        self.gcp_preempted = False
        self.gcp_version = 1
        self.azure_events: list[dict[str, Any]] = []
        self.azure_vm = "vm-0"  # the name Azure's instance/compute gives the node's VM
        self.changed = threading.Condition()
        self.requests: list[tuple[str, str]] = []

    def announce(self, source: str, vm: str = "vm-0") -> float:
        """Announce a preemption through `source` (`cloudtrain.node.notices.ENDPOINTS`); the
        monotonic time it was announced."""
        with self.changed:
            if source == "imdsv2":
                self.aws_action = {"action": "terminate", "time": "2026-12-02T10:00:00Z"}
            elif source == "gce-metadata":
                self.gcp_preempted, self.gcp_version = True, self.gcp_version + 1
            else:
                self.azure_events.append({
                    "EventId": str(uuid.uuid4()), "EventType": "Preempt",
                    "ResourceType": "VirtualMachine", "Resources": [vm],
                    "EventStatus": "Scheduled", "NotBefore": "Wed, 02 Dec 2026 10:00:30 GMT",
                })  # fmt: skip
            self.changed.notify_all()
        return time.monotonic()


def _handler(meta: Metadata) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: str = "", **headers: str) -> None:
            data = body.encode()
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            meta.requests.append(("PUT", self.path))
            if self.path != "/latest/api/token":
                return self._answer(404)
            if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._answer(400, "missing ttl")
            token = uuid.uuid4().hex
            meta.aws_tokens.add(token)
            return self._answer(200, token)

        def do_GET(self) -> None:
            meta.requests.append(("GET", self.path))
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if url.path == "/latest/meta-data/spot/instance-action":
                if self.headers.get("X-aws-ec2-metadata-token") not in meta.aws_tokens:
                    return self._answer(401)
                if meta.aws_action is None:
                    return self._answer(404, "Not Found")
                return self._answer(200, json.dumps(meta.aws_action))
            if url.path == "/computeMetadata/v1/instance/preempted":
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403, "Missing Metadata-Flavor:Google header.")
                if query.get("wait_for_change") == "true":
                    deadline = time.monotonic() + float(query.get("timeout_sec", "60"))
                    with meta.changed:
                        while (str(meta.gcp_version) == query.get("last_etag")
                               and time.monotonic() < deadline):  # fmt: skip
                            meta.changed.wait(deadline - time.monotonic())
                value = "TRUE" if meta.gcp_preempted else "FALSE"
                return self._answer(200, value, ETag=str(meta.gcp_version))
            if url.path == "/metadata/scheduledevents":
                if self.headers.get("Metadata") != "true":
                    return self._answer(400, json.dumps({"error": "Bad request"}))
                doc = {"DocumentIncarnation": len(meta.azure_events), "Events": meta.azure_events}
                return self._answer(200, json.dumps(doc))
            if url.path == "/metadata/instance/compute":
                if self.headers.get("Metadata") != "true":
                    return self._answer(400, json.dumps({"error": "Bad request"}))
                vm_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, meta.azure_vm))
                compute = {"name": meta.azure_vm, "vmId": vm_id, "location": "eastus"}
                return self._answer(200, json.dumps(compute))
            return self._answer(404)

    return Handler


@contextmanager
def serving() -> Iterator[tuple[str, Metadata]]:
    """(endpoint URL, the `Metadata` it answers from), on a free port of 127.0.0.1."""
    meta = Metadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(meta))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", meta
    finally:
        with meta.changed:
            meta.changed.notify_all()
        server.shutdown()
        server.server_close()
