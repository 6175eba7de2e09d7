"""A local stand-in for the Kubernetes API server whose pods really run, on this machine.

No kube-apiserver (nor k3s, kind, kwok, envtest) can be installed here, and ``kmock``
ignores label selectors and never moves a pod; so ``StandIn`` serves the part of the API that
cloudtrain's Kubernetes provider uses over real HTTP on 127.0.0.1 (a port from the OS), from
threads of the test process, to the **official** ``kubernetes`` client (37.x), which drives it
through a kubeconfig file (`StandIn.kubeconfig`, ``env()``). What the client sees is the
real server's: paths, JSON shapes, status codes, ``Status`` errors with the real reasons and
messages, chunked watch streams, and the exec WebSocket protocol (`exec`). Its parts:

==============  ===============================================================================
``store``       objects, resourceVersions, label and field selectors, watches and their history
``nodes``       node objects, the scheduler's filters and messages, ResourceQuota admission
``cluster``     admission, the scheduler thread, graceful deletion, eviction, node loss
``kubelet``     each pod's containers as real process trees: phases, restarts, logs
``cgroups``     a cgroup per container, so what left its session still dies with its pod
``exec``        ``pods/exec``: the WebSocket handshake, frames and the channel protocol
``routes``      URL → verb and resource → handler; discovery; logs; access reviews
==============  ===============================================================================

The test process drives the faults: `lose_node`, `forbid` (403 with RBAC's words, and
SelfSubjectAccessReview agrees), `set_quota`, `fail_image`, `drop_watches`, `compact`; and
inspects: `calls` (every request), `pod_dir`, `pids`, `leftovers` / `is_empty` (objects, and
live processes: in the sessions the kubelet started or its containers' cgroups), `reset`,
`close`.

Where it departs from a real cluster (besides what `kubelet`'s docstring lists):

- **no DNS, no Service routing**: Services get a ClusterIP from 10.96.0.0/12 that routes
  nowhere; pods reach each other by their pod IPs (127.X.Y.Z, one /24 per stand-in, so that
  parallel test workers never share one: all of 127/8 is loopback on Linux);
- pods share the host's filesystem (apart from their folder, which is their HOME) and see
  the API as ``http://127.0.0.1:PORT`` (no service account token is mounted);
- images are never pulled (`fail_image` makes a pull fail); one user per token (`add_token`);
- JSON only (no protobuf, no YAML, no server-side apply); no admission webhooks, no
  namespace deletion, no Deployments/Jobs/Kueue (pods only); events are kept until `reset`;
- a list in a namespace that does not exist is empty and a get is 404 of the object, as on a
  real server; a create there is 404 ``namespaces "x" not found``.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.k8s import exec as exec_
from tests.k8s import routes
from tests.k8s.cluster import Cluster
from tests.k8s.nodes import forbidden
from tests.k8s.routes import Reply, Request, Target
from tests.k8s.store import ApiError, Obj, Store, bad_request
from tests.tls import certificate, serve_tls

USER = "system:serviceaccount:default:cloudtrain"
A100 = "NVIDIA-A100-SXM4-80GB"
KEPT = ("pods", "services", "secrets", "configmaps", "networkpolicies")


@dataclass(frozen=True)
class Call:
    """One request as the stand-in received it, with the verb RBAC would see and the code
    it was answered with."""

    method: str
    path: str
    query: dict[str, list[str]]
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    user: str | None
    code: int


@dataclass(frozen=True)
class Rule:
    """A `forbid` rule: None matches anything."""

    verb: str
    resource: str
    subresource: str | None = None
    namespace: str | None = None
    user: str | None = None

    def denies(self, user: str, t: Target) -> bool:
        return (
            self.verb in (t.verb, "*")
            and self.resource in (t.resource, "*")
            and self.subresource in (None, t.subresource)
            and (self.subresource is not None or not t.subresource or self.resource == "*")
            and self.namespace in (None, t.namespace)
            and self.user in (None, user)
        )


class StandIn:
    """The server; a context manager. ``env()`` points a kubeconfig reader at it;
    ``reset()`` empties it between tests."""

    def __init__(
        self,
        namespaces: Iterable[str] = ("default",),
        backoff: tuple[float, float] = (0.2, 2.0),
        history: int = 1000,
        *,
        tls: bool = False,
    ) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.standin = self  # type: ignore[attr-defined]
        self.port = self._server.server_port
        self.root = Path(tempfile.mkdtemp(prefix="k8s-standin-"))
        #: With `tls`, its certificate (its own CA), as a pod's service account has it.
        self.ca_file: Path | None = None
        if tls:
            self.ca_file, key_file = certificate(self.root, "cloudtrain kubernetes stand-in")
            self._server.socket = serve_tls(self._server.socket, self.ca_file, key_file)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.token = secrets.token_urlsafe(24)
        self.store = Store(history)
        # the pods' addresses: a /24 of loopback of this stand-in's own, named by its port
        subnet = f"127.{self.port >> 8}.{self.port & 0xFF}"
        self.cluster = Cluster(self.store, self.root, ("127.0.0.1", self.port), backoff, subnet)
        self.lock = threading.Lock()
        self._namespaces = tuple(namespaces)
        self.tokens: dict[str, str] = {}
        self.rules: list[Rule] = []
        self.log: list[Call] = []
        self.errors: list[str] = []  # the stand-in's own failures (tracebacks)
        self.kubeconfig_file = self.root / "kubeconfig"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.reset()

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stops the server and kills every process it started (idempotent)."""
        self.store.drop_watches()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self.cluster.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def reset(self) -> None:
        """Deletes everything (objects, nodes, events, quotas), kills every pod's processes
        and clears the faults, the tokens added and the calls recorded."""
        self.store.drop_watches()
        with self.store.lock:
            self.store.objects.clear()
            self.store.compact()
            self.cluster.release_all()
        self.cluster.kubelet.kill_all()
        self.cluster.kubelet.failed_images.clear()
        with self.lock:
            self.tokens = {self.token: USER}
            self.rules = []
            self.log = []
            self.errors = []
        for namespace in self._namespaces:
            self.add_namespace(namespace)
        self.kubeconfig(self.kubeconfig_file)

    # -- the client's side ---------------------------------------------------------------------

    def kubeconfig(
        self,
        path: Path,
        context: str = "standin",
        namespace: str = "default",
        *,
        more: dict[str, str] | None = None,
        token: str | None = None,
    ) -> Path:
        """Writes a kubeconfig (JSON, which is YAML) for this server: the user with `token`
        (the stand-in's own by default) and the context `context` in `namespace`, current,
        plus one context per entry of `more` (name → namespace)."""
        contexts = {context: namespace, **(more or {})}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": self._cluster()}],
            "users": [{"name": "standin", "user": {"token": token or self.token}}],
            "contexts": [
                {"name": c, "context": {"cluster": "standin", "user": "standin", "namespace": ns}}
                for c, ns in contexts.items()
            ],
            "current-context": context,
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        return path

    def _cluster(self) -> dict[str, str]:
        if self.ca_file is None:
            return {"server": self.url}
        return {"server": self.url, "certificate-authority": str(self.ca_file)}

    def env(self) -> dict[str, str]:
        """What a process needs to reach only this stand-in."""
        return {"KUBECONFIG": str(self.kubeconfig_file)}

    def add_token(self, token: str, user: str = USER) -> None:
        with self.lock:
            self.tokens[token] = user

    # -- the cluster's contents ----------------------------------------------------------------

    def add_namespace(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        meta = {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}}
        body = {
            "metadata": meta,
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
        return self.store.create("namespaces", body)

    def add_node(
        self,
        name: str,
        gpus: int = 8,
        gpu_product: str = A100,
        cpu: str = "96",
        memory: str = "1000Gi",
        taints: Iterable[dict[str, str]] = (),
        labels: dict[str, str] | None = None,
    ) -> Obj:
        """A Ready node; pending pods are scheduled again."""
        return self.cluster.add_node(
            name, gpus, gpu_product, cpu, memory, list(taints), labels or {}
        )

    def set_quota(self, namespace: str, name: str, hard: dict[str, str]) -> Obj:
        """A ResourceQuota (replaced if it exists): pod creates past it are refused (403)."""
        with self.store.lock:
            if self.store.get("resourcequotas", namespace, name) is not None:
                self.store.remove("resourcequotas", namespace, name)
            body = {
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"hard": dict(hard)},
            }
            return self.store.create("resourcequotas", body)

    # -- faults --------------------------------------------------------------------------------

    def lose_node(self, name: str, remove: bool = False) -> None:
        """The node dies: see `Cluster.lose_node`. Blocks until its pods are gone."""
        self.cluster.lose_node(name, remove)

    def fail_image(self, image: str) -> None:
        """Pods using `image` stay Pending: ErrImagePull, then ImagePullBackOff."""
        self.cluster.kubelet.failed_images.add(image)

    def forbid(
        self,
        verb: str,
        resource: str,
        subresource: str | None = None,
        namespace: str | None = None,
        user: str | None = None,
    ) -> Rule:
        """Requests matching the rule are refused with 403 (RBAC's message); ``*`` matches
        any verb or resource."""
        rule = Rule(verb, resource, subresource, namespace, user)
        with self.lock:
            self.rules.append(rule)
        return rule

    def drop_watches(self) -> int:
        """Ends every open watch stream now, as a restarting API server does; returns how many."""
        return self.store.drop_watches()

    def compact(self) -> None:
        """Forgets the event history: a watch from an older resourceVersion gets 410 Expired."""
        self.store.compact()

    # -- inspection ----------------------------------------------------------------------------

    def calls(
        self, verb: str | None = None, resource: str | None = None, subresource: str | None = None
    ) -> list[Call]:
        with self.lock:
            return [
                c
                for c in self.log
                if verb in (None, c.verb)
                and resource in (None, c.resource)
                and subresource in (None, c.subresource)
            ]

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.cluster.kubelet.pod_dir(namespace, name)

    def pids(self, namespace: str, name: str) -> dict[str, int]:
        """Container name → the PID of its running main process."""
        return self.cluster.kubelet.pids(namespace, name)

    def processes(self) -> list[int]:
        """Live processes (containers', execs' and their children) the kubelet started."""
        return self.cluster.kubelet.alive()

    def leftovers(self) -> dict[str, list[str]]:
        """What is left: objects of `KEPT` kinds (``ns/name``) and live processes (PIDs)."""
        with self.store.lock:
            found = {
                kind: sorted(
                    f"{o['metadata']['namespace']}/{o['metadata']['name']}"
                    for o in self.store.all(kind)
                )
                for kind in KEPT
            }
        found["processes"] = [str(p) for p in self.processes()]
        return found

    def is_empty(self) -> bool:
        return not any(self.leftovers().values())

    # -- one request ---------------------------------------------------------------------------

    def allowed(self, user: str, t: Target) -> bool:
        with self.lock:
            return not any(rule.denies(user, t) for rule in self.rules)

    def handle(self, method: str, raw_target: str, headers: dict[str, str], raw: bytes) -> Reply:
        parts = urlsplit(raw_target)
        query = parse_qs(parts.query, keep_blank_values=True)
        path = parts.path.rstrip("/") or "/"
        upgrade = headers.get("upgrade", "").lower() == "websocket"
        t = routes.target(method, path, query, upgrade)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        with self.lock:
            user = self.tokens.get(token) if scheme.lower() == "bearer" else None
        try:
            if user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if t is None:
                doc = routes.discovery(path, f"127.0.0.1:{self.port}") if method == "GET" else None
                if doc is None:
                    raise ApiError(
                        404, "NotFound", "the server could not find the requested resource", {}
                    )
                reply = Reply(200, doc)
            else:
                if not self.allowed(user, t):
                    raise _forbidden(user, t)
                reply = routes.dispatch(self, Request(method, path, query, headers, raw, user), t)
        except ApiError as exc:
            reply = Reply(exc.code, exc.status())
        except Exception as exc:  # a bug of the stand-in's: the test that met it fails
            with self.lock:
                self.errors.append(traceback.format_exc())
            reply = Reply(
                500, ApiError(500, "InternalError", f"Internal error occurred: {exc}").status()
            )
        t = t or Target("", "")
        call = Call(
            method,
            path,
            query,
            t.verb,
            t.resource,
            t.subresource,
            t.namespace,
            t.name,
            user,
            reply.code,
        )
        with self.lock:
            self.log.append(call)
        return reply

    def exec(self, request: Request, t: Target) -> Reply:
        """Checks an exec as the API server and the kubelet do, then answers the upgrade."""
        pod = self.store.need("pods", t.namespace, t.name)
        container = routes.container_of(pod, request.arg("container"))
        if not pod["spec"].get("nodeName"):
            raise bad_request(f"pod {t.name} does not have a host assigned")
        argv = request.query.get("command", [])
        if not argv:
            raise bad_request("you must specify at least 1 command")
        protocol = exec_.choose(request.headers.get("sec-websocket-protocol", ""))
        if protocol is None:
            raise bad_request("unable to upgrade connection: no supported subprotocol was offered")
        kubelet = self.cluster.kubelet
        kubelet.running(t.namespace, t.name, container)
        stdin, tty = request.flag("stdin"), request.flag("tty")

        def upgrade(handler: Any) -> None:
            ws = exec_.handshake(handler, protocol)
            try:
                _, proc = kubelet.spawn(t.namespace, t.name, container, argv, tty)
            except OSError as exc:
                exec_.session(ws, protocol, argv, exc, stdin)
                return
            except ApiError as exc:  # the pod stopped meanwhile
                exec_.session(ws, protocol, argv, OSError(exc.message), stdin)
                return
            exec_.session(ws, protocol, argv, proc, stdin)

        return Reply(101, upgrade=upgrade)


def _forbidden(user: str, t: Target) -> ApiError:
    what = t.resource + (f"/{t.subresource}" if t.subresource else "")
    scope = f'in the namespace "{t.namespace}"' if t.namespace else "at the cluster scope"
    message = f'User "{user}" cannot {t.verb} resource "{what}" in API group "{t.group}" {scope}'
    return forbidden(t.resource, t.name, message)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        standin: StandIn = self.server.standin  # type: ignore[attr-defined]
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = standin.handle(self.command, self.path, headers, raw)
        if reply.upgrade is not None:
            reply.upgrade(self)
            return
        if reply.chunks is not None:
            self._stream(reply)
            return
        data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        self.send_response(reply.code)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, reply: Reply) -> None:
        assert reply.chunks is not None
        self.send_response(reply.code)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in reply.chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            close = getattr(reply.chunks, "close", None)
            if close is not None:
                close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, *args: object) -> None:
        pass
