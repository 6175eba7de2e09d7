"""A cluster on Kubernetes (the stand-in, tests/k8s: the official client over HTTP, pods that
run as processes here), through the CLI as its users type it: `up` makes a pod per node, `train`
runs the digits example across them through exec to its accuracy, and `down`, with the state
file gone, finds everything by label and leaves nothing: no object, no process of a pod."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.conftest import REPO, Shell, came_back_on_all, wait_for
from tests.k8s.fixtures import api_client
from tests.k8s.standin import StandIn

pytestmark = pytest.mark.integration
EXAMPLE = REPO / "examples" / "digits_ddp.py"


@pytest.fixture
def k8s_sh(k8s: StandIn, tmp_path: Any) -> Shell:
    """The CLI as a user with a kubeconfig of the stand-in runs it."""
    shell = Shell(tmp_path / "home")
    shell.env.update(k8s.env())
    return shell


def pods(k8s: StandIn, selector: str) -> list[Any]:
    from kubernetes import client

    api = api_client(k8s)
    try:
        return list(
            client.CoreV1Api(api).list_namespaced_pod("default", label_selector=selector).items
        )
    finally:
        api.close()


def test_up_train_down_on_two_pods_leaves_nothing(k8s: StandIn, k8s_sh: Shell) -> None:
    k8s.add_node("n1", gpus=0)
    k8s.add_node("n2", gpus=0)
    up = k8s_sh("up", "--provider", "kubernetes", "--nodes", "2", "--name", "exp1", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "cluster exp1 is up: 2 node(s)" in up.stdout
    made = pods(k8s, "cloudtrain.dev/cluster=exp1")
    assert sorted(p.metadata.name for p in made) == ["exp1-0", "exp1-1"]
    assert all(p.status.phase == "Running" for p in made)
    assert all("@" in p.metadata.annotations["cloudtrain.dev/owner"] for p in made)
    assert all(not p.spec.automount_service_account_token for p in made), "no API on a node"

    train = k8s_sh("train", "-c", "exp1", str(EXAMPLE), "--epochs", "2", timeout=180)
    assert train.returncode == 0, train.stdout + train.stderr
    assert "[node 1]" in train.stdout, "both pods' ranks are heard"
    accuracy = re.search(r"final test accuracy: ([\d.]+)", train.stdout)
    assert accuracy, train.stdout
    assert float(accuracy.group(1)) > 0.9, train.stdout
    again = k8s_sh("train", "-c", "exp1", str(EXAMPLE), "--epochs", "1", timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    made_calls = [c for c in k8s.calls("create", "pods") if not c.subresource]
    assert len(made_calls) == 2, "jobs run in the pods: none made again"
    execs = k8s.calls("create", "pods", "exec")
    assert execs
    assert not [c for c in execs if "CLOUDTRAIN_JOB_ID" in str(c.query)], (
        "a job's environment goes on the exec's stdin, not in its URL (the audit log's)"
    )

    (k8s_sh.home / "state.db").unlink()  # down reads the API's labels, not what was recorded
    down = k8s_sh("down", "exp1", "--provider", "kubernetes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert k8s.is_empty(), k8s.leftovers()


def test_an_unknown_context_or_namespace_is_one_line_and_makes_nothing(
    k8s: StandIn, k8s_sh: Shell
) -> None:
    k8s.add_node("n1", gpus=0)
    for flags, said in [
        (["--context", "prod"], "--context 'prod': "),
        (["--namespace", "nosuch"], "--namespace 'nosuch': not found"),
    ]:
        done = k8s_sh("up", "--provider", "kubernetes", "--name", "x", *flags)
        assert done.returncode != 0
        assert said in done.stderr + done.stdout, done.stderr + done.stdout
        assert "Traceback" not in done.stderr
        assert k8s.is_empty(), k8s.leftovers()


def evict(k8s: StandIn, pod: str, grace_s: int) -> None:
    """Evict `pod` through the Eviction API, as a drain does, with `grace_s` of grace."""
    from kubernetes import client

    api = api_client(k8s)
    try:
        eviction = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod, namespace="default"),
            delete_options=client.V1DeleteOptions(grace_period_seconds=grace_s),
        )
        client.CoreV1Api(api).create_namespaced_pod_eviction(pod, "default", eviction)
    finally:
        api.close()


def read_until(train: Any, mark: str) -> str:
    """What `train` (a ``Popen``) printed up to the line with `mark`."""
    out = ""
    while mark not in out:
        line = train.stdout.readline()
        assert line, out
        out += line
    return out


def test_a_managed_job_whose_pod_is_evicted_gets_it_back_and_resumes(
    k8s: StandIn, k8s_sh: Shell
) -> None:
    """An eviction (the Eviction API, as a drain sends it) ends pod 1 at its grace period (2 s
    here: the notice it gives the node is `test_kube_provider`'s, which a heartbeat every 5 s
    may not see in so short a grace); the watcher sees the node gone, `up` makes the pod
    again, and the job resumes on both from the newest checkpoint."""

    k8s.add_node("n1", gpus=0)
    k8s_sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    up = k8s_sh("up", "--provider", "kubernetes", "--nodes", "2", "--name", "m", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    [first] = [p.metadata.uid for p in pods(k8s, "cloudtrain.dev/node=1")]
    train = k8s_sh.popen("train", "-c", "m", "--managed", str(EXAMPLE), "--",
                         "--epochs", "6", "--pause", "1")  # fmt: skip
    out = read_until(train, "epoch 3/6")
    evict(k8s, "m-1", grace_s=2)  # shorter than the job
    rest, _ = train.communicate(timeout=300)
    out += rest
    assert train.returncode == 0, out
    assert re.search(r"recovery 1/3: node 1 went away", out), out
    resumed = re.search(r"resumed from epoch (\d+)", out)
    assert resumed, out
    assert int(resumed.group(1)) >= 2, out
    accuracy = re.search(r"final test accuracy: ([\d.]+)", out)
    assert accuracy, out
    assert float(accuracy.group(1)) >= 0.95, out
    [again] = pods(k8s, "cloudtrain.dev/node=1")
    assert again.metadata.uid != first, "a new pod 1"
    assert again.status.phase == "Running"
    assert k8s_sh("down", "m").returncode == 0
    assert k8s.is_empty(), k8s.leftovers()


def test_idle_pods_end_themselves_and_the_next_command_deletes_them(
    k8s: StandIn, k8s_sh: Shell
) -> None:
    """`up --idle-minutes`: each pod's agent removes its node when idle, the pod's main process
    then ends, and the pod with it (its GPUs back to the cluster; it holds no token to delete
    itself); the next command here finds the pods ended, deletes them and says why."""
    k8s.add_node("n1", gpus=0)
    where = ["--provider", "kubernetes", "--nodes", "2", "--name", "idle"]
    up = k8s_sh("up", *where, "--idle-minutes", "0.05", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "idle stops itself after 0.05 idle minute(s)" in up.stderr

    def ended() -> bool:
        return all(p.status.phase == "Succeeded" for p in pods(k8s, "cloudtrain.dev/cluster"))

    wait_for(ended, timeout=90, what="the pods to end themselves")
    assert k8s.processes() == [], "nothing of a pod lives on"

    refreshed = k8s_sh("status", "idle", "--refresh")
    assert refreshed.returncode == 0, refreshed.stderr
    said = "idle stopped itself (it was idle); removed what was left: node 0 ("
    assert said in refreshed.stderr, refreshed.stderr
    assert "Traceback" not in refreshed.stderr
    assert k8s_sh.status()["clusters"] == []
    assert k8s.is_empty(), k8s.leftovers()


def test_a_managed_elastic_job_goes_on_without_an_evicted_pod_and_gets_it_back(
    k8s: StandIn, k8s_sh: Shell
) -> None:
    """`--managed --nodes 1:2`: pod 1 is evicted; node 0 goes on alone while the watcher makes
    pod 1 again, then the job starts again on both from the newest checkpoint and ends there."""
    k8s.add_node("n1", gpus=0)
    k8s_sh.env["CLOUDTRAIN_CHECKPOINT_PULL_S"] = "1"
    up = k8s_sh("up", "--provider", "kubernetes", "--nodes", "2", "--name", "e", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    train = k8s_sh.popen("train", "-c", "e", "--managed", "--nodes", "1:2", str(EXAMPLE), "--",
                         "--epochs", "12", "--pause", "1")  # fmt: skip
    out = read_until(train, "epoch 3/12")
    evict(k8s, "e-1", grace_s=2)
    rest, _ = train.communicate(timeout=300)
    out += rest
    assert train.returncode == 0, out
    assert re.search(
        r"recovery 1/3: node 1 (went away|was lost); the others go on \(elastic\)", out
    ), out
    came_back_on_all(out)
    assert k8s_sh("down", "e").returncode == 0
    assert k8s.is_empty(), k8s.leftovers()


@pytest.mark.parametrize("mark", ["made pod(s)", "bootstrap"])
def test_an_up_killed_midway_is_completed_by_the_next_and_down_finds_everything(
    k8s: StandIn, k8s_sh: Shell, mark: str
) -> None:
    """`up` killed (SIGKILL: no cleanup of its own) once its pods are made, or while the
    nodes bootstrap: the next `up` completes the same pods, and `down` from a machine with no
    record finds everything by label."""
    k8s.add_node("n1", gpus=0)
    where = ["--provider", "kubernetes", "--nodes", "2", "--name", "k"]
    up = k8s_sh.popen("up", *where)
    read_until(up, mark)
    up.kill()
    up.communicate(timeout=30)
    made = {p.metadata.uid for p in pods(k8s, "cloudtrain.dev/cluster=k")}
    assert made, "the pods were made before the kill"

    again = k8s_sh("up", *where, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {p.metadata.uid for p in pods(k8s, "cloudtrain.dev/cluster=k")} == made, "the same"
    (k8s_sh.home / "state.db").unlink()
    down = k8s_sh("down", "k", "--provider", "kubernetes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert k8s.is_empty(), k8s.leftovers()
