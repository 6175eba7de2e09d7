"""From nothing to the first step on Kubernetes: cloudtrain against a hand-written manifest.

    python bench/k8s_launch.py [--rounds 3] [--quick]

Starts the test suite's stand-in of the API server (tests/k8s: the official client over HTTP,
pods that run as processes on this machine) with two nodes and, each round, in an order that
alternates:
  (a) by hand: two pods of a hand-written manifest (a shell that sleeps, as a user's pod
      spec would keep a pod up), then, once both run, ``torchrun`` started in each through
      exec with the client's ``stream`` (c10d rendezvous on the first pod's address) running
      `examples/digits_ddp.py` (on this machine's disk, as an image would hold it); from the
      first create to the first optimizer step ("cloudtrain: first step" on pod 0's output);
      then a second torchrun in the same pods, timed the same way; then the pods are deleted;
  (b) cloudtrain: ``cloudtrain up --provider kubernetes --nodes 2`` then ``cloudtrain train``
      of the same script, from the start of `up` to the first step; then a second ``train`` in
      the same pods, then ``down`` (not timed).
It prints the medians and each one's ratio to its hand-written peer: the issue's aim is ≤ 1.1×
for the first job. ``--quick``: one round, for CI's check that the bench still runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launched import ARGS, EXAMPLE, MARK, cloudtrain  # noqa: E402

from tests.k8s.fixtures import api_client  # noqa: E402
from tests.k8s.standin import StandIn  # noqa: E402
from tests.sshd import free_port  # noqa: E402


def hand_pod(name: str, **resources: dict[str, str]) -> Any:
    """A pod of a hand-written manifest (the client takes the dict as it is): a shell that
    sleeps, as a user's pod spec would keep a pod up; `resources` as its container's."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "hand"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "pytorch/pytorch",
                    "command": ["sh", "-c", "while :; do sleep 3600; done"],
                    **({"resources": resources} if resources else {}),
                }
            ],
        },
    }


def by_hand(standin: StandIn, folder: Path, name: str) -> tuple[float, float]:
    """Seconds from the first pod's create to the first step of a torchrun through exec, and
    of a second one in the same pods."""
    from kubernetes import client
    from kubernetes.stream import stream

    api = api_client(standin)
    core = client.CoreV1Api(api)
    pods = [f"{name}-0", f"{name}-1"]
    start = time.perf_counter()
    for pod in pods:
        core.create_namespaced_pod("default", hand_pod(pod))
    while True:
        found: list[Any] = [core.read_namespaced_pod(p, "default").status for p in pods]
        if all(f is not None and f.phase == "Running" and f.pod_ip for f in found):
            break
        time.sleep(0.05)
    head = found[0].pod_ip

    def job(run: str) -> float:
        begun = time.perf_counter()
        port = free_port("127.0.0.1")
        first: list[float] = []

        def rank(pod: str) -> None:
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                       "--nproc-per-node=1", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint={head}:{port}", f"--rdzv-id={run}", str(EXAMPLE),
                       *ARGS, "--checkpoint-dir", str(folder / run / pod)]  # fmt: skip
            own = api_client(standin)  # stream() swaps its client's transport: one each
            connect = client.CoreV1Api(own).connect_get_namespaced_pod_exec
            ws = stream(connect, pod, "default", command=command, stdout=True, stderr=True,
                        _preload_content=False)  # fmt: skip
            seen = ""
            while ws.is_open():
                ws.update(timeout=0.1)
                seen += ws.read_stdout() + ws.read_stderr()
                if not first and MARK in seen:
                    first.append(time.perf_counter())
            ws.close()
            ws.sock.shutdown()  # websocket-client leaves it open after the server's close
            own.close()

        threads = [threading.Thread(target=rank, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        if not first:
            raise SystemExit(f"the hand-written job {run} printed no first step")
        return first[0] - begun

    try:
        ready = time.perf_counter() - start
        return ready + job(f"{name}a"), job(f"{name}b")
    finally:
        for pod in pods:
            core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
        api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    times: dict[str, list[float]] = {"hand 1st": [], "hand 2nd": [], "ct 1st": [], "ct 2nd": []}
    with tempfile.TemporaryDirectory(prefix="k8s-bench-") as tmp, StandIn() as standin:
        standin.add_node("n1", gpus=0)
        standin.add_node("n2", gpus=0)
        for r in range(rounds):
            folder = Path(tmp) / f"round-{r}"
            folder.mkdir()
            for side in ("hand", "ct") if r % 2 == 0 else ("ct", "hand"):
                if side == "hand":
                    firsts = by_hand(standin, folder, f"hand{r}")
                else:
                    firsts = cloudtrain("kubernetes", standin.env(), folder / "home", f"ct{r}")
                times[f"{side} 1st"].append(firsts[0])
                times[f"{side} 2nd"].append(firsts[1])
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedians of {rounds} round(s), the first create or `up` to the first step:")
    print(f"  first job:  by hand {med['hand 1st']:.1f} s, cloudtrain {med['ct 1st']:.1f} s: "
          f"{med['ct 1st'] / med['hand 1st']:.2f}x")  # fmt: skip
    print(f"  second job: by hand {med['hand 2nd']:.1f} s, cloudtrain {med['ct 2nd']:.1f} s: "
          f"{med['ct 2nd'] / med['hand 2nd']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
