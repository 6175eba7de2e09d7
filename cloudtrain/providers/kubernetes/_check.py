"""``cloudtrain check --provider kubernetes``: are the kubeconfig's credentials accepted, may
they do what `up`, `train` and `down` do in the namespace, and what GPU quota is left there?

Calls, all read-only (a review creates nothing that stays):

    SelfSubjectReview            validity; who the API server says the credentials are
                                 (``kubectl auth whoami``; a server older than 1.28 has none:
                                 the context's user is named instead)
    SelfSubjectAccessReview,     each verb of the Role the namespace must grant (`RULES`, the
    one per verb                 guide's Role): a verb denied blocks `up`, so the cluster is
                                 not usable until it is granted
    ResourceQuota list           the namespace's quotas on GPUs (``requests.nvidia.com/gpu``),
                                 pods, and CPU and memory requests (of the pods' defaults,
                                 `_pods.requests`), with what is used

A quota that cannot be read is a finding, not a failure; only the identity call decides
whether the credentials are valid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cloudtrain.check import GLOBAL, Finding, Quota, Report, unread
from cloudtrain.errors import CloudtrainError
from cloudtrain.providers.kubernetes import _pods, _quantity
from cloudtrain.providers.kubernetes._api import Api, NotFound, client_module

if TYPE_CHECKING:
    from cloudtrain.plan.catalog import InstanceType

SDK: tuple[str, ...] = ("kubernetes",)
EXTRA = "kubernetes"
CREDENTIALS_FIX = (
    "renew the context's credentials (`aws eks update-kubeconfig`, `gcloud container clusters "
    "get-credentials`, `az aks get-credentials`), or choose another with --context"
)
GUIDE = "docs/guide/kubernetes.md"
#: The Role a namespace must grant (the guide's): (API group, resource, subresource) → verbs.
RULES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("", "pods", ""): ("get", "list", "watch", "create", "delete", "deletecollection", "patch"),
    ("", "pods", "exec"): ("create", "get"),
    ("", "pods", "log"): ("get",),
    ("", "services", ""): ("get", "list", "create", "delete"),
    ("networking.k8s.io", "networkpolicies", ""): (
        "get", "list", "create", "delete", "deletecollection",
    ),
}  # fmt: skip
#: The quotas read besides CPU and memory requests: keys of a ResourceQuota's ``hard``.
GPUS, PODS = "requests.nvidia.com/gpu", "pods"
GIB = 1 << 30


def check(options: Mapping[str, Any], rows: Sequence[InstanceType]) -> Report:
    api = Api(options)
    identity = f"{_who(api)}, namespace {api.namespace}"
    findings = _denied(api)
    quotas: list[Quota] = []
    try:
        quotas = _quotas(api, rows)
    except CloudtrainError as exc:
        findings.append(unread("the namespace's quotas", exc, "list resourcequotas"))
    return Report(identity, tuple(quotas), tuple(findings))


def _who(api: Api) -> str:
    """Who the server says the credentials are; the context's user where it cannot say."""
    k8s = client_module()
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        with api.calling("ask who the credentials are"):
            found = k8s.client.AuthenticationV1Api(api.client).create_self_subject_review(review)
    except NotFound:  # before 1.28: the call is not there
        return api.user or "?"
    info = found.status.user_info if found.status else None
    return str(info.username) if info and info.username else api.user or "?"


def _denied(api: Api) -> list[Finding]:
    """One finding per resource with verbs the credentials may not use in the namespace."""
    asked = [(res, verb) for res, verbs in RULES.items() for verb in verbs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda rv: _may(api, *rv), asked))
    denied: dict[tuple[str, str, str], list[str]] = {}
    for (res, verb), allowed in zip(asked, answers, strict=True):
        if allowed is False:
            denied.setdefault(res, []).append(verb)
        elif isinstance(allowed, CloudtrainError):
            return [
                unread("what the credentials may do", allowed, "create selfsubjectaccessreviews")
            ]
    return [
        Finding(
            f"may not {', '.join(verbs)} {_named(res)} in namespace {api.namespace}",
            f"ask for the Role in {GUIDE} (`kubectl auth can-i --list -n {api.namespace}` "
            "shows what these credentials may do)",
            blocks=True,
        )
        for res, verbs in denied.items()
    ]


def _named(res: tuple[str, str, str]) -> str:
    """``pods/exec``, ``networkpolicies.networking.k8s.io``: as RBAC names them."""
    group, resource, subresource = res
    return "/".join(filter(None, (".".join(filter(None, (resource, group))), subresource)))


def _may(api: Api, res: tuple[str, str, str], verb: str) -> bool | CloudtrainError:
    k8s = client_module()
    group, resource, subresource = res
    attributes = {"namespace": api.namespace, "verb": verb, "resource": resource}
    if group:
        attributes["group"] = group
    if subresource:
        attributes["subresource"] = subresource
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    try:
        with api.calling(f"ask whether {verb} {_named(res)} is allowed"):
            done = k8s.client.AuthorizationV1Api(api.client).create_self_subject_access_review(
                review
            )
    except CloudtrainError as exc:
        return exc
    return bool(done.status and done.status.allowed)


def _quotas(api: Api, rows: Sequence[InstanceType]) -> list[Quota]:
    """The namespace's quotas on GPUs and pods; `needs`: what one node of each row takes."""
    with api.calling(f"list the resource quotas of namespace {api.namespace}"):
        found = api.core.list_namespaced_resource_quota(api.namespace).items
    asked = {r.instance_type: _pods.requests(None, None, r.accelerator_count) for r in rows}

    def each(key: str, scale: int = 1) -> tuple[tuple[str, int], ...]:
        return tuple(
            (t, math.ceil((_quantity.parse(a[key]) or 0) / scale)) for t, a in asked.items()
        )

    needs = {  # key: unit, what one node of each row takes, and the unit's size
        GPUS: ("GPUs", tuple((r.instance_type, r.accelerator_count) for r in rows), 1),
        PODS: ("pods", tuple((r.instance_type, 1) for r in rows), 1),
        "requests.cpu": ("CPUs", each("cpu"), 1),
        "requests.memory": ("GiB", each("memory", GIB), GIB),
    }
    quotas = []
    for q in found:
        hard = (q.status.hard if q.status else None) or (q.spec.hard if q.spec else None) or {}
        used = (q.status.used if q.status else None) or {}
        for key, (unit, takes, scale) in needs.items():
            limit = _quantity.parse(str(hard.get(key, "")))
            if limit is None:
                continue
            spent = _quantity.parse(str(used[key])) if key in used else None
            quotas.append(
                Quota(
                    GLOBAL,
                    f"ResourceQuota {q.metadata.name}: {key}",
                    float(limit / scale),
                    None if spent is None else float(spent / scale),
                    unit,
                    needs=takes,
                    how=f"ask the cluster's admins (namespace {api.namespace})",
                )
            )
    return quotas
