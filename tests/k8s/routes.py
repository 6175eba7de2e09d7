"""URL → verb and resource → handler, for the Kubernetes API subset the stand-in serves.

Paths are the API server's: ``/api/v1/namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]``, the
cluster-wide ``/api/v1/RESOURCE`` (lists across namespaces too),
``/apis/authorization.k8s.io/v1/selfsubjectaccessreviews``,
``/apis/authentication.k8s.io/v1/selfsubjectreviews``, ``/version``, ``/api``, ``/apis``.
The verb is the one RBAC sees: get / list / watch / create / update / patch / delete /
deletecollection (``pods/exec`` is ``create``, as with websocket upgrades on 1.31).
A handler answers a `Reply`: a JSON body, a stream of chunks (watches, followed logs), or
an upgrade (exec).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.k8s.containers import follow, read_log
from tests.k8s.nodes import quota_status
from tests.k8s.store import (
    KINDS,
    ApiError,
    Obj,
    Selector,
    bad_request,
    conflict,
    invalid,
    json_patch,
    merge_patch,
    not_found,
)

if TYPE_CHECKING:
    from tests.k8s.standin import StandIn

VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "9edcffcde5595e8a5b1a35f88c421764e575afce",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T07:28:49Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
POD_UPDATES = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
    "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only "
    "additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be "
    "set to 1 if it was previously negative)"
)
SUBRESOURCES = {("pods", "exec"), ("pods", "log"), ("pods", "eviction"), ("pods", "status")}
#: The groups served besides the core one (``/apis/GROUP/v1/...``), with their resources.
GROUPS = ("networking.k8s.io",)
_CORE = re.compile(
    r"^/(?:api/v1|apis/(?P<group>networking\.k8s\.io)/v1)"
    r"(?:/namespaces/(?P<ns>[^/]+)(?=/[^/]+))?(?:/(?P<rest>.*))?$"
)


@dataclass(frozen=True)
class Target:
    """What a request is about, as authorization sees it."""

    verb: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    group: str = ""


@dataclass
class Reply:
    code: int
    body: Any = None
    chunks: Iterator[bytes] | None = None  # a streamed (chunked) answer
    content_type: str = "application/json"
    upgrade: Callable[[Any], None] | None = None  # takes over the connection (exec)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes
    user: str

    def arg(self, name: str, default: str = "") -> str:
        return self.query.get(name, [default])[-1]

    def flag(self, name: str) -> bool:
        return self.arg(name).lower() in ("true", "1")

    def json(self) -> Any:
        """The body as JSON: an object, or a list (a JSON patch)."""
        try:
            body = json.loads(self.body or b"{}")
        except ValueError as exc:
            raise bad_request(f"the object provided is unrecognized: {exc}") from None
        if not isinstance(body, dict | list):
            raise bad_request("the object provided is unrecognized")
        return body


def target(method: str, path: str, query: dict[str, list[str]], upgrade: bool) -> Target | None:
    """The verb and resource of a request (None: not a resource path)."""
    for review_group in ("authorization.k8s.io", "authentication.k8s.io"):
        if path.startswith(f"/apis/{review_group}/v1/"):
            return Target("create", path.rsplit("/", 1)[-1], group=review_group)
    m = _CORE.match(path)
    if m is None:
        return None
    namespace = m["ns"] or ""
    parts = (m["rest"] or "").split("/") if m["rest"] else []
    if not parts or len(parts) > 3 or parts[0] not in KINDS:
        return None
    group = m["group"] or ""
    if KINDS[parts[0]][2] != (f"{group}/v1" if group else "v1"):
        return None  # not a resource of that group
    resource, name, sub = (*parts, "", "")[:3]
    if sub and (resource, sub) not in SUBRESOURCES:
        return None
    watching = query.get("watch", [""])[-1].lower() in ("true", "1")
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method == "GET":
        verb = ("create" if upgrade else "get") if name else ("watch" if watching else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = verbs.get(method, method.lower())
    return Target(verb, resource, namespace, name, sub, group)


def dispatch(standin: StandIn, request: Request, t: Target) -> Reply:
    store = standin.store
    if t.resource == "selfsubjectaccessreviews":
        return _access_review(standin, request)
    if t.resource == "selfsubjectreviews":
        return _who_am_i(request)
    namespaced = KINDS[t.resource][1]
    missing = store.get("namespaces", "", t.namespace) is None
    if namespaced and t.namespace and t.verb == "create" and missing:
        raise not_found("namespaces", t.namespace)
    if t.subresource == "exec":
        return standin.exec(request, t)
    if t.subresource == "log":
        return _log(standin, request, t)
    if t.subresource == "eviction":
        standin.cluster.evict(t.namespace, t.name, request.json().get("deleteOptions") or {})
        return Reply(201, _status_ok(201))
    if t.verb in ("list", "watch"):
        selector = Selector.parse(
            t.resource, t.namespace, request.arg("labelSelector"), request.arg("fieldSelector")
        )
        if t.verb == "watch":
            return _watch(standin, request, selector)
        with store.lock:
            items = [_served(standin, o) for o in store.select(selector)]
            version = str(store.rv)
        kind = KINDS[t.resource][0]
        return Reply(
            200,
            {
                "kind": f"{kind}List",
                "apiVersion": KINDS[t.resource][2],
                "metadata": {"resourceVersion": version},
                "items": items,
            },
        )
    if t.verb == "get":
        return Reply(200, _served(standin, store.need(t.resource, t.namespace, t.name)))
    if t.verb == "create":
        body = request.json()
        if t.resource in ("namespaces", "nodes"):
            if t.resource == "namespaces":
                return Reply(
                    201, standin.add_namespace(str(body.get("metadata", {}).get("name", "")))
                )
            return Reply(201, store.create("nodes", body))
        return Reply(201, standin.cluster.create(t.resource, t.namespace, body))
    if t.verb in ("update", "patch"):
        return Reply(200, _change(standin, request, t))
    if t.verb == "delete":
        return Reply(200, _delete(standin, request, t))
    if t.verb == "deletecollection":
        selector = Selector.parse(
            t.resource, t.namespace, request.arg("labelSelector"), request.arg("fieldSelector")
        )
        gone = []
        for obj in store.select(selector):
            meta = obj["metadata"]
            one = Target("delete", t.resource, meta.get("namespace", ""), meta["name"])
            try:
                gone.append(_delete(standin, request, one))
            except ApiError:
                continue  # gone meanwhile
        kind = KINDS[t.resource][0]
        return Reply(
            200,
            {
                "kind": f"{kind}List",
                "apiVersion": KINDS[t.resource][2],
                "metadata": {"resourceVersion": str(store.rv)},
                "items": gone,
            },
        )
    raise ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def _served(standin: StandIn, obj: Obj) -> Obj:
    """An object as the API answers it (a quota's status is kept current)."""
    if obj["kind"] == "ResourceQuota":
        pods = standin.store.all("pods", obj["metadata"]["namespace"])
        return {**obj, "status": quota_status(obj, pods)}
    return obj


def _status_ok(code: int, details: Obj | None = None) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details is not None:
        body["details"] = details
    if code != 200:
        body["code"] = code
    return body


def _delete(standin: StandIn, request: Request, t: Target) -> Obj:
    options = request.json() if request.body else {}
    grace_text = request.arg("gracePeriodSeconds") or str(options.get("gracePeriodSeconds") or "")
    grace = int(grace_text) if grace_text.lstrip("-").isdigit() else None
    if options.get("gracePeriodSeconds") == 0:
        grace = 0
    if t.resource == "pods":
        return standin.cluster.delete_pod(t.namespace, t.name, grace)
    gone = standin.store.remove(t.resource, t.namespace, t.name)
    if t.resource == "nodes":
        standin.cluster.wake()
    return _status_ok(200, {"name": t.name, "kind": t.resource, "uid": gone["metadata"]["uid"]})


def _change(standin: StandIn, request: Request, t: Target) -> Obj:
    """PUT (replace) or PATCH (JSON patch; merge and strategic-merge patches both applied as
    a JSON merge patch). Identity and status stay; a pod's spec may not change."""
    store = standin.store
    content = request.headers.get("content-type", "application/json").split(";")[0]
    with store.lock:
        old = store.need(t.resource, t.namespace, t.name)
        body = request.json()
        if t.verb == "update":
            new = body
            meta = new.get("metadata") or {}
            if meta.get("name") not in (None, t.name):
                raise bad_request(
                    f"the name of the object ({meta.get('name')}) does not match the name "
                    f"on the URL ({t.name})"
                )
            asked = meta.get("resourceVersion")
            if asked and asked != old["metadata"]["resourceVersion"]:
                raise conflict(t.resource, t.name)
        elif content == "application/json-patch+json":
            if not isinstance(body, list):
                raise bad_request("the server rejected our request due to an error in our request")
            new = json_patch(old, body)
        elif content in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            new = merge_patch(old, body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/strategic-merge-patch+json",
            )
        if t.resource == "pods" and new.get("spec") != old["spec"]:
            raise invalid(
                "pods",
                t.name,
                [("spec", POD_UPDATES)],
            )

        def apply(obj: Obj) -> None:
            keep = {
                k: obj["metadata"][k]
                for k in ("uid", "creationTimestamp", "name")
                if k in obj["metadata"]
            }
            for k in ("namespace", "deletionTimestamp", "deletionGracePeriodSeconds"):
                if k in obj["metadata"]:
                    keep[k] = obj["metadata"][k]
            status = obj.get("status")
            obj.clear()
            obj.update(new)
            obj["metadata"] = {**(new.get("metadata") or {}), **keep}
            obj["kind"], obj["apiVersion"] = KINDS[t.resource][0], KINDS[t.resource][2]
            if status is not None and t.resource not in ("events",):
                obj["status"] = status

        return _served(standin, store.update(t.resource, t.namespace, t.name, apply))


def _watch(standin: StandIn, request: Request, selector: Selector) -> Reply:
    timeout = float(request.arg("timeoutSeconds") or 1800)
    try:
        watcher = standin.store.watch(selector, request.arg("resourceVersion") or None)
    except ApiError as exc:
        if exc.code != 410:
            raise
        return _watch_error(exc)

    def lines() -> Iterator[bytes]:
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    event = watcher.events.get(timeout=min(left, 1.0))
                except Exception:  # queue.Empty: a quiet second
                    continue
                if event is None:
                    return
                kind, obj = event
                yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        finally:
            standin.store.unwatch(watcher)

    return Reply(200, chunks=lines())


def _watch_error(error: ApiError) -> Reply:
    """An expired resourceVersion: the API opens the stream and sends one ERROR event."""
    line = json.dumps({"type": "ERROR", "object": error.status()}).encode() + b"\n"
    return Reply(200, chunks=iter([line]))


def _log(standin: StandIn, request: Request, t: Target) -> Reply:
    pod = standin.store.need("pods", t.namespace, t.name)
    container = container_of(pod, request.arg("container"))
    if not pod["spec"].get("nodeName"):
        return Reply(200, b"", content_type="text/plain")
    instance = standin.cluster.kubelet.instance(
        t.namespace, t.name, container, request.flag("previous")
    )
    if instance is None:
        return Reply(200, b"", content_type="text/plain")
    stamps = request.flag("timestamps")
    tail = int(request.arg("tailLines")) if request.arg("tailLines") else None
    limit = int(request.arg("limitBytes")) if request.arg("limitBytes") else None

    def text(lines: list[tuple[bytes, bytes]]) -> bytes:
        return b"".join((s + b" " + line if stamps else line) for s, line in lines)

    lines, offset = read_log(instance)
    if tail is not None:
        lines = lines[-tail:] if tail else []
    if not request.flag("follow"):
        body = text(lines)
        return Reply(200, body[:limit] if limit is not None else body, content_type="text/plain")
    stop = threading.Event()

    def chunks() -> Iterator[bytes]:
        if lines:
            yield text(lines)
        for more in follow(instance, offset, stop):
            yield text(more)

    return Reply(200, chunks=chunks(), content_type="text/plain")


def container_of(pod: Obj, asked: str) -> str:
    """The container a log or exec request means: `asked`, or the pod's only one."""
    names = [c["name"] for c in pod["spec"]["containers"]]
    name = pod["metadata"]["name"]
    if not asked and len(names) > 1:
        choices = " ".join(names)
        raise bad_request(
            f"a container name must be specified for pod {name}, choose one of: [{choices}]"
        )
    asked = asked or names[0]
    if asked not in names:
        raise bad_request(f"container {asked} is not valid for pod {name}")
    return asked


def _access_review(standin: StandIn, request: Request) -> Reply:
    body = request.json()
    attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
    asked = Target(
        attrs.get("verb", ""),
        attrs.get("resource", ""),
        attrs.get("namespace", ""),
        attrs.get("name", ""),
        attrs.get("subresource", ""),
        attrs.get("group", ""),
    )
    allowed = standin.allowed(request.user, asked)
    status: Obj = {"allowed": allowed}
    if allowed:
        binding = 'ClusterRoleBinding "cloudtrain" of ClusterRole "cloudtrain"'
        status["reason"] = f'RBAC: allowed by {binding} to User "{request.user}"'
    review = {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": body.get("spec") or {},
        "status": status,
    }
    return Reply(201, review)


def _who_am_i(request: Request) -> Reply:
    """``kubectl auth whoami``: the user the request's token is, as a real server answers."""
    user = {"username": request.user, "groups": ["system:authenticated"]}
    review = {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "status": {"userInfo": user},
    }
    return Reply(201, review)


def discovery(path: str, address: str) -> Obj | None:
    """The discovery documents a client reads (``/api``, ``/apis``, ``/api/v1``)."""
    if path == "/version":
        return VERSION
    if path == "/api":
        cidr = [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidr}
    if path == "/apis":
        groups = [
            {
                "name": g,
                "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
            }
            for g in ("authentication.k8s.io", "authorization.k8s.io", "policy", *GROUPS)
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    if path == "/api/v1":
        resources = [
            {
                "name": r,
                "singularName": k.lower(),
                "namespaced": ns,
                "kind": k,
                "verbs": [
                    "create",
                    "delete",
                    "deletecollection",
                    "get",
                    "list",
                    "patch",
                    "update",
                    "watch",
                ],
            }
            for r, (k, ns, version) in KINDS.items()
            if version == "v1"
        ]
        resources += [
            {"name": f"pods/{s}", "singularName": "", "namespaced": True, "kind": k, "verbs": v}
            for s, k, v in (
                ("exec", "PodExecOptions", ["create", "get"]),
                ("log", "Pod", ["get"]),
                ("eviction", "Eviction", ["create"]),
            )
        ]
        return {"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}
    return None
