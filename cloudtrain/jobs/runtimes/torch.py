"""torchrun on every node (`cloudtrain.jobs.torchrun.Launch`): its c10d rendezvous on the
head, its elastic agent restarting the workers (``--max-restarts``), an elastic job's nodes
between ``--nodes MIN:MAX``. The framework is the node's torch, which its bootstrap made."""

from __future__ import annotations

from typing import ClassVar

from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.runtimes import Runtime, Start
from cloudtrain.jobs.torchrun import ELASTIC_MIN_RESTARTS, Launch, entrypoint_args, forks


class Torch(Runtime):
    name = "torch"
    wired: ClassVar[tuple[str, ...]] = (
        *("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
        *("MASTER_ADDR", "MASTER_PORT"),
    )
    elastic = True
    installs = False

    def argvs(self, start: Start) -> list[list[str]]:
        job, head = start.job, start.nodes[0]
        return [
            Launch(
                python=node.python,
                num_nodes=len(start.nodes),
                nproc_per_node=start.nproc,
                head=f"{head.private_ip}:{start.port}",
                job_id=start.attempt_id,
                is_head=node.index == head.index,
                local_addr=node.private_ip or "",
                max_restarts=max(job.max_restarts, ELASTIC_MIN_RESTARTS if job.min_nodes else 0),
                args=start.args,
                min_nodes=job.min_nodes,
                start_method=job.start_method,
            ).argv()
            for node in start.nodes
        ]

    def prewarm(self, job: JobSpec | None) -> list[str] | None:
        """A forked job's agent comes from the node's warm server: start one (it imports torch
        while the node does something else: the rest of its bootstrap, or, for the jobs to
        come on a node just up, a script under the default start method, nothing)."""
        if job is not None and not forks(job.start_method, entrypoint_args(job.entrypoint)):
            return None
        return ["-m", "cloudtrain.jobs.warm", "--start"]
