"""What the provider asks the API server to make: one pod per node and a headless Service, each
carrying the labels that say whose it is. Plain dicts, as the API's JSON has them (the client
sends a dict body as it is), so a dry run shows exactly what `up` sends.

**Labels.** ``cloudtrain.dev/cluster`` (the name), ``cloudtrain.dev/cluster-id`` (the
incarnation), ``cloudtrain.dev/owner`` and ``cloudtrain.dev/node`` (the index). A label value
cannot hold an owner as cloudtrain writes it (``user@host``), so the label holds a digest of it
and the annotation of the same key the owner itself: selection by the label, words by the
annotation. Everything of a cluster is found by a label selector, never by local state.

**The pod** runs a keeper as its main process (`KEEPER`): it lives until the pod is deleted,
reaps what exec'd commands leave behind, and turns the grace period's SIGTERM (an eviction, a
drain, a node going away) into the node's notice (``python -m cloudtrain.node notice``), the
same "checkpoint now" a cloud's preemption notice gives; it then lives on, so the job has the
whole grace period (``terminationGracePeriodSeconds``, 30) to save before the kill. When the
node's folder, once made, is gone (its agent removed the node: autostop), the keeper ends, and
with it the pod: its GPUs go back to the cluster, though no one deleted it (the pod holds no
token to do so; the next command here does, `cloudtrain.autostop`).

Its GPUs are limits (the device plugin's ``nvidia.com/gpu``), its CPUs and memory requests
only (it may use more where its node has them: ``--cpus``, ``--memory``), its shared memory a
memory-backed ``/dev/shm`` (NCCL needs more than a container's 64 MiB), and it gets no service
account token: nothing on a node calls the API. ``restartPolicy: Never``: a pod that ends is
a node lost, which a managed job replaces.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from cloudtrain.errors import ConfigError
from cloudtrain.providers.kubernetes import _quantity

PREFIX = "cloudtrain.dev/"
LABEL_CLUSTER = PREFIX + "cluster"
LABEL_ID = PREFIX + "cluster-id"
LABEL_OWNER = PREFIX + "owner"
LABEL_NODE = PREFIX + "node"
#: The node's folder in the pod (learned from the pod's ``$HOME`` once it runs).
ANNOTATION_ROOT = PREFIX + "root"
#: The device plugin's resource of NVIDIA GPUs, and GPU feature discovery's product label.
GPU = "nvidia.com/gpu"
GPU_PRODUCT = "nvidia.com/gpu.product"
#: The GPUs by the product name GPU feature discovery labels nodes with (its usual spellings).
PRODUCTS = {
    "V100": "Tesla-V100-SXM2-16GB",
    "A100": "NVIDIA-A100-SXM4-80GB",
    "H100": "NVIDIA-H100-80GB-HBM3",
}
#: The pod's main process (see the module docstring): sh, so that any image with a shell
#: serves; the node's folder is under its $HOME (`node_root`).
KEEPER = """\
root="$HOME/.cloudtrain/node"
notice() {
  [ -d "$root" ] && "$CT_PYTHON" -m cloudtrain.node notice --root "$root" \\
    --source kubernetes --action end >/dev/null 2>&1
}
trap notice TERM
made=""
while :; do
  sleep 2 & wait $!
  if [ -d "$root" ]; then made=1; elif [ -n "$made" ]; then exit 0; fi
done
"""
#: A label's name and value as Kubernetes allows them (a key may have a DNS prefix and '/').
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
_LABEL_VALUE = re.compile(rf"({_NAME})?")
#: Kueue's labels and annotation that make the pods one gang (its plain-pod integration).
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT = "kueue.x-k8s.io/pod-group-total-count"
#: What a pod may request: CPUs and bytes of memory, as (least, most, the words for both).
CPUS = (Fraction(1, 1000), Fraction(1024), "more than 0 (1m at least) and at most 1024")
MEMORY = (Fraction(64 << 20), Fraction(64 << 40), "from 64Mi to 64Ti")


def node_root(home: str) -> str:
    """The node's folder in a pod whose ``$HOME`` is `home` (as `KEEPER` writes it)."""
    return f"{home.rstrip('/')}/.cloudtrain/node"


def owner_label(owner: str) -> str:
    """The label value that stands for `owner` (a digest: labels take 63 characters of
    ``[A-Za-z0-9_.-]``)."""
    return "o" + hashlib.sha256(owner.encode()).hexdigest()[:40]


def pod_name(cluster: str, index: int) -> str:
    return f"{cluster}-{index}"


def service_name(cluster: str) -> str:
    return f"{cluster}-nodes"


def selector(cluster: str | None, owner: str | None = None, cluster_id: str | None = None) -> str:
    """The label selector of a cluster's objects (every cluster's with `cluster` None)."""
    parts = [f"{LABEL_CLUSTER}={cluster}" if cluster else LABEL_CLUSTER]
    if owner is not None:
        parts.append(f"{LABEL_OWNER}={owner_label(owner)}")
    if cluster_id:
        parts.append(f"{LABEL_ID}={cluster_id}")
    return ",".join(parts)


def node_selector(text: str | None, accelerator: str | None) -> dict[str, str]:
    """``--node-selector KEY=VALUE[,KEY=VALUE]``, or the GPU's product label by default."""
    if not text:
        product = PRODUCTS.get(accelerator or "")
        return {GPU_PRODUCT: product} if product else {}
    found: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise ConfigError(
                f"--node-selector {text!r}: give KEY=VALUE pairs separated by ',', each a "
                "label as Kubernetes allows it (e.g. nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB)"
            )
        found[key] = value
    return found


def requests(cpus: object, memory: object, gpus: int) -> dict[str, str]:
    """The pod's ``cpu`` and ``memory`` requests: ``--cpus`` and ``--memory`` as given, or 2
    CPUs and 8Gi per GPU (1 and 2Gi without); `ConfigError` naming the flag for a value that is
    not a quantity, or is outside what a pod may ask (`CPUS`, `MEMORY`)."""
    cpu = _given(cpus) or str(2 * gpus if gpus else 1)
    mem = _given(memory) or (f"{8 * gpus}Gi" if gpus else "2Gi")
    for flag, text, (least, most, allowed), example in (
        ("--cpus", cpu, CPUS, "8, 7.5 or 7500m"),
        ("--memory", mem, MEMORY, "32Gi or 512Mi; a number alone is bytes"),
    ):
        value = _quantity.parse(text)
        if value is None or not least <= value <= most:
            raise ConfigError(
                f"{flag} {text!r}: give a Kubernetes quantity {allowed} per pod (e.g. {example})"
            )
    return {"cpu": cpu, "memory": mem}


def _given(value: object) -> str:
    return "" if value is None else str(value).strip()


def labels(cluster: str, owner: str, cluster_id: str | None) -> dict[str, str]:
    found = {LABEL_CLUSTER: cluster, LABEL_OWNER: owner_label(owner)}
    if cluster_id:
        found[LABEL_ID] = cluster_id
    return found


def pod(
    cluster: str,
    index: int,
    *,
    owner: str,
    cluster_id: str | None,
    image: str,
    python: str,
    gpus: int,
    nodes: int,
    selector: Mapping[str, str],
    requests: Mapping[str, str],
    queue: str | None = None,
) -> dict[str, Any]:
    """Node `index`'s pod of a cluster of `nodes` nodes: its GPUs as limits (and requests),
    its `requests` of cpu and memory as requests only, so that it may use more when the node
    has it."""
    meta_labels = {**labels(cluster, owner, cluster_id), LABEL_NODE: str(index)}
    annotations = {LABEL_OWNER: owner}
    if queue:
        meta_labels[KUEUE_QUEUE] = queue
        meta_labels[KUEUE_GROUP] = f"{cluster}-{cluster_id or 'x'}"
        annotations[KUEUE_COUNT] = str(nodes)
    limits = {GPU: str(gpus)} if gpus else {}
    resources = {**({"limits": limits} if limits else {}), "requests": {**limits, **requests}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(cluster, index),
            "labels": meta_labels,
            "annotations": annotations,
        },
        "spec": {
            "restartPolicy": "Never",
            "hostname": pod_name(cluster, index),
            "subdomain": service_name(cluster),
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 30,
            **({"nodeSelector": dict(selector)} if selector else {}),
            "containers": [
                {
                    "name": "node",
                    "image": image,
                    "command": ["sh", "-c", KEEPER],
                    "env": [{"name": "CT_PYTHON", "value": python}],
                    "resources": resources,
                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def service(cluster: str, owner: str, cluster_id: str | None) -> dict[str, Any]:
    """The headless Service that gives each pod a stable name (``NAME.SERVICE``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(cluster),
            "labels": labels(cluster, owner, cluster_id),
            "annotations": {LABEL_OWNER: owner},
        },
        "spec": {
            "clusterIP": "None",
            "selector": labels(cluster, owner, cluster_id),
            "publishNotReadyAddresses": True,
        },
    }


def network_policy(cluster: str, owner: str, cluster_id: str | None) -> dict[str, Any]:
    """The NetworkPolicy that keeps the cluster's listeners its own: its pods take traffic
    from its pods alone (the rendezvous, the collectives' sockets), as a cloud cluster's
    security group does. Exec goes through the API server and the kubelet, not the pod
    network, so commands are not held by it; egress is left as the namespace has it."""
    own = {"matchLabels": labels(cluster, owner, cluster_id)}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": service_name(cluster),
            "labels": labels(cluster, owner, cluster_id),
            "annotations": {LABEL_OWNER: owner},
        },
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own}]}],
        },
    }
