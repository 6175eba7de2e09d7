"""Preemption notices, read on the node from its cloud's own metadata endpoint. Stdlib only.

Named by the protocol, not the cloud (a provider says which its nodes speak)::

    source            where                                                     warning
    imdsv2            PUT /latest/api/token, then GET /latest/meta-data/        two minutes
                      spot/instance-action with the token: 404 until the
                      interruption is scheduled, then {"action": ..., "time": ...}
    gce-metadata      GET /computeMetadata/v1/instance/preempted               about 30 s
                      (Metadata-Flavor: Google): FALSE, then TRUE; with
                      wait_for_change and the last ETag it hangs until it changes
    scheduled-events  GET /metadata/scheduledevents (Metadata: true): an        at least 30 s
                      event Preempt whose Resources name this VM (its name
                      from GET /metadata/instance/compute)

`watch` asks its source again and again (gce-metadata's request hangs, so it answers at
once) and hands the first notice to its caller; the agent (`cloudtrain.node`) records it and
tells the job. A source that does not answer (the endpoint is briefly away) is asked again: a
watcher never dies of it. Nothing here acknowledges an event (that would start it early).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: Where a node's notice is written (in the node's root): the runtime and the coordinator read it.
NOTICE_FILE = "preemption.json"
#: The signal a job's process gets on a notice, if it catches it (its default would kill).
NOTICE_SIGNAL_NAME = "SIGUSR1"

IMDSV2, GCE_METADATA, SCHEDULED_EVENTS = "imdsv2", "gce-metadata", "scheduled-events"
#: Each source's link-local endpoint on a node.
ENDPOINTS = {
    IMDSV2: "http://169.254.169.254",
    GCE_METADATA: "http://metadata.google.internal",
    SCHEDULED_EVENTS: "http://169.254.169.254",
}


@dataclass(frozen=True)
class Notice:
    """A cloud said it will take the node away."""

    #: the protocol it came by (`ENDPOINTS`)
    source: str
    #: what it will do: terminate, stop, hibernate (imdsv2), preempt
    action: str
    #: when, as the cloud wrote it (None where it does not say)
    not_before: str | None = None
    noticed_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Source(Protocol):
    """One cloud's notice, asked once: the notice, or None when there is none yet."""

    def poll(self) -> Notice | None: ...


def _request(
    url: str, *, headers: dict[str, str], method: str = "GET", timeout: float = 2.0
) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of one request; a 4xx/5xx answer is a status, not an error.
    Never through a proxy (``http_proxy`` on a node must not see metadata requests).
    ``urllib.request`` is imported here: `up` imports this module for its names only."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=headers, method=method)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(req, timeout=timeout) as answer:
            return answer.status, answer.read().decode(errors="replace"), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), dict(exc.headers or {})


class Imdsv2:
    """Instance metadata, version 2 (a session token is required)."""

    TTL_S = 21600

    def __init__(self, endpoint: str = ENDPOINTS[IMDSV2], timeout: float = 2.0) -> None:
        self.endpoint, self.timeout = endpoint.rstrip("/"), timeout
        self._token: str | None = None

    def _fresh_token(self) -> str:
        status, body, _ = _request(
            f"{self.endpoint}/latest/api/token",
            method="PUT",
            timeout=self.timeout,
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TTL_S)},
        )
        if status != 200:
            raise OSError(f"IMDSv2 token: HTTP {status}")
        return body

    def poll(self) -> Notice | None:
        for _ in range(2):  # an expired token is replaced once
            self._token = self._token or self._fresh_token()
            status, body, _ = _request(
                f"{self.endpoint}/latest/meta-data/spot/instance-action",
                timeout=self.timeout,
                headers={"X-aws-ec2-metadata-token": self._token},
            )
            if status == 401:
                self._token = None
                continue
            if status == 404:
                return None
            if status != 200:
                raise OSError(f"spot/instance-action: HTTP {status}")
            found = json.loads(body)
            return Notice(IMDSV2, str(found.get("action", "terminate")), found.get("time"))
        raise OSError("IMDSv2 refused a fresh token")


class GceMetadata:
    """The metadata server's ``instance/preempted``, waited on."""

    def __init__(
        self, endpoint: str = ENDPOINTS[GCE_METADATA], timeout: float = 2.0, wait_s: int = 60
    ) -> None:
        self.endpoint, self.timeout, self.wait_s = endpoint.rstrip("/"), timeout, wait_s
        self._etag: str | None = None

    def poll(self) -> Notice | None:
        url = f"{self.endpoint}/computeMetadata/v1/instance/preempted"
        timeout = self.timeout
        if self._etag:  # hang until the value changes (or the server's timeout)
            url += f"?wait_for_change=true&last_etag={self._etag}&timeout_sec={self.wait_s}"
            timeout += self.wait_s
        status, body, headers = _request(
            url, headers={"Metadata-Flavor": "Google"}, timeout=timeout
        )
        if status != 200:
            raise OSError(f"instance/preempted: HTTP {status}")
        self._etag = headers.get("ETag") or headers.get("etag") or self._etag
        return Notice(GCE_METADATA, "preempt") if body.strip().upper() == "TRUE" else None


class ScheduledEvents:
    """Scheduled Events: a ``Preempt`` event whose ``Resources`` name this VM. The document
    lists the events of every VM of the availability set or scale set, so another VM's
    preemption is not this one's. `vm`: this VM's name; None: asked once of the metadata
    server (``instance/compute``'s ``name``, what ``Resources`` lists), and until it answers
    no event counts (a failed ask is an error: `watch` asks again)."""

    API = "2020-07-01"
    COMPUTE_API = "2021-02-01"

    def __init__(
        self,
        endpoint: str = ENDPOINTS[SCHEDULED_EVENTS],
        timeout: float = 2.0,
        vm: str | None = None,
    ) -> None:
        self.endpoint, self.timeout, self.vm = endpoint.rstrip("/"), timeout, vm

    def _name(self) -> str:
        if self.vm is None:
            status, body, _ = _request(
                f"{self.endpoint}/metadata/instance/compute?api-version={self.COMPUTE_API}"
                "&format=json",
                headers={"Metadata": "true"},
                timeout=self.timeout,
            )
            if status != 200:
                raise OSError(f"instance/compute: HTTP {status}")
            found = json.loads(body)
            name = found.get("name") if isinstance(found, dict) else None
            if not isinstance(name, str) or not name:
                raise ValueError("instance/compute: no VM name in the answer")
            self.vm = name
        return self.vm

    def poll(self) -> Notice | None:
        vm = self._name()
        status, body, _ = _request(
            f"{self.endpoint}/metadata/scheduledevents?api-version={self.API}",
            headers={"Metadata": "true"},
            timeout=self.timeout,
        )
        if status != 200:
            raise OSError(f"scheduledevents: HTTP {status}")
        for event in json.loads(body).get("Events", []):
            resources = event.get("Resources")
            mine = isinstance(resources, list) and vm in resources
            if event.get("EventType") == "Preempt" and mine:
                return Notice(SCHEDULED_EVENTS, "preempt", event.get("NotBefore") or None)
        return None


def source(name: str, endpoint: str | None = None, **options: Any) -> Source:
    """The notice source `name` (`ENDPOINTS`), at its link-local endpoint unless `endpoint`
    is given."""
    kinds: dict[str, Callable[..., Source]] = {
        IMDSV2: Imdsv2,
        GCE_METADATA: GceMetadata,
        SCHEDULED_EVENTS: ScheduledEvents,
    }
    if name not in kinds:
        raise ValueError(f"no preemption notice source {name!r}; known: {', '.join(kinds)}")
    return kinds[name](endpoint or ENDPOINTS[name], **options)


def watch(
    src: Source,
    *,
    interval_s: float = 1.0,
    stop: threading.Event | None = None,
    on_error: Callable[[Exception], None] | None = None,
) -> Notice | None:
    """Ask `src` every `interval_s` until it gives a notice (returned) or `stop` is set
    (None). A failed ask is reported to `on_error` and asked again."""
    stop = stop or threading.Event()
    while not stop.is_set():
        started = time.monotonic()
        try:
            found = src.poll()
        except (OSError, ValueError) as exc:  # URLError, timeouts, a body that is not JSON
            if on_error:
                on_error(exc)
            found = None
        if found is not None:
            return found
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    return None


def record(root: Path, notice: Notice) -> bool:
    """Write `notice` to ``<root>/preemption.json`` atomically, unless one is there (the first
    notice stands). True when this call wrote it."""
    path = root / NOTICE_FILE
    if path.exists():
        return False
    tmp = path.with_name(f".{NOTICE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(notice.to_dict()))
    os.replace(tmp, path)
    return True


def read(root: Path) -> dict[str, Any] | None:
    """The notice recorded in `root`, or None."""
    try:
        found = json.loads((root / NOTICE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return dict(found) if isinstance(found, dict) else None


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux: ``SigCgt`` in its status),
    so sending it does not kill it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False
