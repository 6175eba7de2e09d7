"""How a TensorFlow or a Horovod job is wired: every worker's variables, decided here, and the
node's ``spawn`` command that starts them (`cloudtrain.node.spawn`).

TensorFlow: each worker gets ``TF_CONFIG`` with ``cluster.worker`` = every worker's
``address:port`` (the nodes' private addresses, ports each node chose free) and ``task.index``
= its rank, nodes in the job's order (the head first: its first worker is the chief).

Horovod: ranks are dealt node by node (the head's first), ``HOROVOD_CROSS_RANK`` is a worker's
node, ``HOROVOD_CROSS_SIZE`` the nodes with that local rank; the head's spawner serves the gloo
rendezvous on its private address and a port it chose (`cloudtrain.node.horovod`). Hosts are
named ``node<index>``, not by hostname: the local provider's nodes share one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cloudtrain.model import NodeInfo

__all__ = [
    "HOROVOD_TIMEOUT_S",
    "command",
    "horovod_envs",
    "host_name",
    "spawn_argv",
    "tensorflow_envs",
]

#: How long Horovod's gloo rendezvous waits for every worker before it aborts them all.
HOROVOD_TIMEOUT_S = 120


def command(args: Sequence[str], python: str) -> list[str]:
    """A worker's command from the job's torchrun-style arguments (`entrypoint_args`)."""
    if args[:1] == ["--module"]:
        return [python, "-m", *args[1:]]
    if args[:1] == ["--no-python"]:
        return list(args[1:])
    return [python, *args]  # a script (`entrypoint_args` dropped a leading ``python``)


def tensorflow_envs(
    nodes: Sequence[NodeInfo], ports: Sequence[Sequence[int]]
) -> list[list[dict[str, str]]]:
    """Per node (in `nodes`' order), per worker: its ``TF_CONFIG``. `ports[i]` are node i's,
    one per worker on it."""
    workers = [f"{n.private_ip}:{p}" for n, mine in zip(nodes, ports, strict=True) for p in mine]
    envs: list[list[dict[str, str]]] = []
    index = 0
    for mine in ports:
        here = []
        for _ in mine:
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            here.append({"TF_CONFIG": json.dumps(config), "RANK": str(index)})
            index += 1
        envs.append(here)
    return envs


def host_name(node: NodeInfo) -> str:
    return f"node{node.index}"


def horovod_envs(
    nodes: Sequence[NodeInfo], nproc: int, rendezvous: str, port: int
) -> list[list[dict[str, str]]]:
    """Per node (in `nodes`' order), per worker: Horovod's variables for `nproc` workers on each
    node, the rendezvous at ``rendezvous:port``."""
    from cloudtrain.node.horovod import Slot, worker_env

    size = len(nodes) * nproc
    envs: list[list[dict[str, str]]] = []
    for cross, node in enumerate(nodes):
        here = []
        for local in range(nproc):
            slot = Slot(
                hostname=host_name(node),
                rank=cross * nproc + local,
                local_rank=local,
                cross_rank=cross,
                size=size,
                local_size=nproc,
                cross_size=len(nodes),
            )
            env = worker_env(slot, rendezvous, port, node.ifname or "")
            env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(HOROVOD_TIMEOUT_S)
            here.append(env)
        envs.append(here)
    return envs


def spawn_argv(
    python: str,
    envs: Sequence[dict[str, str]],
    worker: Sequence[str],
    serve: tuple[str, int, Sequence[NodeInfo], int] | None = None,
    timeout: float | None = None,
) -> list[str]:
    """The node's ``spawn`` command for its workers' `envs`; `serve` = (address, port, nodes,
    slots per node) on the head of a Horovod job."""
    argv = [python, "-m", "cloudtrain.node", "spawn", "--envs", json.dumps(list(envs))]
    if serve is not None:
        addr, port, nodes, slots = serve
        hosts = ",".join(f"{host_name(n)}:{slots}" for n in nodes)
        argv += ["--rendezvous", f"{addr}:{port}", "--hosts", hosts]
    if timeout is not None:
        argv += ["--timeout", f"{timeout:g}"]
    return [*argv, "--", *worker]
