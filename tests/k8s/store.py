"""The objects of the Kubernetes stand-in, as the API server's storage keeps them (no HTTP here).

Every object is a plain JSON dict. A write stamps it as etcd and the API server do: a
``metadata.uid``, a ``creationTimestamp``, the ``namespace``, a ``name`` from
``generateName`` plus five random characters, and a ``resourceVersion`` taken from one counter
shared by every kind (a string, as on the wire). A stored dict is never changed in place:
`Store.update` copies it, so what a watch or a list already holds stays as it was.

Each write is one **event** (ADDED / MODIFIED / DELETED) kept in a bounded history and fanned
out to the open `Watcher` s whose kind, namespace and selectors match. As the real watch cache
does, a selector watch sees an object that stops matching as DELETED and one that starts
matching as ADDED; a watch from a ``resourceVersion`` older than the history keeps gets the
410 ``Expired`` error ``too old resource version: RV (OLDEST)``.

Errors are `ApiError` s carrying the API's ``Status`` body: the reasons, codes and messages
(``pods "x" not found``, ``pods "x" already exists`` …) are the ones kube-apiserver writes.
"""

from __future__ import annotations

import copy
import itertools
import queue
import random
import re
import string
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # resource, namespace ("" for cluster-scoped kinds), name

#: resource → (kind, namespaced, API group/version as the object's apiVersion)
KINDS: dict[str, tuple[str, bool, str]] = {
    "namespaces": ("Namespace", False, "v1"),
    "nodes": ("Node", False, "v1"),
    "pods": ("Pod", True, "v1"),
    "services": ("Service", True, "v1"),
    "secrets": ("Secret", True, "v1"),
    "configmaps": ("ConfigMap", True, "v1"),
    "events": ("Event", True, "v1"),
    "resourcequotas": ("ResourceQuota", True, "v1"),
    "networkpolicies": ("NetworkPolicy", True, "networking.k8s.io/v1"),
}
#: What `FieldSelector` accepts per kind, beyond ``metadata.name`` and ``metadata.namespace``.
FIELDS: dict[str, tuple[str, ...]] = {
    "pods": (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "events": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "secrets": ("type",),
    "nodes": ("spec.unschedulable",),
    "namespaces": ("status.phase",),
}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def now() -> str:
    """The time as the API writes it (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error answer: the HTTP status and the ``Status`` object the API server sends."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', _details(resource, name))


def already_exists(resource: str, name: str) -> ApiError:
    message = f'{resource} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, _details(resource, name))


def conflict(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        _details(resource, name),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(resource: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422, as validation answers: ``Pod "x" is invalid: FIELD: MESSAGE, …``."""
    kind = KINDS[resource][0]
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    details = _details(resource, name)
    details["kind"] = kind
    details["causes"] = [
        {"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes
    ]
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)


def _details(resource: str, name: str) -> dict[str, Any]:
    return {"name": name, "kind": resource} if name else {"kind": resource}


# -- selectors ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        has, value = self.key in labels, labels.get(self.key)
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        return has if self.op == "exists" else not has


_REQUIREMENT = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
)


def parse_labels(text: str) -> list[Requirement]:
    """A ``labelSelector``: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``,
    ``a``, ``!a``; commas AND them. A malformed one is the API's 400."""
    out: list[Requirement] = []
    for part in _split_top(text):
        m = _REQUIREMENT.match(part)
        if m is None or not part.strip():
            raise bad_request(f"unable to parse requirement: found '{part.strip()}'")
        if m["nkey"]:
            out.append(Requirement(m["nkey"], "!"))
        elif m["op"]:
            op = "=" if m["op"] == "==" else m["op"]
            out.append(Requirement(m["key"], op, frozenset([m["value"]])))
        elif m["set"]:
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            out.append(Requirement(m["key"], m["set"], values))
        else:
            out.append(Requirement(m["key"], "exists"))
    return out


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()] if text.strip() else []


def parse_fields(text: str, resource: str) -> list[tuple[str, str, str]]:
    """A ``fieldSelector`` (``f=v``, ``f==v``, ``f!=v``; commas AND them) over the fields
    the API supports for `resource`; any other field is the API's 400."""
    allowed = ("metadata.name", "metadata.namespace", *FIELDS.get(resource, ()))
    out = []
    for part in _split_top(text):
        m = re.match(r"^\s*([\w.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if m is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        if m[1] not in allowed:
            raise bad_request(f"field label not supported: {m[1]}")
        out.append((m[1], "=" if m[2] == "==" else m[2], m[3]))
    return out


def field_value(obj: Obj, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and path == "source":
        node = node.get("component")
    if isinstance(node, bool):
        return str(node).lower()
    return "" if node is None else str(node)


@dataclass(frozen=True)
class Selector:
    """What a list or watch asks for: a kind, a namespace ("" = all) and its selectors."""

    resource: str
    namespace: str = ""
    labels: tuple[Requirement, ...] = ()
    fields: tuple[tuple[str, str, str], ...] = ()

    @staticmethod
    def parse(resource: str, namespace: str, labels: str, fields: str) -> Selector:
        return Selector(
            resource, namespace, tuple(parse_labels(labels)), tuple(parse_fields(fields, resource))
        )

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        return all((field_value(obj, f) == v) == (op == "=") for f, op, v in self.fields)


# -- patches --------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (the stand-in applies strategic-merge patches this way too)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(target: Obj, ops: list[dict[str, Any]]) -> Obj:
    """RFC 6902 JSON patch: add, replace, remove, test (the operations clients send)."""
    doc = copy.deepcopy(target)
    for op in ops:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        kind = op["op"]
        if kind == "test" and _at(node, last) != op.get("value"):
            raise ApiError(
                422, "Invalid", f"the server rejected our request: test failed at {op['path']}"
            )
        if kind in ("add", "replace") and isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if kind == "add":
                node.insert(index, op["value"])
            else:
                node[index] = op["value"]
        elif kind in ("add", "replace"):
            node[last] = op["value"]
        elif kind == "remove":
            del node[int(last) if isinstance(node, list) else last]
    return doc


def _at(node: Any, key: str) -> Any:
    if isinstance(node, list):
        return node[int(key)]
    return node.get(key) if isinstance(node, dict) else None


# -- the store and its watches --------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    resource: str
    obj: Obj
    old: Obj | None


@dataclass(eq=False)
class Watcher:
    """One open watch: the events for it land in `events` (None: the stream must end)."""

    selector: Selector
    events: queue.Queue[tuple[str, Obj] | None] = field(default_factory=queue.Queue)

    def offer(self, event: Event) -> None:
        if event.resource != self.selector.resource:
            return
        was, now_ = self.selector.matches(event.old), self.selector.matches(event.obj)
        if event.type == "DELETED":
            if was or now_:
                self.events.put(("DELETED", event.obj))
        elif now_:
            self.events.put(("MODIFIED" if was else "ADDED", event.obj))
        elif was:  # stopped matching: the watch cache says DELETED
            self.events.put(("DELETED", event.obj))


class Store:
    """Objects by (resource, namespace, name), one resourceVersion counter, the event history
    (`history` events) and the open watches. Every method takes `lock`; callers that need
    several steps to be one may hold it themselves (it is re-entrant)."""

    def __init__(self, history: int = 1000) -> None:
        self.lock = threading.RLock()
        self.objects: dict[Key, Obj] = {}
        self.rv = 0
        self.history: deque[Event] = deque(maxlen=history)
        self.oldest = 1  # the oldest resourceVersion a watch may start after
        self.watchers: set[Watcher] = set()
        self.listeners: list[Callable[[Event], None]] = []
        self._ids = itertools.count(1)

    # reads

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            return self.objects.get((resource, namespace, name))

    def need(self, resource: str, namespace: str, name: str) -> Obj:
        obj = self.get(resource, namespace, name)
        if obj is None:
            raise not_found(resource, name)
        return obj

    def select(self, selector: Selector) -> list[Obj]:
        with self.lock:
            found = [
                o
                for (r, _, _), o in self.objects.items()
                if r == selector.resource and selector.matches(o)
            ]
        return sorted(
            found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        )

    def all(self, resource: str, namespace: str = "") -> list[Obj]:
        return self.select(Selector(resource, namespace))

    # writes

    def create(self, resource: str, obj: Obj) -> Obj:
        kind, namespaced, api_version = KINDS[resource]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        with self.lock:
            name = self.named(meta)
            if not name:
                raise invalid(
                    resource,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                )
            if not _NAME.match(name) or len(name) > 253:
                raise invalid(
                    resource,
                    name,
                    [
                        (
                            "metadata.name",
                            f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must '
                            "consist of lower case alphanumeric characters, '-' or '.', and "
                            "must start and end with an alphanumeric character",
                        )
                    ],
                )
            namespace = meta.get("namespace", "") if namespaced else ""
            key = (resource, namespace, name)
            if key in self.objects:
                raise already_exists(resource, name)
            obj["kind"], obj["apiVersion"] = kind, api_version
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            if not namespaced:
                meta.pop("namespace", None)
            self._write(key, obj, "ADDED", None)
            return obj

    def named(self, meta: Obj) -> str:
        """The object's name, made from ``generateName`` and five random characters if
        it has none."""
        if not meta.get("name") and meta.get("generateName"):
            while True:
                suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
                if not any(k[2] == meta["generateName"] + suffix for k in self.objects):
                    break
            meta["name"] = meta["generateName"] + suffix
        return str(meta.get("name") or "")

    def update(self, resource: str, namespace: str, name: str, change: Callable[[Obj], Any]) -> Obj:
        """`change` applied to a copy of the object, stored as a new version (MODIFIED)."""
        with self.lock:
            old = self.need(resource, namespace, name)
            new = copy.deepcopy(old)
            change(new)
            if new == old:
                return old
            self._write((resource, namespace, name), new, "MODIFIED", old)
            return new

    def remove(self, resource: str, namespace: str, name: str) -> Obj:
        with self.lock:
            old = self.need(resource, namespace, name)
            del self.objects[(resource, namespace, name)]
            gone = copy.deepcopy(old)
            self._write(None, gone, "DELETED", old)
            return gone

    def _write(self, key: Key | None, obj: Obj, type_: str, old: Obj | None) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if key is not None:
            self.objects[key] = obj
        resource = next(r for r, (k, _, _) in KINDS.items() if k == obj["kind"])
        event = Event(self.rv, type_, resource, obj, old)
        if len(self.history) == self.history.maxlen:
            self.oldest = self.history[0].rv + 1
        self.history.append(event)
        for watcher in self.watchers:
            watcher.offer(event)
        for listener in self.listeners:
            listener(event)

    # watches

    def watch(self, selector: Selector, since: str | None) -> Watcher:
        """A watch opened at `since` (a resourceVersion; None or "0": from now, the objects
        that exist first sent as ADDED, as the API does)."""
        with self.lock:
            watcher = Watcher(selector)
            if since in (None, "", "0"):
                for obj in self.select(selector):
                    watcher.events.put(("ADDED", obj))
            else:
                start = _rv(since)
                if start < self.oldest - 1:
                    too_old = f"too old resource version: {start} ({self.oldest})"
                    raise ApiError(410, "Expired", too_old)
                for event in self.history:
                    if event.rv > start:
                        watcher.offer(event)
            self.watchers.add(watcher)
            return watcher

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self.watchers.discard(watcher)

    def drop_watches(self) -> int:
        """Ends every open watch (the streams close, as when the API server restarts)."""
        with self.lock:
            dropped = list(self.watchers)
            self.watchers.clear()
        for watcher in dropped:
            watcher.events.put(None)
        return len(dropped)

    def compact(self) -> None:
        """Forgets the event history, as etcd's compaction does: a watch from an older
        resourceVersion then gets 410 Expired."""
        with self.lock:
            self.history.clear()
            self.oldest = self.rv + 1

    def next_id(self) -> int:
        return next(self._ids)


def _rv(text: str) -> int:
    if not text.isdigit():
        raise bad_request(
            f'invalid resource version: strconv.ParseUint: parsing "{text}": invalid syntax'
        )
    return int(text)


def names(objects: Iterable[Obj]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objects)


def record(
    store: Store,
    involved: Obj,
    type_: str,
    reason: str,
    message: str,
    component: str,
    host: str = "",
    field_path: str = "",
) -> None:
    """An Event about `involved`, as the scheduler or a kubelet records one: a repeat (same
    object, reason and message) bumps the first one's ``count`` and ``lastTimestamp``."""
    meta = involved["metadata"]
    namespace = meta.get("namespace") or "default"
    with store.lock:
        for event in store.all("events", namespace):
            ref = event["involvedObject"]
            same = (ref.get("uid"), event["reason"], event["message"]) == (
                meta["uid"],
                reason,
                message,
            )
            if same and ref.get("fieldPath", "") == field_path:

                def again(e: Obj) -> None:
                    e["count"] += 1
                    e["lastTimestamp"] = now()

                store.update("events", namespace, event["metadata"]["name"], again)
                return
        stamp = now()
        ref = {
            "kind": involved["kind"],
            "namespace": namespace,
            "name": meta["name"],
            "uid": meta["uid"],
            "apiVersion": involved["apiVersion"],
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        if field_path:
            ref["fieldPath"] = field_path
        source = {"component": component, **({"host": host} if host else {})}
        store.create(
            "events",
            {
                "metadata": {
                    "name": f"{meta['name']}.{store.next_id():016x}",
                    "namespace": namespace,
                },
                "involvedObject": ref,
                "reason": reason,
                "message": message,
                "source": source,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                "type": type_,
                "eventTime": None,
                "reportingComponent": component,
                "reportingInstance": host,
            },
        )
