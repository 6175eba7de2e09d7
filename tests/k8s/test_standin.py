"""The Kubernetes stand-in through the official client over HTTP: the API server's rules a
provider relies on (auth, errors, selectors, watches, scheduling, RBAC, quota), so that tests
passing against it mean something on a real cluster."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.k8s.fixtures import api_client, eventually, phase, pod, refused, watching
from tests.k8s.standin import USER, StandIn

GPU8 = {"resources": {"limits": {"nvidia.com/gpu": "8"}}}


def status_of(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.value.body or "")
    return body


def test_requests_without_a_token_it_accepts_are_refused(k8s: StandIn, tmp_path: Path) -> None:
    forged = k8s.kubeconfig(tmp_path / "kubeconfig", token="forged")
    with client.ApiClient(_config(forged)) as api_client:
        api = client.CoreV1Api(api_client)
        with pytest.raises(ApiException) as exc:
            api.list_namespaced_pod("default")
        assert exc.value.status == 401
        assert status_of(exc)["reason"] == "Unauthorized"
        assert [(c.verb, c.user, c.code) for c in k8s.calls()] == [("list", None, 401)]
        k8s.add_token("forged", user="alice")
        assert api.list_namespaced_pod("default").items == []


def _config(path: Path) -> Any:
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(path), client_configuration=configuration
    )
    return configuration


def test_objects_carry_identity_and_lists_honour_selectors(k8s: StandIn, core: Any) -> None:
    made = core.create_namespaced_pod("default", pod("a1", "true", labels={"app": "a"}))
    core.create_namespaced_pod("default", pod("a2", "true", labels={"app": "a", "tier": "x"}))
    core.create_namespaced_pod("default", pod("b1", "true", labels={"app": "b"}))
    core.create_namespaced_pod("team", pod("t1", "true", labels={"app": "a"}))
    generated = core.create_namespaced_pod(
        "default", {"metadata": {"generateName": "g-"}, "spec": pod("x", "true")["spec"]}
    )
    assert made.metadata.uid
    assert made.metadata.creation_timestamp
    assert (made.metadata.namespace, made.status.phase) == ("default", "Pending")
    assert generated.metadata.name.startswith("g-")
    assert len(generated.metadata.name) == 7
    assert int(generated.metadata.resource_version) > int(made.metadata.resource_version)

    def names(labels: str = "", fields: str = "", namespace: str | None = "default") -> list[str]:
        if namespace is None:
            found = core.list_pod_for_all_namespaces(label_selector=labels, field_selector=fields)
        else:
            found = core.list_namespaced_pod(
                namespace, label_selector=labels, field_selector=fields
            )
        return sorted(p.metadata.name for p in found.items)

    assert names("app=a") == names("app==a") == ["a1", "a2"]
    assert names("app!=a") == ["b1", generated.metadata.name]
    assert names("app in (a, b),tier") == ["a2"]
    assert names("app notin (a),app") == ["b1"]
    assert names("app,!tier") == ["a1", "b1"]
    assert names(fields="metadata.name=b1") == ["b1"]
    assert names("app=a", "metadata.name!=a1") == ["a2"]
    assert names(fields="status.phase=Pending,spec.nodeName=") == sorted(
        ["a1", "a2", "b1", generated.metadata.name]
    )
    assert names("app=a", namespace=None) == ["a1", "a2", "t1"]
    listed = core.list_namespaced_pod("default")
    assert int(listed.metadata.resource_version) >= int(generated.metadata.resource_version)
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default", field_selector="spec.image=x")
    assert exc.value.status == 400


def test_errors_are_the_api_servers(k8s: StandIn, core: Any) -> None:
    core.create_namespaced_pod("default", pod("p", "true"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", pod("p", "true"))
    assert exc.value.status == 409
    assert status_of(exc) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "p" already exists',
        "reason": "AlreadyExists",
        "code": 409,
        "details": {"name": "p", "kind": "pods"},
    }
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("nowhere", pod("p", "true"))
    assert (exc.value.status, status_of(exc)["message"]) == (404, 'namespaces "nowhere" not found')
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("missing", "default")
    assert (exc.value.status, status_of(exc)["message"]) == (404, 'pods "missing" not found')
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(
            "default", {"metadata": {"name": "bad"}, "spec": {"containers": [{"name": "c"}]}}
        )
    assert exc.value.status == 422
    message = 'Pod "bad" is invalid: spec.containers[0].image: Required value'
    assert status_of(exc)["message"] == message


def test_patches_change_labels_but_not_a_pods_spec(k8s: StandIn, core: Any) -> None:
    before = core.create_namespaced_pod("default", pod("p", "true", labels={"a": "1"}))
    after = core.patch_namespaced_pod(
        "p", "default", {"metadata": {"labels": {"b": "2", "a": None}}}
    )
    assert after.metadata.labels == {"b": "2"}
    assert after.metadata.uid == before.metadata.uid
    assert int(after.metadata.resource_version) > int(before.metadata.resource_version)
    listed = core.list_namespaced_pod("default", label_selector="b=2").items
    assert [p.metadata.name for p in listed] == ["p"]
    json_patched = core.patch_namespaced_pod(
        "p", "default", [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}]
    )
    assert json_patched.metadata.annotations == {"x": "y"}
    assert {c.path for c in k8s.calls("patch")} == {"/api/v1/namespaces/default/pods/p"}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"spec": {"restartPolicy": "Never"}})
    assert exc.value.status == 422


def test_a_watch_sees_a_pod_start_run_and_go(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    events: list[tuple[str, str]] = []
    opened = threading.Event()

    def follow() -> None:
        w, stream = watching(
            core.list_namespaced_pod, "default", label_selector="app=w", timeout_seconds=20
        )
        opened.set()
        for event in stream:
            events.append((event["type"], event["object"].status.phase))
            if event["type"] == "DELETED":
                w.stop()

    watcher = threading.Thread(target=follow)
    watcher.start()
    opened.wait(5)
    eventually(lambda: k8s.store.watchers)
    core.create_namespaced_pod("default", pod("other", "sleep", "30"))  # not selected
    core.create_namespaced_pod("default", pod("w", "sleep", "30", labels={"app": "w"}))
    eventually(lambda: phase(core, "w") == "Running")
    pid = k8s.pids("default", "w")["c"]
    assert Path(f"/proc/{pid}").exists()
    assert k8s.pod_dir("default", "w").is_dir()
    core.delete_namespaced_pod("w", "default", grace_period_seconds=5)
    watcher.join(15)
    assert events[0] == ("ADDED", "Pending")
    assert ("MODIFIED", "Running") in events
    assert events[-1][0] == "DELETED"
    assert {t for t, _ in events} == {"ADDED", "MODIFIED", "DELETED"}
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    assert not k8s.pod_dir("default", "w").exists()


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"


def test_a_watch_replays_from_a_version_and_expires_when_too_old(k8s: StandIn, core: Any) -> None:
    start = core.list_namespaced_config_map("default").metadata.resource_version
    for name in ("c1", "c2"):
        core.create_namespaced_config_map("default", {"metadata": {"name": name}, "data": {}})
    core.delete_namespaced_config_map("c1", "default")
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in watching(
            core.list_namespaced_config_map,
            "default",
            resource_version=start,
            timeout_seconds=1,
        )[1]
    ]
    assert seen == [("ADDED", "c1"), ("ADDED", "c2"), ("DELETED", "c1")]
    k8s.compact()
    with pytest.raises(ApiException) as exc:
        list(
            watching(
                core.list_namespaced_config_map,
                "default",
                resource_version=start,
                timeout_seconds=1,
            )[1]
        )
    assert exc.value.status == 410
    assert "Expired: too old resource version" in exc.value.reason


def test_dropped_watches_end_their_streams(k8s: StandIn, core: Any) -> None:
    done = threading.Event()
    seen: list[str] = []

    def follow() -> None:
        for event in watching(core.list_namespaced_secret, "default", timeout_seconds=60)[1]:
            seen.append(event["type"])
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    eventually(lambda: k8s.store.watchers)
    core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    eventually(lambda: seen)
    assert k8s.drop_watches() == 1
    assert done.wait(5)
    assert seen == ["ADDED"]
    assert core.read_namespaced_secret("s", "default").data == {"k": "dg=="}


def test_a_pod_that_fits_nowhere_waits_until_capacity_frees(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    k8s.add_node("n2")
    for name in ("a", "b", "c"):
        core.create_namespaced_pod("default", pod(name, "sleep", "30", container=GPU8))
    eventually(lambda: phase(core, "a") == phase(core, "b") == "Running")

    def unschedulable() -> Any:
        conditions = core.read_namespaced_pod("c", "default").status.conditions or []
        return next((c for c in conditions if c.reason == "Unschedulable"), None)

    condition = eventually(unschedulable)
    message = (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
        "available: 2 No preemption victims found for incoming pod."
    )
    assert (condition.type, condition.status, condition.message) == (
        "PodScheduled",
        "False",
        message,
    )
    assert phase(core, "c") == "Pending"
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=c").items
    assert [(e.reason, e.type, e.message) for e in events] == [
        ("FailedScheduling", "Warning", message)
    ]
    freed = core.read_namespaced_pod("a", "default").spec.node_name
    core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
    eventually(lambda: phase(core, "c") == "Running")
    assert core.read_namespaced_pod("c", "default").spec.node_name == freed


def test_node_selectors_and_taints_decide_where_a_pod_goes(k8s: StandIn, core: Any) -> None:
    taint = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    k8s.add_node("h100", gpu_product="NVIDIA-H100-80GB-HBM3", taints=[taint])
    k8s.add_node("a100", cpu="4")
    node = core.read_node("h100")
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    toleration = {"key": "dedicated", "operator": "Equal", "value": "training"}
    core.create_namespaced_pod("default", pod("picky", "sleep", "30", nodeSelector=h100))
    core.create_namespaced_pod(
        "default", pod("ok", "sleep", "30", nodeSelector=h100, tolerations=[toleration])
    )
    core.create_namespaced_pod(
        "default",
        pod("big", "sleep", "30", container={"resources": {"requests": {"cpu": "8"}}}),
    )
    eventually(lambda: phase(core, "ok") == "Running")
    assert core.read_namespaced_pod("ok", "default").spec.node_name == "h100"

    def why(name: str) -> str:
        conditions = core.read_namespaced_pod(name, "default").status.conditions or []
        return next((c.message for c in conditions if c.reason == "Unschedulable"), "")

    eventually(lambda: why("picky") and why("big"))
    assert why("picky") == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {dedicated: training}. preemption: 0/2 nodes are "
        "available: 2 Preemption is not helpful for scheduling."
    )
    assert why("big") == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint "
        "{dedicated: training}. preemption: 0/2 nodes are available: 1 No preemption victims "
        "found for incoming pod, 1 Preemption is not helpful for scheduling."
    )


def test_forbidden_requests_get_rbacs_message(k8s: StandIn, core: Any) -> None:
    k8s.forbid("create", "pods", namespace="default")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", pod("p", "true"))
    assert (exc.value.status, exc.value.reason) == (403, "Forbidden")
    assert status_of(exc)["message"] == (
        f'pods is forbidden: User "{USER}" cannot create resource "pods" in API group "" '
        'in the namespace "default"'
    )
    core.create_namespaced_pod("team", pod("p", "true"))  # another namespace: allowed
    authz: Any = client.AuthorizationV1Api(core.api_client)

    def review(namespace: str, subresource: str = "") -> bool:
        attributes = {"verb": "create", "resource": "pods", "namespace": namespace}
        if subresource:
            attributes["subresource"] = subresource
        body = {"spec": {"resourceAttributes": attributes}}
        return bool(authz.create_self_subject_access_review(body).status.allowed)

    assert (review("default"), review("team")) == (False, True)
    k8s.forbid("create", "pods", subresource="exec")
    assert (review("team"), review("team", "exec")) == (True, False)
    from kubernetes.stream import stream

    text = refused(
        lambda: stream(core.connect_get_namespaced_pod_exec, "p", "team", command=["true"])
    )
    message = (
        f'pods "p" is forbidden: User "{USER}" cannot create resource "pods/exec" in API '
        'group "" in the namespace "team"'
    )  # the handshake's answer, as websocket-client quotes its body
    assert "Handshake status 403 Forbidden" in text
    assert message.replace('"', '\\"') in text


def test_a_quota_refuses_what_would_exceed_it(k8s: StandIn, core: Any) -> None:
    k8s.set_quota("default", "q", {"requests.nvidia.com/gpu": "8", "pods": "10"})
    core.create_namespaced_pod("default", pod("first", "true", container=GPU8))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", pod("second", "true", container=GPU8))
    assert exc.value.status == 403
    assert status_of(exc)["message"] == (
        'pods "second" is forbidden: exceeded quota: q, requested: requests.nvidia.com/gpu=8, '
        "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8"
    )
    quota = core.read_namespaced_resource_quota("q", "default")
    assert quota.status.used == {"requests.nvidia.com/gpu": "8", "pods": "1"}
    assert quota.status.hard == {"requests.nvidia.com/gpu": "8", "pods": "10"}
    core.create_namespaced_pod("default", pod("small", "true"))  # no GPU: admitted


def test_deletecollection_deletes_what_the_selector_picks(k8s: StandIn, core: Any) -> None:
    for name, labels in (("a", {"job": "x"}), ("b", {"job": "x"}), ("c", {"job": "y"})):
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": labels}})
        core.create_namespaced_pod("default", pod(name, "true", labels=labels))
    core.delete_collection_namespaced_pod("default", label_selector="job=x")
    core.delete_collection_namespaced_config_map("default", label_selector="job=x")
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["c"]
    assert [m.metadata.name for m in core.list_namespaced_config_map("default").items] == ["c"]
    assert k8s.leftovers()["configmaps"] == ["default/c"]


def test_reset_leaves_nothing_running(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    script = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    core.create_namespaced_pod("default", pod("p", "python", "-c", script))
    core.create_namespaced_service(
        "default", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}
    )
    eventually(lambda: len(k8s.processes()) == 2)  # python and its child sleep
    assert not k8s.is_empty()
    pids = k8s.processes()
    k8s.reset()
    assert k8s.is_empty()
    assert all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in pids)


def test_version_and_discovery(k8s: StandIn, core: Any) -> None:
    version = client.VersionApi(core.api_client).get_code()
    assert version.git_version == "v1.31.0"
    assert "v1" in client.CoreApi(core.api_client).get_api_versions().versions
    groups = client.ApisApi(core.api_client).get_api_versions().groups
    assert "authorization.k8s.io" in {g.name for g in groups}
    with api_client(k8s) as other:
        assert other.configuration.host == k8s.url
