"""`cloudtrain dashboard`: a page on this machine of the clusters, their cost so far, the jobs
with their loss curves, and the event log, served from the state while the command runs. No
server to keep, nothing from the network: the page (``cloudtrain/data/dashboard.html``) draws
its own SVG charts.

=====================  ==========================================================================
this user only         it listens on 127.0.0.1 alone; every request needs its random token, in
                       a cookie (HttpOnly, SameSite=Strict), compared in constant time; another
                       local user gets 403 and nothing else
no token in a URL      the token never appears in a URL or a command line (a browser's argv is
                       everyone's to read through ``ps``): `login_url` is a one-time link (a
                       random nonce, spent at its first use, void after `LOGIN_S`) that sets
                       the cookie and redirects to the page
no rebinding           a request whose ``Host`` is not ``127.0.0.1:PORT`` or ``localhost:PORT`` is
                       refused (a web page elsewhere cannot reach it through a DNS name)
no script from data    names and messages reach the page as JSON and are put in as text, never as
                       markup; the page's Content-Security-Policy allows only its own script
                       (by nonce) and requests to itself; no Referer carries the token away
live                   every `PULL_S`, off the requests' threads, each running job is polled on
                       its nodes (`poll`: its metrics copied, `Coordinator.pull_metrics`; its
                       end recorded as its nodes saw it, `Coordinator.refresh`), so a detached
                       job's curves grow and its end shows with no other command run
=====================  ==========================================================================

API (JSON, same cookie): ``/api/state`` (clusters, jobs, the newest events) and
``/api/metrics?job=ID`` (that job's lines, `cloudtrain.jobs.metrics`).
"""

from __future__ import annotations

import contextlib
import hmac
import http.cookies
import http.server
import json
import logging
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from email.message import Message
from importlib import resources
from pathlib import Path
from typing import Any

from cloudtrain import cost
from cloudtrain.jobs import metrics
from cloudtrain.state import State

__all__ = ["LOGIN_S", "PULL_S", "Dashboard", "snapshot"]

log = logging.getLogger(__name__)
PULL_S = 5.0
#: How long a connection may keep a handler waiting for its request (a browser's speculative
#: connection that never asks anything).
IDLE_S = 30.0
EVENTS = 50
JOBS = 50
COOKIE = "cloudtrain_dashboard"
#: The one-time link's path, and how long a link not used yet stays good.
LOGIN, LOGIN_S = "/login", 120.0
SPENT = (
    f"this link was used already or is too old (a link works once, for {LOGIN_S / 60:g} "
    "minutes): press Enter where `cloudtrain dashboard` runs for a new one"
).encode()


def snapshot(state: State, home: Path, now: float) -> dict[str, Any]:
    """What the page shows, from `state`: clusters with their cost so far, the newest `JOBS`
    jobs, the newest `EVENTS` events."""
    clusters = []
    for rec in state.clusters():
        spent = cost.spent(state.spans(rec.name), now, rec.name, made_at=rec.created_at)
        clusters.append({
            "name": rec.name,
            "provider": rec.provider,
            "status": rec.status,
            "nodes": len(state.nodes(rec.name)),
            "price_per_hour": rec.price_per_hour,
            "cost_so_far": float(cost.money(spent.cost)),
            "estimate": spent.estimate,
            "created_at": rec.created_at,
        })  # fmt: skip
    jobs = []
    for job in sorted(state.jobs(), key=lambda j: j.seq, reverse=True)[:JOBS]:
        step = (job.detail.get("progress") or {}).get("step")
        if job.status == "running":  # a detached job's step: from what it reported
            reported = metrics.latest(metrics.read(home, job.id)).get("step")
            step = max(step or 0, reported or 0) if step or reported else None
        jobs.append({
            "id": job.id,
            "cluster": job.cluster,
            "name": job.name,
            "status": job.status,
            "nodes": job.num_nodes,
            "created_at": job.created_at,
            "ended_at": job.ended_at,
            "recoveries": len(job.detail.get("recoveries") or []),
            "step": step,
        })  # fmt: skip
    events = [
        {"ts": e.ts, "cluster": e.cluster, "job": e.job_id, "kind": e.kind, "message": e.message}
        for e in state.events(limit=EVENTS)
    ]
    return {"now": now, "clusters": clusters, "jobs": jobs, "events": events}


class _Server(http.server.ThreadingHTTPServer):
    """A thread per connection, and every one of them ended by `server_close`: the
    connections still open are shut down (a handler waiting for a request wakes up) and their
    threads joined, so nothing of the server outlives it."""

    daemon_threads = False
    block_on_close = True

    def __init__(
        self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler]
    ) -> None:
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:  # not shut down by `server_close` while it is closed here
            self._open.discard(request)
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a connection cut (by the browser, or by `server_close`): no traceback on the terminal
        log.debug("dashboard: the connection from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        with self._open_lock:
            for conn in self._open:
                with contextlib.suppress(OSError):  # the client went first
                    conn.shutdown(socket.SHUT_RDWR)
        super().server_close()  # joins the connections' threads


class Dashboard:
    """The page's server on 127.0.0.1:`port` (0: one the system chose), for `home`'s state.
    `poll(job_id)` brings a running job's record up to date from its nodes (its metrics, how
    it ended); None: never."""

    def __init__(
        self, home: Path, port: int = 0, poll: Callable[[str], None] | None = None
    ) -> None:
        self.home = home
        self.token = secrets.token_urlsafe(24)  # the cookie's: never in a URL
        self._logins: dict[str, float] = {}  # one-time nonce → when it expires (monotonic)
        self._poll = poll
        self._stop = threading.Event()
        self._page = resources.files("cloudtrain.data").joinpath("dashboard.html").read_text()
        self.httpd = _Server(("127.0.0.1", port), self._handler())
        self._serving = False
        self._closed = False
        self._lock = threading.Lock()
        self.port = self.httpd.server_address[1]

    def login_url(self) -> str:
        """A new one-time link to the page: the first request of it gets the session cookie
        and a redirect to the page; it is spent then, and void after `LOGIN_S` unused."""
        nonce = secrets.token_urlsafe(24)
        with self._lock:
            now = time.monotonic()
            self._logins = {n: t for n, t in self._logins.items() if t > now}
            self._logins[nonce] = now + LOGIN_S
        return f"http://127.0.0.1:{self.port}{LOGIN}?once={nonce}"

    def spend(self, given: str) -> bool:
        """Whether `given` is a one-time nonce still good; it is not afterwards."""
        with self._lock:
            found = [n for n in self._logins if hmac.compare_digest(n.encode(), given.encode())]
            expires = self._logins.pop(found[0]) if found else 0.0
        return expires > time.monotonic()

    def serve(self) -> None:
        """Serve until `close` (or Ctrl-C in the caller); blocks."""
        with self._lock:
            if self._closed:
                return
            self._serving = True
        puller = threading.Thread(target=self._poll_running, daemon=True)
        puller.start()
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        finally:
            self._stop.set()

    def close(self) -> None:
        """Stop serving (from any thread; waits for `serve` to return, if it runs), end the
        connections still open and close the listening socket. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            serving = self._serving
        self._stop.set()
        if serving:  # shutdown() waits for serve_forever: never when it was not started
            self.httpd.shutdown()
        self.httpd.server_close()

    def _poll_running(self) -> None:
        if self._poll is None:
            return
        while not self._stop.wait(PULL_S):
            with State.open(self.home) as state:  # the jobs the page shows that run
                shown = sorted(state.jobs(), key=lambda j: j.seq, reverse=True)[:JOBS]
            for job_id in [j.id for j in shown if j.status == "running"]:
                if self._stop.is_set():
                    return
                try:
                    self._poll(job_id)
                except Exception as exc:  # a node that does not answer: next time
                    log.debug("could not poll the nodes of %s: %s", job_id, exc)

    # -- requests ----------------------------------------------------------------------------

    def own_host(self, headers: Message[str, str]) -> bool:
        return headers.get("Host") in (f"127.0.0.1:{self.port}", f"localhost:{self.port}")

    def allowed(self, headers: Message[str, str]) -> bool:
        """A request to this server's own name with the session cookie."""
        if not self.own_host(headers):
            return False
        try:
            cookies = http.cookies.SimpleCookie(headers.get("Cookie") or "")
        except http.cookies.CookieError:
            return False
        given = cookies[COOKIE].value if COOKIE in cookies else ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    def answer(self, path: str, query: Mapping[str, list[str]]) -> tuple[int, str, bytes, str]:
        """(status, content type, body, the page's script nonce or "") for a GET of `path`."""
        if path == "/":
            nonce = secrets.token_urlsafe(16)
            return (
                200,
                "text/html; charset=utf-8",
                self._page.replace("{{NONCE}}", nonce).encode(),
                nonce,
            )
        if path == "/api/state":
            with State.open(self.home) as state:
                body = snapshot(state, self.home, time.time())
            return 200, "application/json", json.dumps(body).encode(), ""
        if path == "/api/metrics":
            from cloudtrain.errors import ConfigError
            from cloudtrain.spec import validate_job_id

            try:
                job_id = validate_job_id((query.get("job") or [""])[0])
            except ConfigError as exc:
                return 400, "text/plain", str(exc).encode(), ""
            lines = metrics.read(self.home, job_id)
            return 200, "application/json", json.dumps(lines).encode(), ""
        return 404, "text/plain", b"not found", ""

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        dashboard = self

        class Handler(http.server.BaseHTTPRequestHandler):
            server_version = "cloudtrain"
            sys_version = ""
            timeout = IDLE_S

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                if url.path == LOGIN and dashboard.own_host(self.headers):
                    self._login((query.get("once") or [""])[0])
                    return
                if not dashboard.allowed(self.headers):
                    self._send(403, "text/plain", b"forbidden", "")
                    return
                try:
                    status, kind, body, nonce = dashboard.answer(url.path, query)
                except Exception as exc:  # the state is busy or broken: say so, keep serving
                    log.warning("dashboard: %s %s", type(exc).__name__, exc)
                    status, kind, body, nonce = 503, "text/plain", b"try again", ""
                self._send(status, kind, body, nonce)

            def _login(self, once: str) -> None:
                """A one-time link: the cookie and the page, once; a link spent or too old
                gets 403 (unless the browser holds the cookie already: the page)."""
                if not dashboard.spend(once) and not dashboard.allowed(self.headers):
                    self._send(403, "text/plain", SPENT, "")
                    return
                self.send_response(303)
                self.send_header("Location", "/")
                self.send_header("Content-Length", "0")
                self.send_header("Cache-Control", "no-store")
                self.send_header("Referrer-Policy", "no-referrer")
                self.send_header(
                    "Set-Cookie", f"{COOKIE}={dashboard.token}; HttpOnly; SameSite=Strict; Path=/"
                )
                self.end_headers()

            def _send(self, status: int, kind: str, body: bytes, nonce: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("Referrer-Policy", "no-referrer")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("X-Frame-Options", "DENY")
                policy = "default-src 'none'; connect-src 'self'; frame-ancestors 'none'"
                if nonce:
                    policy += f"; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'"
                self.send_header("Content-Security-Policy", policy)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("dashboard: " + format, *args)

        return Handler
