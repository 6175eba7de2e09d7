"""The stand-in's kubelet through the official client: pods are real processes whose phases,
restarts, logs, image failures, eviction and node loss look as on a real cluster."""

from __future__ import annotations

import base64
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.k8s.fixtures import eventually, phase, pod, watching
from tests.k8s.standin import StandIn


def container_status(core: Any, name: str) -> Any:
    statuses = core.read_namespaced_pod(name, "default").status.container_statuses
    return statuses[0] if statuses else None


def test_a_container_gets_its_folder_address_and_environment(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    data = {"token": base64.b64encode(b"s3cret").decode()}
    core.create_namespaced_secret("default", {"metadata": {"name": "creds"}, "data": data})
    core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"k": "v"}})
    env = [
        {"name": "MODE", "value": "train"},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}},
        {"name": "BOTH", "value": "$(MODE)-$(ME)"},
    ]
    script = (
        "import os, sys; e = os.environ; "
        "print(sys.executable, os.getcwd(), e['HOME'], e['HOSTNAME'], e['IP'], e['MODE'], "
        "e['ME'], e['TOKEN'], e['K'], e['BOTH'], e['KUBERNETES_SERVICE_PORT'])"
    )
    body = pod("envy", "python", "-c", script, restartPolicy="Never", container={"env": env})
    core.create_namespaced_pod("default", body)
    eventually(lambda: phase(core, "envy") == "Succeeded")
    ip = core.read_namespaced_pod("envy", "default").status.pod_ip
    folder = str(k8s.pod_dir("default", "envy"))
    assert ip.startswith("127.")
    assert ip != "127.0.0.1"
    assert core.read_namespaced_pod_log("envy", "default").split() == [
        str(Path(sys.executable).parent / "python"),
        folder,
        folder,
        "envy",
        ip,
        "train",
        "envy",
        "s3cret",
        "v",
        "train-envy",
        str(k8s.port),
    ]
    state = container_status(core, "envy").state.terminated
    assert (state.exit_code, state.reason) == (0, "Completed")


def test_a_missing_secret_holds_the_container_until_it_exists(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    ref = {"secretKeyRef": {"name": "later", "key": "k"}}
    body = pod("p", "sleep", "30", container={"env": [{"name": "X", "valueFrom": ref}]})
    core.create_namespaced_pod("default", body)
    waiting = eventually(
        lambda: (container_status(core, "p") or None) and container_status(core, "p").state.waiting
    )
    assert (waiting.reason, waiting.message) == (
        "CreateContainerConfigError",
        'secret "later" not found',
    )
    core.create_namespaced_secret(
        "default", {"metadata": {"name": "later"}, "stringData": {"k": "1"}}
    )
    eventually(lambda: phase(core, "p") == "Running")


def test_a_crashing_container_restarts_with_back_off(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    core.create_namespaced_pod("default", pod("crash", "sh", "-c", "echo run; exit 3"))
    status = eventually(
        lambda: (
            (s := container_status(core, "crash"))
            and s.restart_count >= 2
            and s.state.waiting
            and s
        )
    )
    assert status.state.waiting.reason == "CrashLoopBackOff"
    assert "restarting failed container=c pod=crash_default(" in status.state.waiting.message
    assert (status.last_state.terminated.exit_code, status.last_state.terminated.reason) == (
        3,
        "Error",
    )
    assert phase(core, "crash") == "Running"
    assert core.read_namespaced_pod_log("crash", "default", previous=True) == "run\n"
    events = core.list_namespaced_event("default", field_selector="reason=BackOff").items
    assert events
    assert events[0].involved_object.field_path == "spec.containers{c}"

    core.create_namespaced_pod("default", pod("once", "sh", "-c", "exit 4", restartPolicy="Never"))
    eventually(lambda: phase(core, "once") == "Failed")
    status = container_status(core, "once")
    assert (status.state.terminated.exit_code, status.restart_count) == (4, 0)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("once", "default", previous=True)
    assert exc.value.status == 400
    message = 'previous terminated container "c" in pod "once" not found'
    assert json.loads(exc.value.body or "")["message"] == message


def test_an_image_that_cannot_be_pulled_backs_off(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    k8s.fail_image("ghcr.io/acme/missing:1")
    body = pod("p", "true", container={"image": "ghcr.io/acme/missing:1"})
    core.create_namespaced_pod("default", body)
    reasons: set[str] = set()

    def both() -> bool:
        waiting = (container_status(core, "p") or None) and container_status(
            core, "p"
        ).state.waiting
        if waiting:
            reasons.add(waiting.reason)
            if waiting.reason == "ImagePullBackOff":
                assert waiting.message == 'Back-off pulling image "ghcr.io/acme/missing:1"'
        return reasons == {"ErrImagePull", "ImagePullBackOff"}

    eventually(both, every=0.02)
    assert phase(core, "p") == "Pending"
    failed = core.list_namespaced_event("default", field_selector="reason=Failed").items
    assert any(
        e.message.startswith('Failed to pull image "ghcr.io/acme/missing:1": ')
        and e.message.endswith("not found")
        for e in failed
    )
    assert k8s.pids("default", "p") == {}


def test_logs_follow_and_tail(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    script = "for i in 1 2 3 4 5; do echo line $i; done; sleep 0.5; echo last"
    core.create_namespaced_pod("default", pod("talk", "sh", "-c", script, restartPolicy="Never"))
    eventually(lambda: phase(core, "talk") in ("Running", "Succeeded"))
    followed = list(watching(core.read_namespaced_pod_log, "talk", "default", follow=True)[1])
    assert followed == [f"line {i}" for i in range(1, 6)] + ["last"]
    eventually(lambda: phase(core, "talk") == "Succeeded")
    assert core.read_namespaced_pod_log("talk", "default", tail_lines=2) == "line 5\nlast\n"
    stamped = core.read_namespaced_pod_log("talk", "default", timestamps=True, tail_lines=1)
    assert stamped.endswith("Z last\n")
    assert stamped.startswith("20")


def test_eviction_stops_a_pod_gracefully(k8s: StandIn, core: Any, tmp_path: Path) -> None:
    k8s.add_node("n1")
    marker = tmp_path / "got-sigterm"
    script = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('bye')\n"
        "    time.sleep(1)  # cleaning up\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    core.create_namespaced_pod("default", pod("victim", "python", "-c", script))
    eventually(lambda: phase(core, "victim") == "Running")
    eventually(lambda: core.read_namespaced_pod_log("victim", "default") == "ready\n")
    pid = k8s.pids("default", "victim")["c"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "victim", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 10},
    }
    core.create_namespaced_pod_eviction("victim", "default", eviction)
    evicted = core.read_namespaced_pod("victim", "default")
    assert evicted.metadata.deletion_grace_period_seconds == 10
    assert any(c.type == "DisruptionTarget" for c in evicted.status.conditions)
    eventually(lambda: not core.list_namespaced_pod("default").items)
    assert marker.read_text() == "bye"
    assert (
        not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    killing = core.list_namespaced_event("default", field_selector="reason=Killing").items
    assert [e.message for e in killing] == ["Stopping container c"]


def test_a_lost_node_takes_its_pods_with_it(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    k8s.add_node("n2", gpus=0)
    gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    for name in ("a", "b"):
        core.create_namespaced_pod("default", pod(name, "sleep", "60", container=gpu))
    eventually(lambda: phase(core, "a") == phase(core, "b") == "Running")
    pids = [k8s.pids("default", n)["c"] for n in ("a", "b")]
    seen: list[tuple[str, str, str]] = []
    start = core.list_namespaced_pod("default").metadata.resource_version

    def follow() -> None:
        for e in watching(
            core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=5
        )[1]:
            seen.append((e["type"], e["object"].metadata.name, e["object"].status.reason or ""))
            if sum(t == "DELETED" for t, _, _ in seen) == 2:
                return

    watcher = threading.Thread(target=follow)
    watcher.start()
    k8s.lose_node("n1")
    watcher.join(10)
    assert core.list_namespaced_pod("default").items == []
    assert ("MODIFIED", "a", "NodeLost") in seen
    assert ("DELETED", "b", "NodeLost") in seen
    assert k8s.processes() == []
    assert all(
        not Path(f"/proc/{p}/cmdline").exists() or not Path(f"/proc/{p}/cmdline").read_bytes()
        for p in pids
    )
    node = core.read_node("n1")
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "Unknown"
    core.create_namespaced_pod("default", pod("c", "sleep", "60", container=gpu))
    message = eventually(
        lambda: next(
            (
                c.message
                for c in core.read_namespaced_pod("c", "default").status.conditions or []
                if c.reason == "Unschedulable"
            ),
            None,
        )
    )
    assert "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }" in message
    assert "1 Insufficient nvidia.com/gpu" in message
