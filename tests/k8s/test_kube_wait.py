"""The kubernetes provider's waits against the stand-in: one list and one watch, whatever the
number of pods; a watch that the server ends, or whose history is compacted meanwhile, is
taken up again; a pod that ends while the others wait is the error it was."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.errors import AuthError, ProviderError
from cloudtrain.model import NodeInfo
from cloudtrain.providers.kubernetes.provider import KubernetesProvider
from tests.k8s.fixtures import eventually
from tests.k8s.standin import StandIn
from tests.k8s.test_kube_provider import provider, spec


def calls_of(k8s: StandIn, since: int) -> Counter[str]:
    """The requests since the `since`-th, by verb (and resource for lists and watches)."""
    made = k8s.calls()[since:]
    return Counter(
        f"{c.verb} {c.resource}" if c.verb in ("list", "watch") else c.verb
        for c in made
        if not c.subresource
    )


def up_in_background(
    prov: KubernetesProvider, name: str, nodes: int
) -> tuple[threading.Thread, list[list[NodeInfo]], list[BaseException]]:
    """`plan` and `apply` of `nodes` pods in a thread: what it made, or what it raised."""
    made: list[list[NodeInfo]] = []
    failed: list[BaseException] = []

    def up() -> None:
        try:
            made.append(prov.apply(prov.plan(spec(name, nodes=nodes))))
        except BaseException as exc:  # the test reads it
            failed.append(exc)

    thread = threading.Thread(target=up, daemon=True)
    thread.start()
    return thread, made, failed


def pod_calls(k8s: StandIn, verb: str) -> int:
    return len(k8s.calls(verb, "pods"))


def watching_since(k8s: StandIn, watches: int) -> Callable[[], bool]:
    """Whether a watch of pods was opened since there were `watches`."""
    return lambda: pod_calls(k8s, "watch") > watches


def test_up_and_down_make_a_constant_number_of_lists_and_watches(
    k8s: StandIn, tmp_path: Path
) -> None:
    """The pods pend (no node yet) until `up` watches them, then run: its lists and watches
    are the same for 2 pods and for 6, as `down`'s are."""
    seen: dict[int, tuple[Counter[str], Counter[str]]] = {}
    for count in (2, 6):
        name = f"scale{count}"
        prov = provider(tmp_path, wait="120", node_selector=f"bench=r{count}")
        start, watches = len(k8s.calls()), pod_calls(k8s, "watch")
        thread, made, failed = up_in_background(prov, name, count)
        eventually(watching_since(k8s, watches), timeout=30)
        k8s.add_node(f"n{count}", gpus=0, labels={"bench": f"r{count}"})
        thread.join(120)
        assert not failed, failed
        assert [n.state for n in made[0]] == ["running"] * count
        up = calls_of(k8s, start)
        start = len(k8s.calls())
        prov.terminate(name, "c0ffee000001")
        seen[count] = (up, calls_of(k8s, start))
        assert up["create"] == count + 2, "the pods, one Service, one NetworkPolicy"
    assert k8s.is_empty(), k8s.leftovers()
    for phase in (0, 1):  # up, down
        few, many = (seen[n][phase] for n in (2, 6))
        for verb in ("list pods", "watch pods", "list services"):
            assert many[verb] == few[verb], (verb, seen)
        assert many["watch pods"] == 1, seen
    assert seen[6][0]["list pods"] + seen[6][0]["list services"] <= 9, seen


@pytest.mark.parametrize("compacted", [False, True])
def test_up_goes_on_when_its_watch_ends_or_its_history_is_compacted(
    k8s: StandIn, tmp_path: Path, compacted: bool
) -> None:
    prov = provider(tmp_path, wait="60")
    thread, made, failed = up_in_background(prov, "drop", 2)
    eventually(lambda: k8s.calls("watch", "pods"), timeout=30)
    lists, watches = pod_calls(k8s, "list"), pod_calls(k8s, "watch")
    if compacted:  # a write the watch does not see, then its history is forgotten
        k8s.add_namespace("elsewhere")
        k8s.compact()
    eventually(k8s.drop_watches)  # as an API server that restarts ends every watch
    # watched again: from where it was, or (410 Expired) from a new list
    again = watches + (2 if compacted else 1)
    eventually(watching_since(k8s, again - 1), timeout=30)
    assert pod_calls(k8s, "list") == lists + compacted
    k8s.add_node("n1", gpus=0)  # now the pods can run: the new watch sees them
    thread.join(120)
    assert not failed, failed
    assert [n.state for n in made[0]] == ["running", "running"]
    assert pod_calls(k8s, "watch") == again, "no more watches than the faults made"
    prov.terminate("drop", "c0ffee000001")
    assert k8s.is_empty(), k8s.leftovers()


def test_a_pod_that_ends_while_the_others_wait_ends_up_with_its_words(
    k8s: StandIn, tmp_path: Path
) -> None:
    k8s.add_node("n1", gpus=0, cpu="2")
    prov = provider(tmp_path, wait="60", cpus="1.5")
    thread, made, failed = up_in_background(prov, "lost", 2)
    eventually(lambda: any(c.verb == "watch" for c in k8s.calls()), timeout=30)

    def first_runs_second_pends() -> bool:
        pods = {p["metadata"]["name"]: p for p in k8s.store.all("pods", "default")}
        first, second = pods.get("lost-0"), pods.get("lost-1")
        return bool(
            first
            and second
            and first["status"]["phase"] == "Running"
            and second["status"].get("conditions")
        )

    eventually(first_runs_second_pends, timeout=30)
    k8s.lose_node("n1")
    thread.join(60)
    assert not made
    (error,) = failed
    assert isinstance(error, ProviderError), error
    assert error.code == "PodEnded", error
    assert "pod lost-0 ended as it started: " in str(error)
    assert "\n" not in str(error)
    assert k8s.is_empty(), k8s.leftovers()


def test_a_role_without_watch_is_one_line_and_leaves_nothing(k8s: StandIn, tmp_path: Path) -> None:
    k8s.forbid("watch", "pods")
    prov = provider(tmp_path)  # no node: the pod pends, so the first list does not end the wait
    with pytest.raises(AuthError, match=r'cannot watch resource "pods" in API group ""') as refused:
        prov.apply(prov.plan(spec("nowatch", nodes=1)))
    assert "\n" not in str(refused.value)
    assert [c.name for c in k8s.calls("delete", "pods")] == ["nowatch-0"]
    assert k8s.is_empty(), k8s.leftovers()
