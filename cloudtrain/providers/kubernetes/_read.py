"""A pod as the API gives it (the client's model), read: its node index, whether it runs or
ended, and why it waits or ended, in the scheduler's and the kubelet's own words."""

from __future__ import annotations

from typing import Any

from cloudtrain.providers.kubernetes import _pods

#: Why a container cannot start, which waiting longer does not cure.
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


def index(pod: Any) -> int | None:
    text = (pod.metadata.labels or {}).get(_pods.LABEL_NODE, "")
    return int(text) if text.isdigit() else None


def running(pod: Any) -> bool:
    return (
        pod.status is not None
        and pod.status.phase == "Running"
        and bool(pod.status.pod_ip)
        and pod.metadata.deletion_timestamp is None
    )


def ended(pod: Any) -> bool:
    return pod.status is not None and pod.status.phase in ("Succeeded", "Failed")


def state(pod: Any) -> str:
    if pod.metadata.deletion_timestamp is not None:
        return "stopping"
    if running(pod):
        return "running"
    if ended(pod):
        return "terminated"
    return "pending"


def why(pod: Any) -> str:
    """Why the pod ended, in the kubelet's words."""
    status = pod.status
    for c in (status.container_statuses or []) if status else []:
        term = c.state.terminated if c.state else None
        if term is not None:
            return f"exit code {term.exit_code} ({term.reason or 'no reason given'})"
    return (status.reason or status.message or status.phase or "?") if status else "?"


def pending(pod: Any) -> str:
    """Why the pod is pending, in the scheduler's or the kubelet's words ("": it is not)."""
    status = pod.status
    if status is None or status.phase != "Pending":
        return ""
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"pod {pod.metadata.name}: {cond.message or cond.reason}"
    for c in status.container_statuses or []:
        waiting = c.state.waiting if c.state else None
        if waiting is not None and waiting.reason not in (None, "ContainerCreating"):
            return f"pod {pod.metadata.name}: {waiting.reason}: {waiting.message or ''}".rstrip(
                ": "
            )
    return ""


def image_error(pod: Any) -> str:
    """The image that cannot be pulled, in the kubelet's words ("": none)."""
    status = pod.status
    for c in (status.container_statuses or []) if status else []:
        waiting = c.state.waiting if c.state else None
        if waiting is not None and waiting.reason in IMAGE_ERRORS:
            said = waiting.message or "no message"
            return f"image {c.image!r} cannot be pulled ({waiting.reason}: {said})"
    return ""
