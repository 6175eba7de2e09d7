"""The kubernetes provider's CPU and memory requests, against the stand-in: what each pod asks
(``--cpus``, ``--memory``, or the defaults per GPU), a value that is not one refused before any
call, and a request no node fits deleted with the scheduler's own reason."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import CapacityError, ConfigError
from tests.k8s.standin import StandIn
from tests.k8s.test_kube_provider import provider, spec


def container(body: Mapping[str, Any]) -> dict[str, Any]:
    (only,) = body["spec"]["containers"]
    return dict(only)


def test_pods_request_the_cpus_and_memory_asked_and_may_burst(
    k8s: StandIn, core: Any, tmp_path: Path
) -> None:
    k8s.add_node("n1", gpus=8, cpu="32", memory="256Gi")
    prov = provider(tmp_path, cpus="7500m", memory="48Gi")
    nodes = prov.apply(prov.plan(spec("rq", nodes=2, gpus="A100:2")))
    assert [n.state for n in nodes] == ["running", "running"]
    for name in ("rq-0", "rq-1"):
        made = core.read_namespaced_pod(name, "default")
        resources = made.spec.containers[0].resources
        assert resources.requests == {"cpu": "7500m", "memory": "48Gi", "nvidia.com/gpu": "2"}
        assert resources.limits == {"nvidia.com/gpu": "2"}, "no cpu or memory limit: it may burst"
        assert made.status.qos_class == "Burstable"
    prov.terminate("rq", "c0ffee000001")
    assert k8s.is_empty(), k8s.leftovers()


@pytest.mark.parametrize(
    ("gpus", "options", "requests"),
    [
        ("A100:4", {}, {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}),
        (None, {}, {"cpu": "1", "memory": "2Gi"}),
        (None, {"cpus": " 0.5 "}, {"cpu": "0.5", "memory": "2Gi"}),
        ("H100:8", {"memory": "1.5Ti"}, {"cpu": "16", "memory": "1.5Ti", "nvidia.com/gpu": "8"}),
    ],
)
def test_the_plan_is_the_request_with_the_defaults_per_gpu(
    k8s: StandIn,
    tmp_path: Path,
    gpus: str | None,
    options: dict[str, str],
    requests: dict[str, str],
) -> None:
    plan = provider(tmp_path, **options).plan(spec("dflt", nodes=2, gpus=gpus))
    _, _, *pods = plan.requests  # the Service, the NetworkPolicy, the pods
    assert [container(p)["resources"]["requests"] for p in pods] == [requests, requests]
    limits = {k: v for k, v in requests.items() if k == "nvidia.com/gpu"}
    assert all(container(p)["resources"].get("limits", {}) == limits for p in pods)
    assert not [c for c in k8s.calls() if c.method != "GET"], "a plan makes nothing"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cpus": "0"}, "--cpus '0': give a Kubernetes quantity more than 0"),
        ({"cpus": "-2"}, "--cpus '-2': give a Kubernetes quantity more than 0"),
        ({"cpus": "eight"}, "--cpus 'eight': "),
        ({"cpus": "8 cores"}, "--cpus '8 cores': "),
        ({"cpus": "0.0001"}, "--cpus '0.0001': give a Kubernetes quantity more than 0 (1m"),
        ({"cpus": "5000"}, "and at most 1024 per pod (e.g. 8, 7.5 or 7500m)"),
        ({"cpus": "1e99"}, "--cpus '1e99': "),
        ({"memory": "0"}, "--memory '0': give a Kubernetes quantity from 64Mi to 64Ti per pod"),
        ({"memory": "32"}, "per pod (e.g. 32Gi or 512Mi; a number alone is bytes)"),
        ({"memory": "32GB"}, "--memory '32GB': "),
        ({"memory": "-1Gi"}, "--memory '-1Gi': "),
        ({"memory": "1Ei"}, "--memory '1Ei': "),
        ({"memory": "32Gi", "cpus": "0m"}, "--cpus '0m': "),
    ],
)
def test_a_bad_cpus_or_memory_is_one_line_before_any_call(
    k8s: StandIn, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        provider(tmp_path, **options).plan(spec("bad", gpus="A100:8"))
    assert "\n" not in str(refused.value)
    assert k8s.calls() == [], "refused before the API is asked anything"
    assert k8s.is_empty()


CPU_SHORT = "0/2 nodes are available: 2 Insufficient cpu."


@pytest.mark.parametrize(
    ("node", "options", "nodes", "reason"),
    [
        (("4", "1000Gi"), {"cpus": "6"}, 1, CPU_SHORT),
        (("96", "32Gi"), {"memory": "48Gi"}, 1, CPU_SHORT.replace("cpu", "memory")),
        # what the pods bound to a node ask counts: one of 3 CPUs per node, the third fits none
        (("4", "1000Gi"), {"cpus": "3"}, 3, CPU_SHORT),
    ],
)
def test_a_request_no_node_fits_fails_with_the_schedulers_reason_and_leaves_nothing(
    k8s: StandIn,
    tmp_path: Path,
    node: tuple[str, str],
    options: dict[str, str],
    nodes: int,
    reason: str,
) -> None:
    for name in ("n1", "n2"):
        k8s.add_node(name, gpus=0, cpu=node[0], memory=node[1])
    prov = provider(tmp_path, wait="3", **options)
    said: list[str] = []
    with pytest.raises(CapacityError) as failed:
        prov.apply(prov.plan(spec("big", nodes=nodes)), lambda e: said.append(e.message))
    assert reason in str(failed.value), failed.value
    assert f"{nodes - 1} of {nodes} pod(s) running after 3 s (--wait)" in str(failed.value)
    pending = [m for m in said if m.startswith("pending:")]
    assert len(pending) == 1, "said once"
    assert pending[0].startswith(f"pending: pod big-{nodes - 1}: {reason} preemption: "), pending
    assert k8s.is_empty(), k8s.leftovers()
