"""Horovod: ranks are dealt node by node (the head's first), ``HOROVOD_CROSS_RANK`` is a
worker's node, ``HOROVOD_CROSS_SIZE`` the nodes with that local rank; the head's spawner serves
the gloo rendezvous on its private address and a port it chose (`cloudtrain.node.horovod`).
Hosts are named ``node<index>``, not by hostname: the local provider's nodes share one.

What the user sets wins: a job's ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (``--env`` or the task's
``envs:``) is the rendezvous timeout its workers and the spawner's report use (whole seconds,
else one line refuses it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from cloudtrain.errors import ConfigError
from cloudtrain.jobs import workers
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.runtimes import Runtime, Start
from cloudtrain.model import NodeInfo

__all__ = ["HOROVOD_TIMEOUT_S", "Horovod", "horovod_envs", "horovod_timeout_s", "host_name"]

#: How long Horovod's gloo rendezvous waits for every worker before it aborts them all
#: (unless the job sets ``HOROVOD_GLOO_TIMEOUT_SECONDS``: `horovod_timeout_s`).
HOROVOD_TIMEOUT_S = 120
TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
#: The longest rendezvous timeout taken: a day (a worker that never comes holds every GPU).
MAX_TIMEOUT_S = 86_400


class Horovod(Runtime):
    name = "horovod"
    wired: ClassVar[tuple[str, ...]] = (
        *("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
        *("HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"),
        *("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"),
        *("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"),
    )

    def check(self, job: JobSpec, args: Sequence[str]) -> None:
        super().check(job, args)
        horovod_timeout_s(job.envs)

    def argvs(self, start: Start) -> list[list[str]]:
        nodes, head = start.nodes, start.nodes[0]
        addr = head.private_ip or ""
        timeout_s = horovod_timeout_s(start.job.envs)  # the user's, when set
        envs = horovod_envs(nodes, start.nproc, addr, start.port, timeout_s)
        hosts = ",".join(f"{host_name(n)}:{start.nproc}" for n in nodes)
        serve = ["--rendezvous", f"{addr}:{start.port}", "--hosts", hosts]
        return [
            workers.spawn_argv(n.python, e, workers.command(start.args, n.python),
                               serve if n is head else [], timeout_s)
            for n, e in zip(nodes, envs, strict=True)
        ]  # fmt: skip


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
