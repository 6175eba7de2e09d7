"""Waiting on a cluster's pods: one list, then one watch from it, as the client's informers do.

`pods` yields the pods of a label selector, by name: first as one list gives them, then again
after each change a watch from that list's resourceVersion reports, until its seconds are up.
A wait thus costs one list and one watch, however many pods and however long it lasts:

==============================================  ==============================================
when the watch                                  then
==============================================  ==============================================
ends (its ``timeoutSeconds``, or the server     it is opened again from the last
closed it: a restart, a proxy's idle limit)     resourceVersion seen (after a pause
                                                (`PAUSE_S`) if it brought nothing)
is too old (410 ``Expired``: the server's       the pods are listed again, and watched from
history was compacted meanwhile)                that list
breaks (its connection, mid-stream)             the same, after a pause (`PAUSE_S`)
is refused (403: the Role lacks ``watch``)      the error, mapped as every call's
                                                (`Api.calling`)
==============================================  ==============================================

`until_running` and `until_gone` read what it yields: `apply`'s wait for every pod of a gang
to run, and `terminate`'s for them to be gone. Both block; neither changes anything.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Generator, Iterator
from typing import Any

from cloudtrain.errors import CapacityError, ConfigError, ProviderError
from cloudtrain.model import Event, OnEvent
from cloudtrain.providers.kubernetes import _read
from cloudtrain.providers.kubernetes._api import NAME, Api, client_module

#: The most seconds one watch asks the server to stay open (then it is opened again).
WATCH_S = 300
#: Seconds between a watch that broke, or ended bringing nothing, and the next call.
PAUSE_S = 0.5


class _Relist(Exception):
    """The watch cannot go on from its resourceVersion: list again (after a pause or not)."""

    def __init__(self, pause: bool) -> None:
        super().__init__()
        self.pause = pause


def pods(
    api: Api, selector: str, what: str, seconds: float
) -> Generator[dict[str, Any], None, None]:
    """The pods `selector` selects in the namespace, by name (the same dict each time,
    updated): once listed, then after each change, until `seconds` pass; then it ends.
    `ProviderError` for a list or a watch the API server refuses."""
    deadline = time.monotonic() + seconds
    watch = client_module().watch.Watch()
    while True:
        with api.calling(f"list {what}"):
            listed = api.core.list_namespaced_pod(api.namespace, label_selector=selector)
        found = {p.metadata.name: p for p in listed.items}
        version = str(listed.metadata.resource_version)
        yield found
        try:
            while (left := deadline - time.monotonic()) > 0:
                quiet = True
                for kind, pod in _events(api, watch, selector, what, version, left):
                    quiet = False
                    version = str(pod.metadata.resource_version or version)
                    if kind == "DELETED":
                        found.pop(pod.metadata.name, None)
                    else:
                        found[pod.metadata.name] = pod
                    yield found
                    if time.monotonic() > deadline:
                        return
                if quiet:  # a server that ends every watch at once is not asked twice a second
                    _pause(deadline)
            return
        except _Relist as relist:
            if relist.pause:
                _pause(deadline)


def _pause(deadline: float) -> None:
    time.sleep(max(0.0, min(PAUSE_S, deadline - time.monotonic())))


def _events(
    api: Api, watch: Any, selector: str, what: str, version: str, seconds: float
) -> Iterator[tuple[str, Any]]:
    """The pods' events of one watch from `version`, at most `seconds` long (`WATCH_S`); it
    ends when the server ends it; `_Relist` when it cannot go on."""
    import urllib3

    k8s = client_module()
    timeout = max(1, min(WATCH_S, math.ceil(seconds)))
    stream = watch.stream(
        api.core.list_namespaced_pod,
        api.namespace,
        label_selector=selector,
        resource_version=version,
        timeout_seconds=timeout,
        _request_timeout=(30, timeout + 10),  # a connection gone quiet for good breaks
    )
    try:
        while True:
            with api.calling(f"watch {what}"):
                try:
                    event = next(stream, None)
                except k8s.client.exceptions.ApiException as exc:
                    if exc.status != 410:
                        raise  # mapped by `calling`
                    raise _Relist(pause=False) from exc  # too old: compacted meanwhile
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    raise _Relist(pause=True) from exc
            if event is None:
                return
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                yield event["type"], event["object"]
    finally:
        stream.close()


def until_running(
    api: Api, selector: str, what: str, nodes: int, seconds: float, on_event: OnEvent
) -> None:
    """Block until `nodes` pods run with an address; say why one is pending (once per new
    reason) through `on_event`. `CapacityError` past `seconds` (``--wait``) with the
    scheduler's reason, `ConfigError` at once for an image that cannot be pulled,
    `ProviderError` for a pod that ended, with its log's last lines."""
    said = why = ""
    running = 0
    with contextlib.closing(pods(api, selector, what, seconds)) as seen:
        for found in seen:
            listed = [found[name] for name in sorted(found)]
            running = sum(_read.running(p) for p in listed)
            if running >= nodes:
                return
            for p in listed:
                image_error = _read.image_error(p)
                if image_error:
                    raise ConfigError(f"pod {p.metadata.name}: {image_error}")
                if _read.ended(p):
                    raise ProviderError(
                        NAME,
                        "PodEnded",
                        f"pod {p.metadata.name} ended as it started: "
                        f"{_read.why(p)}; {log_tail(api, p.metadata.name)}",
                    )
            why = next((w for p in listed if (w := _read.pending(p))), "")
            if why and why != said:
                on_event(Event("node", f"pending: {why}"))
                said = why
    raise CapacityError(
        NAME,
        "Unschedulable",
        f"{running} of {nodes} pod(s) running after {seconds:.0f} s (--wait); "
        f"{why or 'the pods are still being made'}",
    )


def until_gone(api: Api, selector: str, what: str, names: set[str] | None, seconds: float) -> None:
    """Block until the pods `names` (None: every pod `selector` selects) are gone;
    `ProviderError` past `seconds`."""
    left: list[str] = []
    with contextlib.closing(pods(api, selector, what, seconds)) as seen:
        for found in seen:
            left = sorted(n for n in found if names is None or n in names)
            if not left:
                return
    raise ProviderError(
        NAME, "NotGone", f"pod(s) {', '.join(left)} still there after {seconds:.0f} s"
    )


def log_tail(api: Api, pod: str) -> str:
    """The last lines pod `pod` wrote, in words for an error."""
    try:
        with api.calling(f"read the log of pod {pod}"):
            text = str(api.core.read_namespaced_pod_log(pod, api.namespace, tail_lines=10))
    except ProviderError:
        return "no log"
    lines = [line for line in text.splitlines() if line.strip()]
    return "its last lines: " + " | ".join(lines[-5:]) if lines else "it wrote nothing"
