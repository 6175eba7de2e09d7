"""The kubernetes provider against the stand-in, through the official client over HTTP: pods as
nodes, found by label; commands and files through exec; all or nothing; nothing left."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import AuthError, CapacityError, CommandError, ConfigError, QuotaError
from cloudtrain.executors import base
from cloudtrain.executors.base import SSH_FAILED
from cloudtrain.model import NodeInfo
from cloudtrain.providers.kubernetes.provider import KubernetesProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.k8s.standin import StandIn


def provider(home: Path, **options: str) -> KubernetesProvider:
    return KubernetesProvider(ProviderContext(home=home, options={"wait": "20", **options}))


def spec(name: str, nodes: int = 2, gpus: str | None = None) -> ClusterSpec:
    accel, _, count = (gpus or "").partition(":")
    res = Resources(accelerator=accel or None, count=int(count or 0))
    return ClusterSpec(name, "kubernetes", nodes, res, cluster_id="c0ffee000001")


def running(prov: KubernetesProvider, name: str) -> list[NodeInfo]:
    return [n for n in prov.describe(name, "c0ffee000001") if n.state == "running"]


def test_pods_are_nodes_found_by_label_and_down_leaves_nothing(
    k8s: StandIn, tmp_path: Path
) -> None:
    k8s.add_node("n1", gpus=0)
    prov = provider(tmp_path)
    s = spec("kp")
    nodes = prov.apply(prov.plan(s))
    assert [n.index for n in nodes] == [0, 1]
    assert all(n.state == "running" and n.private_ip and n.root for n in nodes)
    assert nodes[0].root == f"{k8s.pod_dir('default', 'kp-0')}/.cloudtrain/node"
    assert prov.clusters() == ["kp"]
    # found again from the API alone (another process, no local state)
    again = provider(tmp_path / "elsewhere").describe("kp", "c0ffee000001")
    assert [(n.index, n.private_ip, n.root) for n in again] == [
        (n.index, n.private_ip, n.root) for n in nodes
    ]
    assert prov.leftovers("kp") == ["service kp-nodes", "network policy kp-nodes"]
    # the pods take traffic from the cluster's own pods alone: its listeners stay its own
    [policy] = k8s.store.all("networkpolicies", "default")
    labels = dict(k8s.store.need("pods", "default", "kp-0")["metadata"]["labels"])
    del labels["cloudtrain.dev/node"]
    own = {"matchLabels": labels}
    assert policy["spec"] == {
        "podSelector": own,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": own}]}],
    }

    prov.terminate("kp", "c0ffee000001")
    prov.terminate("kp", "c0ffee000001")  # idempotent
    assert prov.describe("kp") == []
    assert prov.clusters() == []
    assert prov.leftovers("kp") == []
    assert k8s.is_empty(), k8s.leftovers()


def test_exec_runs_commands_and_carries_files_both_ways(
    k8s: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k8s.add_node("n1", gpus=0)
    prov = provider(tmp_path)
    (node,) = prov.apply(prov.plan(spec("kx", nodes=1)))
    ex = prov.executor(node)

    done = ex.run(["sh", "-c", 'echo out; echo err >&2; echo "$A $(pwd)"; exit 3'],
                  env={"A": "secret value"}, cwd=node.root)  # fmt: skip
    assert done.returncode == 3
    assert done.stdout == f"out\nsecret value {node.root}\n"
    assert done.stderr == "err\n"
    # the environment went on stdin, never on the exec's command line (the audit log's)
    exec_urls = [c.query for c in k8s.calls() if c.path.endswith("/exec")]
    assert exec_urls
    assert not any("secret" in str(q) for q in exec_urls)
    lines: list[str] = []
    streamed = ex.run(["sh", "-c", "for i in 1 2 3; do echo line $i; done"], on_output=lines.append)
    assert streamed.ok
    assert lines == ["line 1", "line 2", "line 3"]
    assert ex.run(["no-such-command"]).returncode in (126, 127)

    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    (work / "sub" / "data.bin").write_bytes(os.urandom(3 << 20))
    (work / ".env").write_text("TOKEN=never-sent\n")  # a secret: stays home
    ex.put(work, f"{node.root}/work")
    back = tmp_path / "back"
    assert ex.get(f"{node.root}/work", back)
    assert (back / "train.py").read_text() == "print('hi')\n"
    assert (back / "sub" / "data.bin").read_bytes() == (work / "sub" / "data.bin").read_bytes()
    assert not (back / ".env").exists()
    assert not ex.get(f"{node.root}/nothing-here", tmp_path / "none")

    # a pod that lies: a link to this machine's files comes back as nothing; an answer
    # without end is stopped at the bound, not held
    ex.run(["ln", "-s", "/etc/passwd", f"{node.root}/work/passwd"]).check()
    assert ex.get(f"{node.root}/work", back)
    assert not (back / "passwd").exists()
    monkeypatch.setattr(base, "MAX_OUTPUT", 1 << 20)
    for stream in ("", ">&2"):
        with pytest.raises(CommandError, match=r"more than 1 MiB on its std(out|err).*stopped"):
            ex.run(["sh", "-c", f"yes {stream}"], timeout=60)
    with pytest.raises(CommandError, match="timed out after 1 s"):  # not held by the flood
        ex.run(["yes"], timeout=1, on_output=lambda line: None)

    prov.terminate("kx", "c0ffee000001")
    assert ex.run(["true"]).returncode == SSH_FAILED  # the pod is gone: no answer
    assert k8s.is_empty(), k8s.leftovers()


def test_another_owners_cluster_of_the_name_is_refused_before_anything_is_made(
    k8s: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k8s.add_node("n1", gpus=0)
    monkeypatch.setenv("CLOUDTRAIN_OWNER", "alice@lab")
    alice = provider(tmp_path)
    alice.apply(alice.plan(spec("shared", nodes=1)))
    monkeypatch.setenv("CLOUDTRAIN_OWNER", "bob@lab")
    bob = provider(tmp_path)
    with pytest.raises(ConfigError, match="has that name \\(alice@lab\\)"):
        bob.plan(spec("shared", nodes=1))
    assert bob.clusters() == []
    bob.terminate("shared")  # touches nothing of alice's
    monkeypatch.setenv("CLOUDTRAIN_OWNER", "alice@lab")
    assert [n.index for n in running(alice, "shared")] == [0]
    alice.terminate("shared", "c0ffee000001")
    assert k8s.is_empty(), k8s.leftovers()


def test_pods_that_cannot_be_scheduled_are_deleted_with_the_schedulers_reason(
    k8s: StandIn, tmp_path: Path
) -> None:
    k8s.add_node("n1", gpus=4)
    prov = provider(tmp_path, wait="2")
    said: list[str] = []
    with pytest.raises(CapacityError, match=r"Insufficient nvidia\.com/gpu"):
        prov.apply(prov.plan(spec("big", gpus="A100:8")), lambda e: said.append(e.message))
    assert any("pending: pod big-0: 0/1 nodes are available" in m for m in said), said
    assert k8s.is_empty(), k8s.leftovers()


def test_an_image_that_cannot_be_pulled_ends_up_at_once_naming_it(
    k8s: StandIn, tmp_path: Path
) -> None:
    k8s.add_node("n1", gpus=0)
    k8s.fail_image("registry.example/missing:1")
    prov = provider(tmp_path, wait="60")
    s = spec("img", nodes=2)
    s = ClusterSpec(s.name, s.provider, s.num_nodes, Resources(image="registry.example/missing:1"),
                    cluster_id=s.cluster_id)  # fmt: skip
    with pytest.raises(
        ConfigError, match=re.escape("image 'registry.example/missing:1' cannot be pulled")
    ):
        prov.apply(prov.plan(s))
    assert k8s.is_empty(), k8s.leftovers()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"namespace": "Bad_NS"}, "--namespace 'Bad_NS' is not a namespace's name"),
        ({"node_selector": "gpu"}, "--node-selector 'gpu': give KEY=VALUE pairs"),
        ({"node_selector": "a=b;c"}, "--node-selector 'a=b;c': give KEY=VALUE pairs"),
        ({"node_selector": "-a=b"}, "--node-selector '-a=b': give KEY=VALUE pairs"),
        ({"context": "nope"}, "--context 'nope': "),
        ({"wait": "-1"}, "--wait '-1': give seconds"),
    ],
)
def test_bad_options_are_one_line_and_make_nothing(
    k8s: StandIn, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    def plan() -> None:
        provider(tmp_path, **options).plan(spec("bad"))

    with pytest.raises(ConfigError, match=re.escape(message)):
        plan()
    assert k8s.is_empty()
    assert not [c for c in k8s.calls() if c.method != "GET"]


def test_a_verb_the_role_lacks_or_a_quota_is_one_line_and_makes_nothing(
    k8s: StandIn, tmp_path: Path
) -> None:
    k8s.add_node("n1", gpus=8)
    prov = provider(tmp_path)
    k8s.forbid("create", "pods")
    with pytest.raises(AuthError, match=r'cannot create resource "pods" in API group ""'):
        prov.apply(prov.plan(spec("nope", nodes=2)))
    assert k8s.is_empty(), k8s.leftovers()

    k8s.reset()  # no pod listens before its NetworkPolicy is there
    k8s.add_node("n1", gpus=8)
    k8s.forbid("create", "networkpolicies")
    with pytest.raises(AuthError, match=r'cannot create resource "networkpolicies" in API grou'):
        prov.apply(prov.plan(spec("open", nodes=2)))
    assert k8s.calls("create", "pods") == []
    assert k8s.is_empty(), k8s.leftovers()

    k8s.reset()
    k8s.add_node("n1", gpus=8)
    k8s.set_quota("default", "gpus", {"requests.nvidia.com/gpu": "8"})
    with pytest.raises(QuotaError, match="exceeded quota: gpus"):
        prov.apply(prov.plan(spec("over", nodes=2, gpus="A100:8")))
    assert not prov.describe("over"), "the first pod, admitted, went with the refused one"
    assert k8s.is_empty(), k8s.leftovers()


def test_an_eviction_is_a_notice_on_the_node_within_its_grace_period(
    k8s: StandIn, tmp_path: Path
) -> None:
    """The grace period's SIGTERM reaches the pod's main process, which records the node's
    notice (what a job's `runtime.preempting()` reads) and lives on until the kill."""
    from kubernetes import client

    from tests.k8s.fixtures import api_client, eventually

    k8s.add_node("n1", gpus=0)
    prov = provider(tmp_path)
    (node,) = prov.apply(prov.plan(spec("ev", nodes=1)))
    ex = prov.executor(node)
    api = api_client(k8s)
    try:
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name="ev-0", namespace="default"),
            delete_options=client.V1DeleteOptions(grace_period_seconds=5),
        )
        client.CoreV1Api(api).create_namespaced_pod_eviction("ev-0", "default", body)
    finally:
        api.close()
    said = eventually(lambda: ex.run(["cat", f"{node.root}/preemption.json"]).stdout, timeout=5)
    assert '"source": "kubernetes"' in said, said
    assert ex.run(["true"]).ok, "the pod lives on in its grace period"
    prov.terminate("ev", "c0ffee000001")
    assert k8s.is_empty(), k8s.leftovers()


def test_two_ups_of_one_name_at_once_make_one_set_of_pods(k8s: StandIn, tmp_path: Path) -> None:
    """From two machines (no shared lock): a pod the other made first (409) is kept."""
    from cloudtrain.executors.base import fan_out

    k8s.add_node("n1", gpus=0)
    provs = [provider(tmp_path / "a"), provider(tmp_path / "b")]
    s = spec("twice", nodes=2)
    made = fan_out(lambda p: p.apply(p.plan(s)), provs)
    first, second = ([n.node_id for n in nodes] for nodes in made)
    assert first == second, "both see the same two pods"
    creates = [c for c in k8s.calls("create", "pods") if not c.subresource]
    assert sum(c.code == 201 for c in creates) == 2, "the later create of a pod is a 409"
    assert len(provs[0].describe("twice")) == 2
    provs[0].terminate("twice", "c0ffee000001")
    assert k8s.is_empty(), k8s.leftovers()


def test_a_pod_of_the_name_made_by_hand_is_refused_and_left_alone(
    k8s: StandIn, core: Any, tmp_path: Path
) -> None:
    from tests.k8s.fixtures import pod

    k8s.add_node("n1", gpus=0)
    core.create_namespaced_pod("default", pod("hand-1", "sleep", "60"))
    prov = provider(tmp_path)
    with pytest.raises(ConfigError, match="pod hand-1 in namespace default is not this cluster's"):
        prov.apply(prov.plan(spec("hand", nodes=2)))
    assert k8s.leftovers()["pods"] == ["default/hand-1"], "only the user's own pod"
    assert k8s.leftovers()["services"] == []
