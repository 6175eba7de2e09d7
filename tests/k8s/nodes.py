"""Simulated nodes, the scheduler's rules, and ResourceQuota admission (no HTTP, no processes).

A node is a Node object (capacity and allocatable with ``nvidia.com/gpu``, the GPU product as
the label ``nvidia.com/gpu.product``, taints). `place` finds a node for a pod as
kube-scheduler's default filters do, in their order, and stops at a node's first failing one:

=============  ===============================================================  ==============
filter         a node fails when                                               preemption
=============  ===============================================================  ==============
taints         a ``NoSchedule``/``NoExecute`` taint is not tolerated            not helpful
node selector  ``spec.nodeSelector`` is not a subset of its labels             not helpful
resources      cpu, memory, ``nvidia.com/gpu`` or the pod count do not fit     no victims
=============  ===============================================================  ==============

and, when no node passes, says why in the real ``FitError`` words::

    0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are
    available: 2 No preemption victims found for incoming pod.

What a node has left counts the pods bound to it that are not Succeeded or Failed (no
priorities, so preemption never finds a victim; no affinity beyond ``nodeSelector``).
`quota_check` is the ResourceQuota admission plugin's check and message.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from tests.k8s.store import ApiError, Obj, now

GPU = "nvidia.com/gpu"
_SUFFIX: dict[str, Fraction] = {
    **{
        s: Fraction(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))
    },
    **{s: Fraction(10) ** (3 * (i + 1)) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    **{s: Fraction(10) ** (-3 * (i + 1)) for i, s in enumerate(("m", "u", "n"))},
}


def quantity(text: str | int | float) -> Fraction:
    """A resource quantity (``500m``, ``1.5``, ``64Gi``, ``1e3``) as an exact number."""
    text = str(text).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            return Fraction(text[: -len(suffix)]) * _SUFFIX[suffix]
    if "e" in text.lower():
        mantissa, _, exponent = text.lower().partition("e")
        return Fraction(mantissa) * Fraction(10) ** int(exponent)
    return Fraction(text)


def show(value: Fraction, resource: str) -> str:
    """A quantity written back the way the API canonicalises it (``8``, ``500m``, ``1Gi``)."""
    if value.denominator != 1:
        return f"{int(value * 1000)}m"
    number = int(value)
    if "memory" in resource or "storage" in resource:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if number and number % _SUFFIX[suffix] == 0:
                return f"{number // int(_SUFFIX[suffix])}{suffix}"
    return str(number)


def requests(pod: Obj) -> dict[str, Fraction]:
    """What a pod asks for: its containers' requests summed (a limit stands for a missing
    request, as defaulting does), and one ``pods``."""
    total: dict[str, Fraction] = defaultdict(Fraction)
    for container in pod["spec"].get("containers", []):
        res = container.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in asked.items():
            total[name] += quantity(value)
    total["pods"] = Fraction(1)
    return dict(total)


def limits(pod: Obj) -> dict[str, Fraction]:
    total: dict[str, Fraction] = defaultdict(Fraction)
    for container in pod["spec"].get("containers", []):
        for name, value in ((container.get("resources") or {}).get("limits") or {}).items():
            total[name] += quantity(value)
    return dict(total)


def terminal(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def node_object(
    name: str,
    address: str,
    gpus: int,
    gpu_product: str,
    cpu: str,
    memory: str,
    taints: Iterable[dict[str, str]],
    labels: dict[str, str],
) -> Obj:
    capacity = {
        "cpu": cpu,
        "memory": memory,
        "pods": "110",
        "ephemeral-storage": "1000Gi",
        "hugepages-2Mi": "0",
    }
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "standin",
    }
    if gpus:
        capacity[GPU] = str(gpus)
        node_labels.update({f"{GPU}.product": gpu_product, f"{GPU}.count": str(gpus)})
    node_labels.update(labels)
    return {
        "metadata": {"name": name, "labels": node_labels, "annotations": {}},
        "spec": {"taints": [dict(t) for t in taints], "podCIDR": "10.244.0.0/24"},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [ready_condition(True)],
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "standin",
                "containerRuntimeVersion": "standin://1.0",
                "kernelVersion": "6.1.0",
                "kubeProxyVersion": "v1.31.0",
                "kubeletVersion": "v1.31.0",
                "machineID": name,
                "operatingSystem": "linux",
                "osImage": "cloudtrain stand-in",
                "systemUUID": name,
            },
        },
    }


def ready_condition(ready: bool) -> dict[str, str]:
    stamp = now()
    if ready:
        status, reason, message = "True", "KubeletReady", "kubelet is posting ready status"
    else:
        status, reason = "Unknown", "NodeStatusUnknown"
        message = "Kubelet stopped posting node status."
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def why_not(pod: Obj, node: Obj, used: dict[str, Fraction]) -> list[tuple[str, bool]]:
    """Why `pod` does not fit `node` (empty: it fits), as (reason, preemption could help)."""
    tolerations = pod["spec"].get("tolerations") or []
    for taint in node["spec"].get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            taint, tolerations
        ):
            text = f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
            return [(text, False)]
    selector = pod["spec"].get("nodeSelector") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return [("node(s) didn't match Pod's node affinity/selector", False)]
    allocatable = node["status"]["allocatable"]
    short = []
    for name, amount in sorted(requests(pod).items()):
        if amount <= 0:
            continue
        have = quantity(allocatable.get(name, "0")) - used.get(name, Fraction(0))
        if amount > have:
            short.append(("Too many pods" if name == "pods" else f"Insufficient {name}", True))
    return short


def fit_error(reasons: dict[str, list[tuple[str, bool]]]) -> str:
    """The scheduler's message for a pod no node takes (`reasons`: node → `why_not`)."""
    total = len(reasons)
    counts: Counter[str] = Counter(text for why in reasons.values() for text, _ in why)
    helps: Counter[str] = Counter(
        "No preemption victims found for incoming pod"
        if any(h for _, h in why)
        else "Preemption is not helpful for scheduling"
        for why in reasons.values()
    )
    head = f"0/{total} nodes are available"
    if not total:
        return f"{head}: no nodes available to schedule pods."
    filters = ", ".join(sorted(f"{n} {t}" for t, n in counts.items()))
    preempt = ", ".join(sorted(f"{n} {t}" for t, n in helps.items()))
    return f"{head}: {filters}. preemption: {head}: {preempt}."


# -- ResourceQuota --------------------------------------------------------------------------


def usage(pods: Iterable[Obj]) -> dict[str, Fraction]:
    """What the pods of a namespace use, in quota names (``pods``, ``requests.cpu``,
    ``requests.nvidia.com/gpu``, ``limits.memory``, and ``cpu``/``memory`` for requests)."""
    used: dict[str, Fraction] = defaultdict(Fraction)
    for pod in pods:
        if terminal(pod):
            continue
        for name, value in requests(pod).items():
            if name == "pods":
                used["pods"] += value
                continue
            used[f"requests.{name}"] += value
            if name in ("cpu", "memory"):
                used[name] += value
        for name, value in limits(pod).items():
            used[f"limits.{name}"] += value
    return dict(used)


def quota_status(quota: Obj, pods: Iterable[Obj]) -> Obj:
    hard = dict(quota.get("spec", {}).get("hard") or {})
    used = usage(pods)
    return {"hard": hard, "used": {k: show(used.get(k, Fraction(0)), k) for k in hard}}


def quota_check(quota: Obj, pods: list[Obj], pod: Obj) -> str | None:
    """The ResourceQuota admission's refusal of `pod` under `quota` (None: admitted)."""
    hard = {k: quantity(v) for k, v in (quota.get("spec", {}).get("hard") or {}).items()}
    name = quota["metadata"]["name"]
    asked = usage([pod])
    for resource in ("requests.cpu", "requests.memory", "limits.cpu", "limits.memory"):
        if resource in hard and resource not in asked:
            return f"failed quota: {name}: must specify {resource.split('.')[1]}"
    used = usage(pods)
    exceeded = sorted(
        r for r, limit in hard.items() if asked.get(r) and used.get(r, 0) + asked[r] > limit
    )
    if not exceeded:
        return None

    def pretty(values: dict[str, Fraction]) -> str:
        return ",".join(f"{r}={show(values.get(r, Fraction(0)), r)}" for r in exceeded)

    return (
        f"exceeded quota: {name}, requested: {pretty(asked)}, used: {pretty(used)}, "
        f"limited: {pretty(hard)}"
    )


def forbidden(resource: str, name: str, message: str) -> ApiError:
    where = f'{resource} "{name}"' if name else resource
    details = {"name": name, "kind": resource} if name else {"kind": resource}
    return ApiError(403, "Forbidden", f"{where} is forbidden: {message}", details)
