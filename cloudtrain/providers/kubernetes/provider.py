"""Clusters on a Kubernetes cluster the team already runs: each node a pod.

`apply` makes a headless Service and one pod per node (`_pods`: the GPUs, and the CPUs and
memory ``--cpus``/``--memory`` ask), all or nothing: it waits until every pod runs (one list,
then one watch: `_wait`), says why one is pending (the scheduler's own words: ``0/4 nodes are
available: 4 Insufficient nvidia.com/gpu``), and past ``--wait`` deletes every pod it made and
raises `CapacityError` with that reason; an image that cannot be pulled ends the wait at once,
naming the image. Once they run, each pod's folder is learned from its ``$HOME`` (recorded on
the pod as an annotation: `describe` needs no command) and its check-only bootstrap starts
through exec (`_executor`), as on a Slurm node: the image brings Python and torch, cloudtrain's
wheel comes from here.

Everything is found by label selector (`_pods.selector`), never by local state: `describe`,
`clusters`, `leftovers` and `terminate` (which deletes the pods and the Service by label and
waits until the pods are gone). A name that another owner's pods, or another incarnation's,
hold is refused before anything is made. Two `apply`s of one name make one set of pods: a pod
that exists already (409) is the other's, and is kept.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.executors.base import fan_out
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent, Plan, ignore_event
from cloudtrain.providers.kubernetes import _pods, _read, _wait
from cloudtrain.providers.kubernetes._api import NAME, Api, Conflict, NotFound
from cloudtrain.providers.kubernetes._executor import ExecExecutor
from cloudtrain.provision.provider import (
    ProviderContext,
    default_owner,
    node_price,
    option_seconds,
)
from cloudtrain.spec import ClusterSpec

#: The image when the user names none: PyTorch's own, whose CUDA runs on V100 to H100.
DEFAULT_IMAGE = "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime"
#: How long pods may pend before `apply` deletes them (``--wait``), and end once deleted.
WAIT_S = 300.0
GONE_S = 120.0
#: What a pod's ``$HOME`` may be: an absolute path of plain characters (the pod's word).
_HOME = re.compile(r"/[A-Za-z0-9_./-]{0,200}")
#: An image reference as registries take it.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")


class KubernetesProvider:
    """Clusters as gangs of pods."""

    name: ClassVar[str] = NAME
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.MULTI_NODE, Capability.GPU, Capability.IMAGE, Capability.AUTOSTOP}
    )

    def __init__(self, context: ProviderContext) -> None:
        opts = context.options
        self._options = dict(opts)
        self.python = str(opts.get("python") or "python3")
        self.queue = str(opts.get("queue") or "") or None
        self.wait_s = option_seconds(opts, "wait", WAIT_S, most=86400)
        self.node_price = node_price(opts)
        self.owner = default_owner()

    @functools.cached_property
    def api(self) -> Api:
        return Api(self._options)

    # -- the five verbs ------------------------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        accel, count = spec.resources.accelerator, spec.resources.count
        selector = _pods.node_selector(self._options.get("node_selector"), accel)
        image = spec.resources.image or DEFAULT_IMAGE
        if not _IMAGE.fullmatch(image):
            raise ConfigError(f"--image {image!r} is not an image reference (REGISTRY/NAME:TAG)")
        if self.queue is not None and not re.fullmatch(
            r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", self.queue
        ):
            raise ConfigError(f"--queue {self.queue!r} is not a LocalQueue's name")
        asked = _pods.requests(
            self._options.get("cpus"), self._options.get("memory"), count if accel else 0
        )
        self._refuse_others(spec.name, spec.cluster_id)  # the API answers, before any record
        offer = Offer(
            NAME, self.api.namespace, (self.api.namespace,), "pod", self.node_price, False,
            accel, count if accel else 0,
        )  # fmt: skip
        requests = [self._pod(spec, i, image, selector, asked) for i in range(spec.num_nodes)]
        service = _pods.service(spec.name, self.owner, spec.cluster_id)
        policy = _pods.network_policy(spec.name, self.owner, spec.cluster_id)
        return Plan(spec=spec, offers=(offer,), requests=(service, policy, *requests))

    def _pod(
        self,
        spec: ClusterSpec,
        index: int,
        image: str,
        selector: Mapping[str, str],
        asked: Mapping[str, str],
    ) -> dict[str, Any]:
        accel, count = spec.resources.accelerator, spec.resources.count
        return _pods.pod(
            spec.name, index, owner=self.owner, cluster_id=spec.cluster_id, image=image,
            python=self.python, gpus=count if accel else 0, nodes=spec.num_nodes,
            selector=selector, requests=asked, queue=self.queue,
        )  # fmt: skip

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        spec = plan.spec
        self._refuse_others(spec.name, spec.cluster_id)
        ended = [p for p in self._pods(spec.name, spec.cluster_id) if _read.ended(p)]
        self._delete([p.metadata.name for p in ended])  # a node lost: made again below
        self._until_gone(spec.name, spec.cluster_id, {p.metadata.name for p in ended})
        live = {_read.index(p) for p in self._pods(spec.name, spec.cluster_id)}
        service, policy, *pods = plan.requests
        made: list[str] = []
        try:
            self._create("service", service)
            self._create("network policy", policy)  # before a pod listens
            for index, body in enumerate(pods):
                if index not in live and self._create("pod", body):
                    made.append(str(body["metadata"]["name"]))
            if made:
                on_event(Event("node", f"made pod(s) {', '.join(made)} in {self.api.namespace}"))
            self._until_running(spec, on_event)
        except BaseException:
            self._undo(spec, made)
            raise
        nodes = self.describe(spec.name, spec.cluster_id)
        fan_out(lambda n: self._make_node(spec, n), nodes)
        return self.describe(spec.name, spec.cluster_id)

    def _undo(self, spec: ClusterSpec, made: Sequence[str]) -> None:
        """All or nothing: delete the pods this `apply` made, and the Service when no other
        pod of the cluster is left. Each step is tried whatever the one before met (the error
        that ended `apply` is the one to report)."""
        with contextlib.suppress(ProviderError):
            self._delete(made)
        with contextlib.suppress(ProviderError):
            self._until_gone(spec.name, spec.cluster_id, set(made))
        with contextlib.suppress(ProviderError):
            left = {p.metadata.name for p in self._pods(spec.name, spec.cluster_id)}
            if left <= set(made):  # none but those going: the Service is this apply's too
                self._delete_shared(spec.name, spec.cluster_id)

    def _create(self, kind: str, body: Mapping[str, Any]) -> bool:
        """Create the pod, service or network policy `body`; False when this cluster's exists
        already (another `apply` made it: 409); `ConfigError` when the object of that name is
        not this cluster's (made by hand), or the namespace is not there."""
        core, net = self.api.core, self.api.net
        namespace, name = self.api.namespace, body["metadata"]["name"]
        create, read = {
            "pod": (core.create_namespaced_pod, core.read_namespaced_pod),
            "service": (core.create_namespaced_service, core.read_namespaced_service),
            "network policy": (
                net.create_namespaced_network_policy,
                net.read_namespaced_network_policy,
            ),
        }[kind]
        try:
            with self.api.calling(f"create {kind} {name}"):
                create(namespace, dict(body))
            return True
        except NotFound as exc:
            raise ConfigError(
                f"--namespace {namespace!r}: not found at {self.api.host} ({exc})"
            ) from exc
        except Conflict:
            with self.api.calling(f"read {kind} {name}"):
                found = read(name, namespace).metadata.labels or {}
        wanted = body["metadata"]["labels"]
        if any(found.get(k) != wanted[k] for k in (_pods.LABEL_CLUSTER, _pods.LABEL_OWNER)):
            raise ConfigError(
                f"{kind} {name} in namespace {namespace} is not this cluster's (made by hand, "
                "or by another tool): choose another cluster name, or delete it"
            )
        return False

    def _until_running(self, spec: ClusterSpec, on_event: OnEvent) -> None:
        """Wait until every pod of the cluster runs with an address (`_wait.until_running`:
        one list and one watch; `CapacityError` past ``--wait``)."""
        selector = _pods.selector(spec.name, self.owner, spec.cluster_id)
        what = f"the pods of {spec.name!r}"
        _wait.until_running(self.api, selector, what, spec.num_nodes, self.wait_s, on_event)

    def _make_node(self, spec: ClusterSpec, node: NodeInfo) -> None:
        """Learn the pod's folder (recorded on it), and start its check-only bootstrap."""
        ex = self.executor(node)
        root = node.root
        if not root:
            home = ex.run(["sh", "-c", 'printf %s "$HOME"'], timeout=60).check().stdout
            if not _HOME.fullmatch(home) or ".." in home.split("/"):
                raise ProviderError(
                    NAME, "NoHome", f"pod {ex.pod}: its $HOME {home[:80]!r} is no folder"
                )
            root = _pods.node_root(home)
            patch = {"metadata": {"annotations": {_pods.ANNOTATION_ROOT: root}}}
            with self.api.calling(f"record the folder of pod {ex.pod}"):
                self.api.core.patch_namespaced_pod(ex.pod, self.api.namespace, patch)
        shape = bootstrap.NodeShape(NAME, spec.resources.accelerator, spec.resources.count)
        bootstrap.start_checks(ex, shape, root=root, python=self.python)

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        nodes = {}
        for p in self._pods(cluster, cluster_id):
            index = _read.index(p)
            if index is None or (index in nodes and _read.ended(p)):
                continue
            annotations = p.metadata.annotations or {}
            nodes[index] = NodeInfo(
                cluster=cluster,
                index=index,
                node_id=str(p.metadata.uid),
                private_ip=p.status.pod_ip if _read.running(p) else None,
                public_ip=None,
                state=_read.state(p),
                zone=p.spec.node_name,
                instance_type="pod",
                root=str(annotations.get(_pods.ANNOTATION_ROOT) or ""),
                python=self.python,
                region=self.api.namespace,
                extra=MappingProxyType({"pod": p.metadata.name, "namespace": self.api.namespace}),
            )
        return [nodes[i] for i in sorted(nodes)]

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        """Delete the cluster's pods and Service by label, and wait until the pods are gone."""
        selector = _pods.selector(cluster, self.owner, cluster_id)
        with self.api.calling(f"delete the pods of {cluster!r}"):
            _drain(
                self.api.core.delete_collection_namespaced_pod(
                    self.api.namespace,
                    label_selector=selector,
                    grace_period_seconds=1,  # the jobs were stopped: no grace to save in
                    _preload_content=False,
                )
            )
        self._delete_shared(cluster, cluster_id)
        self._until_gone(cluster, cluster_id, None)

    def clusters(self) -> list[str]:
        selector = _pods.selector(None, self.owner)
        found = self._listed(selector, "this owner's pods and services")
        return sorted(
            {(o.metadata.labels or {}).get(_pods.LABEL_CLUSTER, "") for o in found} - {""}
        )

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        """The cluster's Service and NetworkPolicy, and pods that ended (a node lost: not a
        node any more)."""
        found = [
            f"pod {p.metadata.name} ({p.status.phase})"
            for p in self._pods(cluster, cluster_id)
            if _read.ended(p)
        ]
        selector = _pods.selector(cluster, self.owner, cluster_id)
        with self.api.calling(f"list the network policies of {cluster!r}"):
            policies = self.api.net.list_namespaced_network_policy(
                self.api.namespace, label_selector=selector
            ).items
        found += [f"service {s.metadata.name}" for s in self._services(cluster, cluster_id)]
        return found + [f"network policy {p.metadata.name}" for p in policies]

    def executor(self, node: NodeInfo) -> ExecExecutor:
        pod = node.extra.get("pod")
        if not pod:
            raise ProviderError(
                NAME, "NoPod", f"node {node.index} of {node.cluster!r}: its record names no pod; "
                "`cloudtrain status --refresh` reads it",
            )  # fmt: skip
        return ExecExecutor(self.api, str(pod), self.python)

    # -- by label ------------------------------------------------------------------------------

    def _pods(self, cluster: str, cluster_id: str | None) -> list[Any]:
        selector = _pods.selector(cluster, self.owner, cluster_id)
        with self.api.calling(f"list the pods of {cluster!r}"):
            return list(
                self.api.core.list_namespaced_pod(self.api.namespace, label_selector=selector).items
            )

    def _services(self, cluster: str, cluster_id: str | None) -> list[Any]:
        selector = _pods.selector(cluster, self.owner, cluster_id)
        with self.api.calling(f"list the services of {cluster!r}"):
            return list(
                self.api.core.list_namespaced_service(
                    self.api.namespace, label_selector=selector
                ).items
            )

    def _listed(self, selector: str, what: str) -> list[Any]:
        """The pods and the services `selector` selects."""
        core, namespace = self.api.core, self.api.namespace
        with self.api.calling(f"list {what}"):
            pods = core.list_namespaced_pod(namespace, label_selector=selector).items
            services = core.list_namespaced_service(namespace, label_selector=selector).items
        return [*pods, *services]

    def _refuse_others(self, cluster: str, cluster_id: str | None) -> None:
        """`ConfigError` when pods or a Service of another owner, or of another incarnation,
        have the name: before anything is made."""
        selector = _pods.selector(cluster)
        found = self._listed(selector, f"what has the name {cluster!r}")
        mine = _pods.owner_label(self.owner)
        for o in found:
            labels = o.metadata.labels or {}
            other_owner = labels.get(_pods.LABEL_OWNER) != mine
            if other_owner or (cluster_id and labels.get(_pods.LABEL_ID) != cluster_id):
                whose = (o.metadata.annotations or {}).get(_pods.LABEL_OWNER) or "no owner"
                whose = whose if other_owner else "another incarnation of yours"
                raise ConfigError(
                    f"cluster {cluster!r}: {o.kind or 'an object'} {o.metadata.name} in namespace "
                    f"{self.api.namespace} has that name ({whose}); choose another name, or "
                    f"`cloudtrain down {cluster}` it first"
                )

    def _delete(self, pods: Sequence[str]) -> None:
        for name in pods:
            try:
                with self.api.calling(f"delete pod {name}"):
                    _drain(
                        self.api.core.delete_namespaced_pod(
                            name, self.api.namespace, grace_period_seconds=1, _preload_content=False
                        )
                    )
            except NotFound:
                pass  # gone already

    def _delete_shared(self, cluster: str, cluster_id: str | None) -> None:
        """Delete the cluster's NetworkPolicy, then its Service (what `clusters` finds last)."""
        selector = _pods.selector(cluster, self.owner, cluster_id)
        with self.api.calling(f"delete the network policy of {cluster!r}"):
            _drain(
                self.api.net.delete_collection_namespaced_network_policy(
                    self.api.namespace, label_selector=selector, _preload_content=False
                )
            )
        for s in self._services(cluster, cluster_id):
            try:
                with self.api.calling(f"delete service {s.metadata.name}"):
                    _drain(
                        self.api.core.delete_namespaced_service(
                            s.metadata.name, self.api.namespace, _preload_content=False
                        )
                    )
            except NotFound:
                pass

    def _until_gone(self, cluster: str, cluster_id: str | None, names: set[str] | None) -> None:
        """Wait until the pods `names` (None: every pod of the cluster) are gone."""
        if names is None or names:
            selector = _pods.selector(cluster, self.owner, cluster_id)
            _wait.until_gone(self.api, selector, f"the pods of {cluster!r}", names, GONE_S)


def _drain(response: Any) -> None:
    """Read an answer left unparsed (a delete's: the objects as they go, of no use here) to
    its end, so that its connection goes back to the pool, not reset when it is collected."""
    response.read()
    response.release_conn()
