"""How a TensorFlow or a Horovod job is wired: every worker's variables, decided here, and the
node's ``spawn`` command that starts them (`cloudtrain.node.spawn`).

TensorFlow: each worker gets ``TF_CONFIG`` with ``cluster.worker`` = every worker's
``address:port`` (the nodes' private addresses, ports each node chose free) and ``task.index``
= its rank, nodes in the job's order (the head first: its first worker is the chief). Each
runs under `cloudtrain.node.tfworker` (`tensorflow_command`), which makes TensorFlow's gRPC
server listen on that private address alone (TensorFlow's own listens on every interface) and
gives the script ``TF_USE_LEGACY_KERAS=1`` unless the job sets it: ``tf.keras`` is then
tf-keras's Keras 2, with which MultiWorkerMirroredStrategy works (Keras 3 fails in ``fit``).
A command that is not a Python script or module is refused: its servers could not be bound.

Horovod: ranks are dealt node by node (the head's first), ``HOROVOD_CROSS_RANK`` is a worker's
node, ``HOROVOD_CROSS_SIZE`` the nodes with that local rank; the head's spawner serves the gloo
rendezvous on its private address and a port it chose (`cloudtrain.node.horovod`). Hosts are
named ``node<index>``, not by hostname: the local provider's nodes share one.

What the user sets wins: a job's ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (``--env`` or the task's
``envs:``) is the rendezvous timeout its workers and the spawner's report use (whole seconds,
else one line refuses it). The variables that wire the workers together (`WIRED`: ranks, sizes,
addresses) cannot be the user's: a job that sets one is refused with one line (`check_envs`),
never silently given other values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from cloudtrain.errors import ConfigError
from cloudtrain.model import NodeInfo

__all__ = [
    "HOROVOD_TIMEOUT_S",
    "WIRED",
    "check_envs",
    "command",
    "horovod_envs",
    "horovod_timeout_s",
    "host_name",
    "spawn_argv",
    "tensorflow_command",
    "tensorflow_envs",
]

#: How long Horovod's gloo rendezvous waits for every worker before it aborts them all
#: (unless the job sets ``HOROVOD_GLOO_TIMEOUT_SECONDS``: `horovod_timeout_s`).
HOROVOD_TIMEOUT_S = 120
TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
#: The longest rendezvous timeout taken: a day (a worker that never comes holds every GPU).
MAX_TIMEOUT_S = 86_400
#: Per runtime, the variables cloudtrain (or torchrun) gives each worker to wire the job
#: together; a job's own value would be replaced, so it is refused.
WIRED: dict[str, tuple[str, ...]] = {
    "torch": (
        *("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
        *("MASTER_ADDR", "MASTER_PORT"),
    ),
    "tensorflow": ("TF_CONFIG", "RANK"),
    "horovod": (
        *("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
        *("HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"),
        *("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"),
        *("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"),
    ),
}


def check_envs(runtime: str, envs: Mapping[str, str]) -> None:
    """Refuse (`ConfigError`, one line naming the variable) a job environment that sets what
    `runtime` wires itself, or a ``HOROVOD_GLOO_TIMEOUT_SECONDS`` that is not a timeout."""
    for name in WIRED.get(runtime, ()):
        if name in envs:
            raise ConfigError(
                f"envs: {name}={envs[name]!r}: cloudtrain sets {name} for each {runtime} worker "
                "(it wires the job together); leave it out"
            )
    if runtime == "horovod":
        horovod_timeout_s(envs)


def horovod_timeout_s(envs: Mapping[str, str]) -> int:
    """The gloo rendezvous timeout: the job's ``HOROVOD_GLOO_TIMEOUT_SECONDS``, else
    `HOROVOD_TIMEOUT_S`. Raises `ConfigError` for a value that is not 1 to `MAX_TIMEOUT_S`."""
    text = envs.get(TIMEOUT_ENV)
    if text is None:
        return HOROVOD_TIMEOUT_S
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_TIMEOUT_S):
        raise ConfigError(
            f"envs: {TIMEOUT_ENV}={text!r}: write whole seconds from 1 to {MAX_TIMEOUT_S} "
            f"(default {HOROVOD_TIMEOUT_S})"
        )
    return int(text)


def command(args: Sequence[str], python: str) -> list[str]:
    """A worker's command from the job's torchrun-style arguments (`entrypoint_args`)."""
    if args[:1] == ["--module"]:
        return [python, "-m", *args[1:]]
    if args[:1] == ["--no-python"]:
        return list(args[1:])
    return [python, *args]  # a script (`entrypoint_args` dropped a leading ``python``)


#: The node module a TensorFlow worker runs under (`cloudtrain.node.tfworker`).
TFWORKER = "cloudtrain.node.tfworker"


def tensorflow_command(args: Sequence[str], python: str) -> list[str]:
    """A TensorFlow worker's command: the script or module under `TFWORKER`; `ConfigError`
    for a command (``--no-python``), whose TensorFlow servers would listen on every interface."""
    if args[:1] == ["--no-python"]:
        raise ConfigError(
            f"runtime tensorflow runs a Python script or module, not the command {args[1]!r}: "
            "give the script (train.py ARGS, or -m package ARGS), so that cloudtrain can keep "
            "TensorFlow's server on the nodes' private addresses"
        )
    if args[:1] == ["--module"]:
        return [python, "-m", TFWORKER, "-m", *args[1:]]
    return [python, "-m", TFWORKER, *args]


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
    nodes: Sequence[NodeInfo],
    nproc: int,
    rendezvous: str,
    port: int,
    timeout_s: int = HOROVOD_TIMEOUT_S,
) -> list[list[dict[str, str]]]:
    """Per node (in `nodes`' order), per worker: Horovod's variables for `nproc` workers on each
    node, the rendezvous at ``rendezvous:port``, which waits `timeout_s` for every worker."""
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
            here.append(worker_env(slot, rendezvous, port, node.ifname or "", timeout_s=timeout_s))
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
