"""A local stand-in for the GCE REST API (a subset) and Google's OAuth token endpoint.

``StandIn`` serves `gce.Gce` over HTTP on 127.0.0.1 from a thread of the test process, so a
test can change the rules while a CLI subprocess talks to it. The real google-cloud-compute
client drives it (REST transport: request serialisation, paging, error parsing), with
credentials google-auth reads from a ``service_account`` file (a key made per session) whose
``token_uri`` is this server: every API call must carry a token it issued or a JWT signed by
that key, or it answers 401. (google-auth 2.63 ignores ``token_uri`` in an ``authorized_user``
file: it always asks oauth2.googleapis.com.) It

- **records** every request as a ``Call`` (``calls("instances.bulkInsert")``), the token
  requests and operation polls included, with the ``Host`` it was sent to;
- **injects faults** from ``add_fault`` rules: an HTTP error answer to the call, or
  (``in_operation=True``) a call that succeeds and an operation that finishes with the error —
  where GCE reports capacity; and from ``add_raw_fault`` rules (`RawFault`), what no Google
  API sends: a proxy's HTML page, a body cut short, a connection closed unanswered;
- lists what is left of a cluster (``leftovers``): instances, disks, firewall rules, policies.
"""

from __future__ import annotations

import json
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.gcp import routes
from tests.gcp.gce import ApiError, Gce
from tests.raw import send_raw

PROJECT = "standin-project"
#: Where a node's guest "powers off" (``POST /_guest/ZONE/NAME``): no GCE API, no credential.
GUEST = "/_guest/"
TOKEN_PREFIX = "ya29.standin-"
ACCOUNT = f"cloudtrain-tests@{PROJECT}.iam.gserviceaccount.com"
MESSAGES = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (
        503,
        "The zone '{zone}' does not have enough resources "
        "available to fulfill the request.  Try a different zone, "
        "or try again later.",
    ),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (
        503,
        "The zone '{zone}' does not have enough "
        "resources available to fulfill the request. "
        " '(resource type:compute)'.",
    ),
    "UNSUPPORTED_OPERATION": (400, "The selected machine type is not supported in {zone}."),
    "QUOTA_EXCEEDED": (403, "Quota '{quota}' exceeded.  Limit: 0.0 globally."),
}


@dataclass(frozen=True)
class Call:
    """One request as the stand-in received it; ``name`` is the API method
    (``instances.bulkInsert``, ``zoneOperations.wait``, ``oauth.token`` …)."""

    name: str
    method: str
    path: str
    query: dict[str, str]
    body: Any
    host: str
    zone: str | None = None


@dataclass
class Fault:
    """Answer `call` (in `zone`, or anywhere) with `code`; ``times`` uses (None: always)."""

    call: str
    code: str
    zone: str | None = None
    in_operation: bool = False
    status: int | None = None
    quota: str = "GPUS_ALL_REGIONS"
    times: int | None = None
    partial: int = 0  # instances a failed bulkInsert leaves behind (GCE should leave none)

    def applies(self, call: Call) -> bool:
        return self.call in (call.name, "*") and self.zone in (None, call.zone) and self.times != 0

    def error(self, zone: str | None) -> tuple[int, str]:
        status, template = MESSAGES.get(self.code, (403, f"{self.code}: not allowed"))
        where = f"projects/{PROJECT}/zones/{zone}"
        return self.status or status, template.format(zone=where, quota=self.quota)


@dataclass
class RawFault:
    """Answer `call` (an API method name, or ``*``) with `body` as sent — not a GCE error.

    ``length``, when set, is the ``Content-Length`` claimed (more than ``body`` to cut it
    short: the connection closes after ``body``); ``drop`` closes the connection without
    answering. ``times`` uses (None: always); ``hits`` counts the answers given."""

    call: str
    status: int = 502
    body: bytes = b""
    content_type: str = "text/html"
    length: int | None = None
    drop: bool = False
    times: int | None = None
    hits: int = 0


class StandIn:
    """The server; a context manager. ``env()`` is what points google-auth and cloudtrain
    at it; ``reset()`` empties it between tests."""

    def __init__(self, page_size: int = 2) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.standin = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self.lock = threading.RLock()
        self.page_size = page_size
        self._folder = Path(tempfile.mkdtemp(prefix="gcp-standin-"))
        self.credentials_file = self._folder / "credentials.json"
        self.private_key, public_pem = _rsa_key()
        self.credentials_file.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": PROJECT,
                    "private_key_id": "standin-key",
                    "private_key": self.private_key,
                    "client_email": ACCOUNT,
                    "client_id": "1234567890",
                    "token_uri": f"{self.url}/token",
                }
            )
        )
        self.public_pem = public_pem
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.reset()

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.credentials_file.unlink(missing_ok=True)
        self._folder.rmdir()

    def reset(self) -> None:
        with self.lock:
            self.gce = Gce(PROJECT, self.url)
            self.faults: list[Fault] = []
            self.raw_faults: list[RawFault] = []
            self.log: list[Call] = []
            self.token_error: str | None = None
            self.tokens = 0

    def env(self) -> dict[str, str]:
        """What a process needs to reach only this stand-in; SSH is held to loopback (the
        stand-in's instance addresses are invented)."""
        return {
            "CLOUDTRAIN_SSH_LOOPBACK_ONLY": "1",
            "CLOUDTRAIN_GCP_ENDPOINT": self.url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(self.credentials_file),
            "CLOUDSDK_CORE_PROJECT": PROJECT,
        }

    def add_fault(self, call: str, code: str, **kwargs: Any) -> Fault:
        fault = Fault(call, code, **kwargs)
        with self.lock:
            self.faults.append(fault)
        return fault

    def add_raw_fault(self, call: str, **kwargs: Any) -> RawFault:
        """Adds a `RawFault` rule; it answers before any `Fault` (and before the 401 check)."""
        fault = RawFault(call, **kwargs)
        with self.lock:
            self.raw_faults.append(fault)
        return fault

    def raw_fault(self, method: str, target: str, host: str) -> RawFault | None:
        """The `RawFault` that answers this request (recorded as a `Call`), or None."""
        parts = urlsplit(target)
        if parts.path.startswith(GUEST):
            return None
        with self.lock:
            if parts.path == "/token":
                name, zone = "oauth.token", None
            else:
                name, zone, _, _ = routes.route(method, parts.path, self.gce)
            for fault in self.raw_faults:
                if fault.call in (name, "*") and fault.times != 0:
                    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                    self.log.append(Call(name, method, parts.path, query, None, host, zone))
                    fault.hits += 1
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    def calls(self, name: str | None = None) -> list[Call]:
        with self.lock:
            return [c for c in self.log if name is None or c.name == name]

    def leftovers(self, cluster: str | None = None) -> dict[str, list[str]]:
        """What of `cluster` (or of anything, when None) exists, by kind."""
        mine = (
            (lambda labels: True)
            if cluster is None
            else (lambda labels: labels.get("cloudtrain-cluster") == cluster)
        )
        prefix = "cloudtrain-" if cluster is None else f"cloudtrain-{cluster}"
        with self.lock:
            g = self.gce
            return {
                "instances": sorted(
                    n for (_, n), i in g.instances.items() if mine(i.get("labels", {}))
                ),
                "disks": sorted(n for (_, n), d in g.disks.items() if mine(d["labels"])),
                "firewalls": sorted(
                    n
                    for n in g.firewalls
                    if n.startswith(f"{prefix}-") or (cluster is None and n.startswith(prefix))
                ),
                "policies": sorted(
                    n
                    for (_, n) in g.policies
                    if n == prefix or (cluster is None and n.startswith(prefix))
                ),
            }

    def delete_instance(self, name: str) -> None:
        """Delete an instance behind the client's back (as in the console), its disk with it."""
        with self.lock:
            zone = next(z for z, n in self.gce.instances if n == name)
            self.gce.delete_instance(zone, name)
            self.gce.tick()

    def is_empty(self, cluster: str | None = None) -> bool:
        return not any(self.leftovers(cluster).values())

    # -- one request ------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, host: str, auth: str, raw: bytes
    ) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        body = json.loads(raw) if raw and parts.path != "/token" else None
        with self.lock:
            self.gce.tick()
            if parts.path == "/token":
                self.log.append(Call("oauth.token", method, parts.path, query, None, host))
                return self._token()
            if parts.path.startswith(GUEST):  # not an API: the hypervisor, for a guest's halt
                self.log.append(Call("guest.poweroff", method, parts.path, query, None, host))
                return self._guest_power_off(parts.path.removeprefix(GUEST))
            name, zone, args, handler = routes.route(method, parts.path, self.gce)
            call = Call(name, method, parts.path, query, body, host, zone)
            self.log.append(call)
            try:
                if not self._authorised(auth):
                    raise ApiError(
                        401,
                        "authError",
                        "Request is missing required authentication "
                        "credential. Expected OAuth 2 access token.",
                    )
                fault = next((f for f in self.faults if f.applies(call)), None)
                if fault is not None:
                    if fault.times is not None:
                        fault.times -= 1
                    status, message = fault.error(zone)
                    if not fault.in_operation:
                        raise ApiError(status, fault.code, message)
                    return 200, routes.failed(self.gce, call, fault, status, message)
                return 200, handler(self.gce, call, args, self.page_size)
            except ApiError as exc:
                return exc.status, exc.body()

    def _guest_power_off(self, where: str) -> tuple[int, dict[str, Any]]:
        """What GCE does when an instance's guest powers off: the instance is TERMINATED (it
        bills no compute; its disks stay and bill), never deleted."""
        zone, _, name = where.partition("/")
        inst = self.gce.instances.get((zone, name))
        if inst is None:
            return 404, {"error": f"no instance {where}"}
        inst["status"] = "TERMINATED"
        return 200, {"status": inst["status"]}

    def _authorised(self, header: str) -> bool:
        """A token this server issued, or a JWT signed by the credentials' key (google-auth
        signs its own JWTs for service accounts, then no token request is made)."""
        scheme, _, token = header.partition(" ")
        if scheme != "Bearer":
            return False
        if token.startswith(TOKEN_PREFIX):
            return True
        from google.auth import exceptions, jwt

        try:
            claims = jwt.decode(token, certs=self.public_pem, verify=True, clock_skew_in_seconds=60)
        except (exceptions.GoogleAuthError, ValueError):
            return False
        return bool(claims.get("iss") == ACCOUNT)

    def _token(self) -> tuple[int, dict[str, Any]]:
        if self.token_error:
            return 400, {"error": self.token_error, "error_description": "Bad Request"}
        self.tokens += 1
        return 200, {
            "access_token": f"{TOKEN_PREFIX}{self.tokens}",
            "expires_in": 3600,
            "token_type": "Bearer",
        }


def _rsa_key() -> tuple[str, str]:
    """A fresh RSA key for the stand-in's service account: (private PEM, public PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public.decode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        standin: StandIn = self.server.standin  # type: ignore[attr-defined]
        fault = standin.raw_fault(self.command, self.path, self.headers.get("Host", ""))
        if fault is not None:
            send_raw(self, fault)
            return
        status, body = standin.handle(
            self.command,
            self.path,
            self.headers.get("Host", ""),
            self.headers.get("Authorization", ""),
            raw,
        )
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PATCH = _serve

    def log_message(self, *args: object) -> None:
        pass
