"""The controllers of the stand-in: admission, the scheduler, graceful deletion, eviction,
node loss (no HTTP here; `routes` calls these, `standin.StandIn` exposes the faults).

A pod's way through them::

    create ─► admission (spec required, ResourceQuota) ─► stored Pending, no node
       ─► scheduler thread: binds it to a node (PodScheduled True, an address, ``Scheduled``
          event) and hands it to the kubelet ─┐   or: PodScheduled False ``Unschedulable``
                                              │   + ``FailedScheduling``; retried whenever
                                              │   a pod ends or a node is added
    delete ─► deletionTimestamp (MODIFIED) ─► kubelet: SIGTERM, grace, SIGKILL ─► DELETED

A pod that has no node yet, or has finished, is removed at once, as the API server does; so
is one deleted with ``gracePeriodSeconds=0`` (after its processes are killed).
"""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

from tests.k8s.kubelet import Kubelet
from tests.k8s.nodes import (
    fit_error,
    forbidden,
    node_object,
    quantity,
    quota_check,
    ready_condition,
    requests,
    terminal,
    why_not,
)
from tests.k8s.store import ApiError, Obj, Store, invalid, now, record


class Cluster:
    """Nodes, the scheduler and the kubelet over one `Store`."""

    def __init__(
        self,
        store: Store,
        root: Path,
        api: tuple[str, int],
        backoff: tuple[float, float],
        subnet: str,
    ) -> None:
        self.store = store
        self.kubelet = Kubelet(store, root, api, backoff, self.wake)
        self.subnet = subnet  # "127.X.Y": this stand-in's own pod and node addresses
        self._free = [f"{subnet}.{z}" for z in range(2, 255)]
        self._order: dict[str, int] = {}  # pod uid → arrival, the scheduling queue's order
        self._arrivals = itertools.count()
        self._services = itertools.count(1)
        self._wake = threading.Event()
        self._closed = False
        self._deleting: set[threading.Thread] = set()
        self._scheduler = threading.Thread(target=self._schedule_loop, daemon=True)
        self._scheduler.start()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._scheduler.join(5)
        self.kubelet.kill_all()
        self.kubelet.groups.close()

    def wake(self) -> None:
        self._wake.set()

    # -- nodes -------------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        gpus: int,
        gpu_product: str,
        cpu: str,
        memory: str,
        taints: list[dict[str, str]],
        labels: dict[str, str],
    ) -> Obj:
        node = node_object(name, self._address(), gpus, gpu_product, cpu, memory, taints, labels)
        created = self.store.create("nodes", node)
        self.wake()
        return created

    def lose_node(self, name: str, remove: bool) -> None:
        """The node stops answering: its pods' processes die at once, the pods are marked
        Failed (NodeLost) and then removed as the pod garbage collector does; the node turns
        NotReady with the ``unreachable`` taints (or is removed)."""
        node = self.store.need("nodes", "", name)

        def unreachable(n: Obj) -> None:
            n["status"]["conditions"] = [ready_condition(False)]
            taints = [t for t in n["spec"].get("taints", []) if "unreachable" not in t["key"]]
            for effect in ("NoSchedule", "NoExecute"):
                taints.append(
                    {"key": "node.kubernetes.io/unreachable", "effect": effect, "timeAdded": now()}
                )
            n["spec"]["taints"] = taints

        self.store.update("nodes", "", name, unreachable)
        for pod in self._bound(name):
            meta = pod["metadata"]
            self.kubelet.stop(meta["namespace"], meta["name"], 0, publish=False)

            def lost(p: Obj, pod_name: str = meta["name"]) -> None:
                p["status"]["phase"] = "Failed"
                p["status"]["reason"] = "NodeLost"
                p["status"]["message"] = (
                    f"Node {name} which was running pod {pod_name} is unresponsive"
                )
                _set_condition(p, "Ready", "False", "NodeLost", "")
                _set_condition(
                    p, "DisruptionTarget", "True", "DeletionByPodGC", "PodGC: node no longer exists"
                )

            self.store.update("pods", meta["namespace"], meta["name"], lost)
            self._remove(meta["namespace"], meta["name"], meta["uid"])
        if remove:
            self._free.append(_address_of(node))
            self.store.remove("nodes", "", name)
        self.wake()

    def _bound(self, node: str) -> list[Obj]:
        return [p for p in self.store.all("pods") if p["spec"].get("nodeName") == node]

    def _address(self) -> str:
        if not self._free:
            raise ApiError(
                500, "InternalError", f"the stand-in's addresses in {self.subnet}.0/24 are all used"
            )
        return self._free.pop(0)

    # -- admission -----------------------------------------------------------------------------

    def create(self, resource: str, namespace: str, body: Obj) -> Obj:
        """Creates an object of a namespaced kind with the defaults and checks its kind has."""
        body = {**body, "metadata": {**(body.get("metadata") or {}), "namespace": namespace}}
        if resource != "events":
            body.pop("status", None)
        if resource == "pods":
            return self._create_pod(namespace, body)
        if resource == "services":
            spec = body.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") != "None":
                n = next(self._services)
                spec["clusterIP"] = f"10.96.{n // 250}.{n % 250 + 1}"
                spec["clusterIPs"] = [spec["clusterIP"]]
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
            body["status"] = {"loadBalancer": {}}
        if resource == "secrets":
            import base64

            data = dict(body.get("data") or {})
            for key, value in (body.pop("stringData", None) or {}).items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            body["data"] = data
            body.setdefault("type", "Opaque")
        return self.store.create(resource, body)

    def _create_pod(self, namespace: str, body: Obj) -> Obj:
        spec = body.setdefault("spec", {})
        name = body["metadata"].get("name") or body["metadata"].get("generateName", "")
        containers = spec.get("containers") or []
        causes = [] if containers else [("spec.containers", "Required value")]
        for i, c in enumerate(containers):
            if not c.get("name"):
                causes.append((f"spec.containers[{i}].name", "Required value"))
            if not c.get("image"):
                causes.append((f"spec.containers[{i}].image", "Required value"))
        if len({c.get("name") for c in containers}) < len(containers):
            causes.append(("spec.containers[1].name", "Duplicate value"))
        if causes:
            raise invalid("pods", name, causes)
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("tolerations", [])
        for toleration in ("not-ready", "unreachable"):  # the admission plugin's defaults
            spec["tolerations"].append(
                {
                    "key": f"node.kubernetes.io/{toleration}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            )
        for c in containers:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault(
                "imagePullPolicy",
                "Always"
                if c["image"].endswith(":latest") or ":" not in c["image"]
                else "IfNotPresent",
            )
        body["status"] = {"phase": "Pending", "qosClass": _qos(containers)}
        with self.store.lock:
            name = self.store.named(body["metadata"])  # made before admission, as the API does
            quotas = self.store.all("resourcequotas", namespace)
            pods = self.store.all("pods", namespace)
            for quota in quotas:
                refused = quota_check(quota, pods, body)
                if refused is not None:
                    raise forbidden("pods", name, refused)
            pod = self.store.create("pods", body)
            self._order[pod["metadata"]["uid"]] = next(self._arrivals)
        self.wake()
        return pod

    # -- scheduling ----------------------------------------------------------------------------

    def _schedule_loop(self) -> None:
        while not self._closed:
            self._wake.wait(1.0)
            self._wake.clear()
            if not self._closed:
                self._schedule_pending()

    def _schedule_pending(self) -> None:
        with self.store.lock:
            pending = [
                p
                for p in self.store.all("pods")
                if not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
            ]
        pending.sort(key=lambda p: self._order.get(p["metadata"]["uid"], 0))
        for pod in pending:
            self._schedule(pod)

    def _schedule(self, pod: Obj) -> None:
        meta = pod["metadata"]
        with self.store.lock:
            current = self.store.get("pods", meta["namespace"], meta["name"])
            if (
                current is None
                or current["metadata"]["uid"] != meta["uid"]
                or current["spec"].get("nodeName")
            ):
                return
            nodes = self.store.all("nodes")
            reasons, fits = {}, []
            for node in nodes:
                used = self._used(node["metadata"]["name"])
                why = why_not(current, node, used)
                reasons[node["metadata"]["name"]] = why
                if not why:
                    fits.append((self._load(node, used), node["metadata"]["name"], node))
            if not fits:
                message = fit_error(reasons)

                def unschedulable(p: Obj) -> None:
                    p["status"]["phase"] = "Pending"
                    _set_condition(p, "PodScheduled", "False", "Unschedulable", message)

                updated = self.store.update("pods", meta["namespace"], meta["name"], unschedulable)
                record(
                    self.store, updated, "Warning", "FailedScheduling", message, "default-scheduler"
                )
                return
            _, node_name, node = min(fits)
            address = self._address()

            def bind(p: Obj) -> None:
                p["spec"]["nodeName"] = node_name
                _set_condition(p, "PodScheduled", "True", "", "")
                p["status"]["podIP"] = address
                p["status"]["hostIP"] = _address_of(node)

            bound = self.store.update("pods", meta["namespace"], meta["name"], bind)
            text = f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}"
            record(self.store, bound, "Normal", "Scheduled", text, "default-scheduler")
        self.kubelet.start(bound)

    def _used(self, node: str) -> dict[str, Fraction]:
        used: dict[str, Fraction] = {}
        for pod in self._bound(node):
            if terminal(pod):
                continue
            for name, value in requests(pod).items():
                used[name] = used.get(name, Fraction(0)) + value
        return used

    def _load(self, node: Obj, used: dict[str, Fraction]) -> Fraction:
        """The share of cpu and memory in use: the emptiest node wins (LeastAllocated)."""
        allocatable = node["status"]["allocatable"]
        return sum(
            (used.get(r, Fraction(0)) / quantity(allocatable[r]) for r in ("cpu", "memory")),
            Fraction(0),
        )

    # -- deletion ------------------------------------------------------------------------------

    def delete_pod(self, namespace: str, name: str, grace: int | None) -> Obj:
        """DELETE of a pod: graceful on its node (returns it with its deletionTimestamp),
        at once when it has no node, has finished, or `grace` is 0."""
        with self.store.lock:
            pod = self.store.need("pods", namespace, name)
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
            uid = pod["metadata"]["uid"]
            at_once = not pod["spec"].get("nodeName") or terminal(pod) or grace == 0
            if pod["metadata"].get("deletionTimestamp"):
                if at_once:
                    self.kubelet.hurry(namespace, name)
                return pod
            until = datetime.now(UTC) + timedelta(seconds=grace if not at_once else 0)

            def mark(p: Obj) -> None:
                p["metadata"]["deletionTimestamp"] = until.strftime("%Y-%m-%dT%H:%M:%SZ")
                p["metadata"]["deletionGracePeriodSeconds"] = grace if not at_once else 0

            marked = self.store.update("pods", namespace, name, mark)
        if at_once:
            self.kubelet.stop(namespace, name, 0)
            self._remove(namespace, name, uid)
            return marked
        thread = threading.Thread(
            target=self._finish, args=(namespace, name, uid, grace), daemon=True
        )
        self._deleting.add(thread)
        thread.start()
        return marked

    def _finish(self, namespace: str, name: str, uid: str, grace: int) -> None:
        self.kubelet.stop(namespace, name, grace)
        self._remove(namespace, name, uid)
        self._deleting.discard(threading.current_thread())

    def _remove(self, namespace: str, name: str, uid: str) -> None:
        with self.store.lock:
            pod = self.store.get("pods", namespace, name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            self.store.remove("pods", namespace, name)
            self._order.pop(uid, None)
            address = pod["status"].get("podIP")
            if address and address not in self._free:
                self._free.append(address)
        self.wake()

    def evict(self, namespace: str, name: str, options: Obj) -> None:
        """The Eviction API: the pod is marked (DisruptionTarget), then deleted gracefully."""

        def target(p: Obj) -> None:
            _set_condition(
                p, "DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting"
            )

        self.store.update("pods", namespace, name, target)
        grace = options.get("gracePeriodSeconds")
        self.delete_pod(namespace, name, None if grace is None else int(grace))

    def wait_deletions(self, timeout: float = 10) -> None:
        for thread in list(self._deleting):
            thread.join(timeout)

    def release_all(self) -> None:
        self._free = [f"{self.subnet}.{z}" for z in range(2, 255)]
        self._order.clear()


def _set_condition(pod: Obj, type_: str, status: str, reason: str, message: str) -> None:
    conditions: list[Obj] = pod["status"].setdefault("conditions", [])
    old = next((c for c in conditions if c["type"] == type_), None)
    new: dict[str, Any] = {"type": type_, "status": status, "lastProbeTime": None}
    new["lastTransitionTime"] = (
        old["lastTransitionTime"] if old and old["status"] == status else now()
    )
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    if old is not None:
        conditions[conditions.index(old)] = new
    else:
        conditions.append(new)


def _address_of(node: Obj) -> str:
    return str(next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"))


def _qos(containers: list[Obj]) -> str:
    asked = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in asked):
        return "BestEffort"
    for r in asked:
        limits, reqs = (
            r.get("limits") or {},
            {**(r.get("limits") or {}), **(r.get("requests") or {})},
        )
        if any(
            k not in limits or quantity(limits[k]) != quantity(reqs[k]) for k in ("cpu", "memory")
        ):
            return "Burstable"
    return "Guaranteed"
