"""TensorFlow: each worker gets ``TF_CONFIG`` with ``cluster.worker`` = every worker's
``address:port`` (the nodes' private addresses, ports each node chose free) and ``task.index``
= its rank, nodes in the job's order (the head first: its first worker is the chief). Each
runs under `cloudtrain.node.tfworker` (`tensorflow_command`), which makes TensorFlow's gRPC
server listen on that private address alone (TensorFlow's own listens on every interface) and
gives the script ``TF_USE_LEGACY_KERAS=1`` unless the job sets it: ``tf.keras`` is then
tf-keras's Keras 2, with which MultiWorkerMirroredStrategy works (Keras 3 fails in ``fit``).
A command that is not a Python script or module is refused: its servers could not be bound.
One worker per node by default, with all of its GPUs (``--nproc-per-node`` for more)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

from cloudtrain.errors import ConfigError
from cloudtrain.jobs import workers
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.runtimes import Runtime, Start
from cloudtrain.model import NodeInfo

__all__ = ["TFWORKER", "TensorFlow", "tensorflow_command", "tensorflow_envs"]

#: The node module a TensorFlow worker runs under (`cloudtrain.node.tfworker`).
TFWORKER = "cloudtrain.node.tfworker"


class TensorFlow(Runtime):
    name = "tensorflow"
    wired: ClassVar[tuple[str, ...]] = ("TF_CONFIG", "RANK")

    def check(self, job: JobSpec, args: Sequence[str]) -> None:
        super().check(job, args)
        tensorflow_command(args, "python")  # a command is refused before anything is made

    def workers_per_node(self, gpus: int) -> int:
        return 0  # one worker, all of the node's GPUs

    def argvs(self, start: Start) -> list[list[str]]:
        envs = tensorflow_envs(start.nodes, start.free_ports(start.nproc))
        return [
            workers.spawn_argv(n.python, e, tensorflow_command(start.args, n.python))
            for n, e in zip(start.nodes, envs, strict=True)
        ]


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
    everyone = [f"{n.private_ip}:{p}" for n, mine in zip(nodes, ports, strict=True) for p in mine]
    envs: list[list[dict[str, str]]] = []
    index = 0
    for mine in ports:
        here = []
        for _ in mine:
            config = {"cluster": {"worker": everyone}, "task": {"type": "worker", "index": index}}
            here.append({"TF_CONFIG": json.dumps(config), "RANK": str(index)})
            index += 1
        envs.append(here)
    return envs
