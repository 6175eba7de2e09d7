"""A local stand-in for Azure Resource Manager and its token endpoint, over HTTPS on 127.0.0.1.

The real SDK clients (azure-mgmt-*, azure-identity) talk to it unchanged: azure-core refuses
to send a bearer token over plain http, so it serves TLS with a certificate made for the test
(``ca_file``, trusted through ``REQUESTS_CA_BUNDLE``); azure-identity's client-secret flow finds
its token endpoint through ``AZURE_AUTHORITY_HOST`` and the OpenID document served here. Only a
token issued here opens the ARM routes (401 ``AuthenticationFailed`` otherwise).

Routes: resource groups (PUT, GET, HEAD, DELETE as a ``Location`` LRO, list with a tag
``$filter``), resources of any type under a group (PUT/GET/DELETE, list per group, VMs also per
subscription), ``Microsoft.Compute/skus`` (``$filter=location eq '…'``) and the operation
status of every ``Azure-AsyncOperation`` (``Retry-After: 0``; ``InProgress`` on the first poll).
The state and its rules live in `arm.Store`. Every request is recorded as a `Call`.
``add_raw_fault`` rules (`RawFault`) answer what ARM never sends: a proxy's HTML page, a body cut
short, a connection closed unanswered.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.azure.arm import SIZES, ArmError, Fault, Store
from tests.azure.routes import CLIENT_SECRET, SUBSCRIPTION, Routes
from tests.raw import send_raw
from tests.tls import certificate, serve_tls

__all__ = ["CLIENT_SECRET", "SUBSCRIPTION", "Call", "StandIn"]

TENANT = "standin-tenant"
CLIENT_ID = "standin-client"
LOCATIONS = ("eastus", "westus2")
MUTATING = frozenset({"PUT", "DELETE", "POST", "PATCH"})
MESSAGES = {
    "AllocationFailed": "Allocation failed. We do not have sufficient capacity for the "
    "requested VM size in this region.",
    "ZonalAllocationFailed": "Allocation failed. We do not have sufficient capacity for the "
    "requested VM size in this zone.",
    "OverconstrainedAllocationRequest": "Allocation failed. VM(s) with the following "
    "constraints cannot be allocated, because the condition is too restrictive.",
    "SkuNotAvailable": "The requested VM size is currently not available in this location.",
    "QuotaExceeded": "Operation could not be completed as it results in exceeding approved "
    "standardNDASv4_A100Family Cores quota. Current Limit: 0, Additional Required: 192.",
    "OperationNotAllowed": "Operation could not be completed as it results in exceeding "
    "approved Total Regional Cores quota. Location: eastus, Current Limit: 100, Current "
    "Usage: 0, Additional Required: 192.",
    "AuthorizationFailed": "The client does not have authorization to perform action "
    "'Microsoft.Compute/virtualMachines/write'.",
}


@dataclass(frozen=True)
class Call:
    """One request as the stand-in saw it."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int
    host: str

    @property
    def kind(self) -> str:
        """The resource type the call is about (``virtualMachines``), ``token``, ``operation``."""
        parts = [p for p in self.path.split("/") if p]
        if "oauth2" in parts or ".well-known" in parts:
            return "token"
        if "operations" in parts or "operationresults" in parts:
            return "operation"
        if len(parts) in (3, 4) and parts[2].lower() == "resourcegroups":
            return "resourceGroups"
        if len(parts) >= 11 and parts[8].lower() == "providers":  # one resource's own scope
            return parts[10]
        return parts[6] if len(parts) >= 7 else parts[-1]


@dataclass
class RawFault:
    """Answer matching requests (`method` and `kind` as `Call` has them; None: any) with
    `body` as sent — not an ARM error.

    ``length``, when set, is the ``Content-Length`` claimed (more than ``body`` to cut it
    short: the connection closes after ``body``); ``drop`` closes the connection without
    answering. ``times`` uses (None: always); ``hits`` counts the answers given."""

    method: str | None = "GET"
    kind: str | None = "virtualMachines"
    status: int = 502
    body: bytes = b""
    content_type: str = "text/html"
    length: int | None = None
    drop: bool = False
    times: int | None = None
    hits: int = 0

    def applies(self, call: Call) -> bool:
        return (
            self.times != 0
            and self.method in (None, call.method)
            and (self.kind is None or self.kind.lower() == call.kind.lower())
        )


class StandIn(Routes):
    """The server and its state. Use as a context manager; `reset` between tests."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="azure-standin-")
        self.ca_file, key_file = certificate(Path(self._folder.name), "cloudtrain azure stand-in")
        self.lock = threading.RLock()
        self.store = Store(SUBSCRIPTION)
        self.calls: list[Call] = []
        self.tokens: set[str] = set()
        self.identities: dict[str, str] = {}
        self.token_error: str | None = None
        self.page_size = 50
        self.retry_after = "0"
        self.reset()
        handler = type("Handler", (_Handler,), {"standin": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.socket = serve_tls(self.server.socket, self.ca_file, key_file)
        self.port = self.server.server_address[1]
        self.base = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._folder.cleanup()

    def env(self) -> dict[str, str]:
        """What a process needs to reach only this stand-in, with a client-secret credential."""
        return {
            "CLOUDTRAIN_SSH_LOOPBACK_ONLY": "1",  # its VMs' addresses are invented
            "CLOUDTRAIN_AZURE_ENDPOINT": self.base,
            "AZURE_AUTHORITY_HOST": self.base,
            "AZURE_TENANT_ID": TENANT,
            "AZURE_CLIENT_ID": CLIENT_ID,
            "AZURE_CLIENT_SECRET": CLIENT_SECRET,
            "AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
            "REQUESTS_CA_BUNDLE": str(self.ca_file),
            "SSL_CERT_FILE": str(self.ca_file),
            # managed identity, next in the default chain, probes this instead of 169.254.169.254
            "AZURE_POD_IDENTITY_AUTHORITY_HOST": "http://127.0.0.1:9",
        }

    def reset(self) -> None:
        """Empty: no resources, calls, faults or tokens; every size in every location."""
        with self.lock:
            self.store = Store(SUBSCRIPTION)
            self.store.skus = {loc: {s: ["1", "2", "3"] for s in SIZES} for loc in LOCATIONS}
            self.calls.clear()
            self.raw_faults: list[RawFault] = []
            self.tokens.clear()
            self.identities.clear()
            self.token_error = None
            self.page_size = 50
            #: ``Retry-After`` of every LRO answer: "0", which azure-core reads as no header (its
            #: 30 s default unless the client's polling interval is 0: ``poll_s``/
            #: ``CLOUDTRAIN_AZURE_POLL_S``). Whole seconds only: azure-mgmt-network parses an int.
            self.retry_after = "0"

    # -- rules ----------------------------------------------------------------------------

    def add_fault(
        self,
        code: str,
        *,
        status: int = 409,
        region: str | None = None,
        zone: str | None = None,
        method: str | None = "PUT",
        kind: str | None = "virtualMachines",
        times: int | None = None,
        message: str | None = None,
    ) -> None:
        """Answer `code` to matching requests. Allocation codes (`arm.ASYNC_CODES`) arrive
        in the finished operation of a VM PUT; the rest as the request's own error."""
        text = message or MESSAGES.get(code, f"injected {code}")
        with self.lock:
            self.store.faults.append(
                Fault(
                    code, text, status, method, kind.lower() if kind else None, region, zone, times
                )
            )

    def add_raw_fault(self, **kwargs: Any) -> RawFault:
        """Adds a `RawFault` rule; it answers before anything else (the token check too)."""
        fault = RawFault(**kwargs)
        with self.lock:
            self.raw_faults.append(fault)
        return fault

    def raw_fault(self, method: str, url: str, headers: dict[str, str]) -> RawFault | None:
        """The `RawFault` that answers this request (recorded as a `Call`), or None."""
        parts = urlsplit(url)
        call = Call(
            method, parts.path, dict(parse_qsl(parts.query)), None, 0, headers.get("host", "")
        )
        with self.lock:
            for fault in self.raw_faults:
                if fault.applies(call):
                    fault.hits += 1
                    if fault.times is not None:
                        fault.times -= 1
                    status = 0 if fault.drop else fault.status
                    self.calls.append(dataclasses.replace(call, status=status))
                    return fault
        return None

    def restrict(self, size: str, location: str, zones: list[str] | None = None) -> None:
        """The subscription may not use `size` in `zones` of `location` (a ``Zone``
        restriction), or anywhere in it (`zones` None: a ``Location`` restriction)."""
        with self.lock:
            offered = self.store.skus[location]
            if zones is None:
                offered[size] = None
            else:
                offered[size] = [z for z in offered.get(size) or [] if z not in zones]

    # -- views ----------------------------------------------------------------------------

    def requests(self, method: str | None = None, kind: str | None = None) -> list[Call]:
        with self.lock:
            return [
                c
                for c in self.calls
                if (method is None or c.method == method)
                and (kind is None or c.kind.lower() == kind.lower())
            ]

    def mutations(self) -> list[str]:
        """``"PUT virtualMachines/exp1-0"``… for every accepted ARM mutation, in order."""
        return [
            f"{c.method} {c.kind}/{c.path.rstrip('/').rsplit('/', 1)[1]}"
            for c in self.requests()
            if c.method in MUTATING and c.kind != "token" and c.status < 300
        ]

    def leftovers(self) -> dict[str, list[str]]:
        """Every resource still there, by type (resource groups included): empty when clean."""
        with self.lock:
            found: dict[str, list[str]] = {}
            for resource in self.store.resources.values():
                kind = str(resource["type"]).rsplit("/", 1)[1]
                found.setdefault(kind, []).append(str(resource["name"]))
            return found

    def resource(self, rid_suffix: str) -> dict[str, Any]:
        """The resource whose id ends with `rid_suffix` (case-insensitive)."""
        with self.lock:
            return next(
                r for k, r in self.store.resources.items() if k.endswith(rid_suffix.lower())
            )

    # -- serving --------------------------------------------------------------------------

    def handle(
        self, method: str, url: str, body: Any, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        with self.lock:
            try:
                status, extra, out = self._route(method, parts.path, query, body, headers)
            except ArmError as exc:
                status, extra = exc.status, {}
                out = {"error": {"code": exc.code, "message": exc.message}}
            self.calls.append(
                Call(method, parts.path, query, body, status, headers.get("host", ""))
            )
        return status, extra, out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    standin: StandIn

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length).decode() if length else ""
        try:
            body: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw
        headers = {k.lower(): v for k, v in self.headers.items()}
        fault = self.standin.raw_fault(self.command, self.path, headers)
        if fault is not None:
            send_raw(self, fault)
            return
        status, extra, out = self.standin.handle(self.command, self.path, body, headers)
        data = b"" if out is None else json.dumps(out).encode()
        self.send_response(status)
        for key, value in extra.items():
            self.send_header(key, value)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_DELETE = do_POST = do_PATCH = do_HEAD = _serve

    def log_message(self, *args: object) -> None:
        pass
