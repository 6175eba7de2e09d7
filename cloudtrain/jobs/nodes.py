"""A job's nodes as the coordinator reaches them (`cloudtrain.jobs.coordinator`): one executor
per node, kept open for the coordinator's life; the node agent (`cloudtrain.node`) run over
it; the job's record and the nodes it ran on; a node's part of the job as its agent reads it;
the stop of the job's processes there."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import NotFoundError, ProviderError
from cloudtrain.executors.base import SSH_FAILED, Executor, RunResult, fan_out
from cloudtrain.jobs.attempts import on_our_clock, ran_on, run_dir, unreachable
from cloudtrain.model import NodeInfo
from cloudtrain.provision.provider import Provider
from cloudtrain.state import JobRecord, State

OnLine = Callable[[int, str], None]
KILL_GRACE_S = 10.0


class JobNodes:
    """The nodes of the jobs in `state`, reached through `provider`'s executors."""

    def __init__(self, state: State, provider: Provider, *, home: Path) -> None:
        self.state = state
        self.provider = provider
        self.home = home
        self._executors: dict[str, Executor] = {}
        self._closes = 0  # how many times `close` ran: a follower it ended judges nothing

    def _executor(self, node: NodeInfo) -> Executor:
        if node.node_id not in self._executors:
            self._executors[node.node_id] = self.provider.executor(node)
        return self._executors[node.node_id]

    def _agent(
        self,
        node: NodeInfo,
        *args: str,
        timeout: float | None = 60,
        on_output: Callable[[str], None] | None = None,
    ) -> RunResult:
        """Run ``python -m cloudtrain.node ARGS`` (the node agent) on `node`."""
        return self._executor(node).run(
            [node.python, "-m", "cloudtrain.node", *args], timeout=timeout, on_output=on_output
        )

    def close(self) -> None:
        self._closes += 1  # first: the followers the executors' close ends see it
        for ex in self._executors.values():
            ex.close()
        self._executors.clear()

    def _job(self, job_id: str) -> JobRecord:
        rec = self.state.job(job_id)
        if rec is None:
            raise NotFoundError(f"no job {job_id!r}; `cloudtrain status` lists jobs")
        return rec

    def _job_nodes(self, rec: JobRecord) -> list[NodeInfo]:
        nodes = self.state.nodes(rec.cluster)
        if not nodes:
            raise NotFoundError(f"job {rec.id}: its cluster {rec.cluster!r} is gone (torn down)")
        return ran_on(rec, nodes)

    def _status(self, node: NodeInfo, rec: JobRecord) -> dict[str, Any]:
        """The job's state on `node` as its agent reads it, or ``{"unreachable": why}`` when
        the node cannot be reached (the job may still run there). Its ``ended`` is on this
        machine's clock (`on_our_clock`)."""
        sent = time.time()
        try:
            done = self._agent(node, "status", run_dir(node, rec))
        except ProviderError as exc:  # could not (re)connect
            return unreachable(str(exc))
        if done.returncode == SSH_FAILED:  # the connection broke; the agent never exits 255
            return unreachable(done.stderr.strip().splitlines()[-1:] or ["connection lost"])
        return on_our_clock(dict(json.loads(done.check().stdout)), sent, time.time())

    def _stop(self, rec: JobRecord, nodes: Sequence[NodeInfo], *, mark: bool) -> None:
        """Stop the job's processes on `nodes` (TERM, then KILL after the grace); with `mark`,
        the job is marked cancelled on each node first."""

        def stop(node: NodeInfo) -> None:
            args = [
                "kill",
                "--match",
                f"CLOUDTRAIN_JOB_ID={rec.id}",
                "--match",
                f"CLOUDTRAIN_NODE_ROOT={node.root}",
                "--grace",
                str(KILL_GRACE_S),
                "--job-dir",
                run_dir(node, rec),
            ]
            if mark:
                args.append("--mark")
            self._agent(node, *args, timeout=KILL_GRACE_S + 60).check()

        fan_out(stop, nodes)
