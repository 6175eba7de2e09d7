"""`up` of many pods on Kubernetes: cloudtrain's provider against the bare client.

    python bench/k8s_scale.py [--pods 64] [--rounds 1] [--quick]

Starts the test suite's stand-in of the API server (tests/k8s: the official client over HTTP,
pods that run as processes on this machine) with one simulated node (96 CPUs, 110 pods) per
16 pods, and in each round, in an order that alternates:
  (a) the bare client: ``create_namespaced_pod`` of a hand-written pod (a shell that sleeps,
      1 CPU and 2Gi asked) for each pod, then one watch of their label until every pod runs
      with an address;
  (b) cloudtrain: the provider object's ``plan`` and ``apply`` of a cluster of as many
      nodes, without the bootstrap through exec that ``cloudtrain up`` then starts in each pod
      (heavier, and not what this bench is about): the name check, the Service, a create per
      pod, the wait for every pod to run (one list, then one watch unless the list finds
      them all running), and `describe`.
Each side is timed from reading the kubeconfig (building its client) until every pod runs;
its pods are then deleted (and waited for) before the next side starts, not timed. It
prints each side's seconds, their ratio, and the API calls each timed part made, by verb and
resource, as the stand-in received them; at the end the stand-in must be empty. ``--quick``:
8 pods, one round, for CI's check that the bench still runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from k8s_launch import hand_pod  # noqa: E402

from cloudtrain.providers.kubernetes.provider import KubernetesProvider  # noqa: E402
from cloudtrain.provision.provider import ProviderContext  # noqa: E402
from cloudtrain.spec import ClusterSpec, Resources  # noqa: E402
from tests.k8s.fixtures import api_client  # noqa: E402
from tests.k8s.standin import StandIn  # noqa: E402

NAMESPACE = "default"
#: What each hand-written pod asks: what cloudtrain's ask without GPUs.
REQUESTS = {"cpu": "1", "memory": "2Gi"}


def by_hand(standin: StandIn, pods: int, name: str) -> tuple[float, str]:
    """Seconds from the first create to every pod running, through the bare client, and the
    API calls it took."""
    from kubernetes import client, watch

    since, start = len(standin.calls()), time.perf_counter()
    api = api_client(standin)  # as the provider's `plan` reads the kubeconfig: timed
    core = client.CoreV1Api(api)
    try:
        for i in range(pods):
            core.create_namespaced_pod(NAMESPACE, hand_pod(f"{name}-{i}", requests=REQUESTS))
        running: set[str] = set()
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        for event in w.stream(
            core.list_namespaced_pod, NAMESPACE, label_selector="bench=hand", timeout_seconds=600
        ):
            pod = event["object"]
            if pod.status.phase == "Running" and pod.status.pod_ip:
                running.add(pod.metadata.name)
            if len(running) == pods:
                w.stop()
        took, calls = time.perf_counter() - start, _calls(standin, since)
        if len(running) < pods:
            raise SystemExit(f"by hand: {len(running)} of {pods} pods ran in 600 s")
        core.delete_collection_namespaced_pod(
            NAMESPACE, label_selector="bench=hand", grace_period_seconds=1
        )
        _until_empty(standin)
        return took, calls
    finally:
        api.close()


def with_cloudtrain(standin: StandIn, home: Path, pods: int, name: str) -> tuple[float, str]:
    """Seconds of the provider's `plan` and `apply` (the bootstrap left out) of `pods` nodes,
    and the API calls they took."""
    options = {"kubeconfig": str(standin.kubeconfig_file), "wait": "600"}
    prov = KubernetesProvider(ProviderContext(home=home, options=options))
    prov._make_node = lambda spec, node: None  # type: ignore[method-assign]  # see the docstring
    spec = ClusterSpec(name, "kubernetes", pods, Resources(), cluster_id="be4c40000001")
    since, start = len(standin.calls()), time.perf_counter()
    nodes = prov.apply(prov.plan(spec))
    took, calls = time.perf_counter() - start, _calls(standin, since)
    if [n.state for n in nodes] != ["running"] * pods:
        raise SystemExit(f"cloudtrain: {[n.state for n in nodes]}")
    prov.terminate(name, spec.cluster_id)
    _until_empty(standin)
    return took, calls


def _until_empty(standin: StandIn) -> None:
    deadline = time.monotonic() + 120
    while not standin.is_empty():
        if time.monotonic() > deadline:
            raise SystemExit(f"the stand-in still holds {standin.leftovers()}")
        time.sleep(0.2)


def _calls(standin: StandIn, since: int) -> str:
    """The requests since the `since`-th, by verb and resource."""
    counted = Counter(
        f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}"
        for c in standin.calls()[since:]
    )
    return ", ".join(f"{n} {what}" for what, n in sorted(counted.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="8 pods, one round")
    args = parser.parse_args()
    pods, rounds = (8, 1) if args.quick else (args.pods, args.rounds)
    times: dict[str, list[float]] = {"hand": [], "cloudtrain": []}
    calls: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="k8s-scale-") as tmp, StandIn(history=20000) as k8s:
        for n in range((pods + 15) // 16):
            k8s.add_node(f"n{n + 1}", gpus=0)
        for r in range(rounds):
            for side in ("hand", "cloudtrain") if r % 2 == 0 else ("cloudtrain", "hand"):
                if side == "hand":
                    took, calls[side] = by_hand(k8s, pods, f"hand{r}")
                else:
                    took, calls[side] = with_cloudtrain(k8s, Path(tmp) / "home", pods, f"ct{r}")
                times[side].append(took)
            print(
                f"round {r + 1}: by hand {times['hand'][-1]:.2f} s, "
                f"cloudtrain {times['cloudtrain'][-1]:.2f} s"
            )
        if not k8s.is_empty() or k8s.errors:
            raise SystemExit(f"left: {k8s.leftovers()}; the stand-in's errors: {k8s.errors}")
    hand, ct = (statistics.median(times[s]) for s in ("hand", "cloudtrain"))
    print(
        f"\n{pods} pods, median of {rounds} round(s), from reading the kubeconfig until every "
        "pod runs:"
    )
    print(f"  by hand {hand:.2f} s, cloudtrain {ct:.2f} s: {ct / hand:.2f}x")
    print("API calls of the last round's timed part, by verb and resource:")
    for side in ("hand", "cloudtrain"):
        print(f"  {side}: {calls[side]}")


if __name__ == "__main__":
    main()
