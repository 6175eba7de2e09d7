"""Runs jobs on a cluster: sync the workdir, run setup once per node, start ``torchrun`` on every
node detached from this process, follow the logs, record the outcome, stop everything on cancel.

A job lives on its nodes in ``<node root>/jobs/<job id>/`` (``node.log``, ``pid``, ``exit_code``,
``cancelled``) and in the state database; everything here reads the nodes through executors and
the node agent (`cloudtrain.node`), so a new CLI process can always find a running job again.
Each refresh records every node's part (`node_state`) in the job's ``detail["nodes"]``; a node
that does not answer keeps the job open (silence is no verdict) unless it went away while
followed. Every job on a node gets the NCCL settings its bootstrap wrote (``<root>/nccl.env``).

Job lifecycle (the ``status`` column)::

    pending ──► running ──► succeeded     every node's torchrun exited 0
                  │    └──► failed        a node exited non-zero (the others are stopped), its
                  │                       process vanished, or its host went away while the
                  │                       job was followed; `detail` names node and log tail
                  ├───────► cancelled     `cancel`, or an interrupted start
                  └─► recovering ─► running   a managed job's watcher replaces a lost node
                                              and starts the next attempt (`jobs.managed`)

How an attempt ended is `cloudtrain.jobs.attempts.judge`'s to say; a final status is recorded
once (`State.finish_job`). While a job is followed its nodes are asked for their part every
`HEARTBEAT_S`: one that has not answered for `heartbeat_timeout_s()` is lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import CommandError, ConfigError, JobError, NotFoundError, ProviderError
from cloudtrain.executors import received
from cloudtrain.executors.base import SSH_FAILED, Executor, RunResult, fan_out
from cloudtrain.jobs import (
    checkpoints,
    logtail,
    metrics,
    preemptions,
    rehost,
    saves,
    shards,
    workers,
)
from cloudtrain.jobs.attempts import (
    HEARTBEAT_S,
    JobSpec,
    Verdict,
    attempt_of,
    elastic,
    heartbeat_timeout_s,
    job_dir,
    judge,
    last_end,
    node_state,
    on_our_clock,
    ran_on,
    run_dir,
    unreachable,
)
from cloudtrain.jobs.torchrun import (
    ELASTIC_MIN_RESTARTS,
    Launch,
    entrypoint_args,
    read_failure,
    rendezvous_first,
)
from cloudtrain.model import NodeInfo
from cloudtrain.provision.provider import Provider
from cloudtrain.state import JobRecord, State

log = logging.getLogger(__name__)

OnLine = Callable[[int, str], None]
KILL_GRACE_S = 10.0
#: While a followed job prints, its metrics come home this often (a script reports as it
#: prints: the progress panel keeps pace with the log); when it is quiet, at each heartbeat.
METRICS_S = 1.0


def _workdir(node: NodeInfo) -> str:
    return f"{node.root}/workdir"


#: Runs "$2" with the folder "$1" (the node's Python's) first on PATH, and VIRTUAL_ENV set
#: when that folder is a venv's: `setup: pip install ...` installs where the job imports from.
_IN_PYTHON_ENV = (
    'if [ -f "$1/../pyvenv.cfg" ]; then VIRTUAL_ENV=$(cd "$1/.." && pwd); export VIRTUAL_ENV; '
    'fi; PATH="$1:$PATH"; export PATH; exec /bin/sh -c "$2"'
)


def in_python_env(node: NodeInfo, script: str) -> list[str]:
    """The argv that runs the shell `script` on `node` with its Python's environment (the one
    the job runs under) first; as it is when that Python is a bare name."""
    if "/" not in node.python:
        return ["/bin/sh", "-c", script]
    bindir = node.python.rsplit("/", 1)[0] or "/"
    return ["/bin/sh", "-c", _IN_PYTHON_ENV, "sh", bindir, script]


def sync_workdir(ex: Executor, node: NodeInfo, workdir: Path | None) -> None:
    """Bring the node's ``<root>/workdir`` up to date with `workdir` (only what changed
    moves), or make it empty when the job has none."""
    if workdir is not None:
        ex.put(workdir, _workdir(node))
    else:
        ex.run(["mkdir", "-p", _workdir(node)]).check()


def run_setup(
    ex: Executor, node: NodeInfo, setup: str, envs: Mapping[str, str], on_line: OnLine | None
) -> None:
    """Run the setup script on `node`, skipped when the same script (and environment)
    already succeeded there: a hash of both is kept in ``<node root>/setup.sha256``."""
    digest = hashlib.sha256(json.dumps([setup, sorted(envs.items())]).encode()).hexdigest()
    marker = f"{node.root}/setup.sha256"
    if ex.run(["cat", marker]).stdout.strip() == digest:
        return
    emit = (lambda line: on_line(node.index, line)) if on_line else None
    ex.run(in_python_env(node, setup), cwd=_workdir(node), env=dict(envs),
           on_output=emit).check()  # fmt: skip
    ex.run(["/bin/sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", digest, marker]).check()


class Coordinator:
    """Jobs on the clusters in `state`, reached through `provider`'s executors."""

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

    # -- starting ---------------------------------------------------------------------------

    def submit(
        self,
        cluster: str,
        job: JobSpec,
        on_line: OnLine | None = None,
        *,
        managed: Mapping[str, Any] | None = None,
    ) -> JobRecord:
        """Start `job` on every node of `cluster` and return once all of them run it; a
        `managed` policy (`cloudtrain.jobs.managed`) is recorded with it for its watcher.

        Blocks for the sync, setup and start; not for the training. Holds the cluster's lock
        while it starts the job (`cloudtrain.locks`: an `up` or `down` of the cluster waits).
        Raises `CommandError` when setup fails on a node, `NotFoundError` for an unknown
        cluster. On any failure (or Ctrl-C) the ranks already started are stopped and the job
        is recorded as such."""
        from cloudtrain import locks

        with locks.cluster_lock(self.home, cluster, "train", on_wait=log.warning):
            return self._submit(cluster, job, on_line, managed)

    def _submit(
        self,
        cluster: str,
        job: JobSpec,
        on_line: OnLine | None,
        managed: Mapping[str, Any] | None,
    ) -> JobRecord:
        record = self.state.cluster(cluster)
        if record is None:
            raise NotFoundError(f"no cluster named {cluster!r}; `cloudtrain status` lists them")
        spec = record.spec
        resume = None  # checked before anything is made: a job with nothing kept is an error
        from cloudtrain.spec import validate_checkpoint_keep

        validate_checkpoint_keep(job.checkpoint_keep)  # as a bad URL or no boto3: refused here
        bucket = checkpoints.bucket_of(job.checkpoint_url)
        if job.resume_from:
            kept = checkpoints.Kept(self.home, job.resume_from)
            resume = kept.required(bucket)
            if job.strategy == "fsdp":  # the newest that holds a complete checkpoint
                resume = shards.newest_usable(kept.snapshots()) or resume
        workers.check_envs(job.runtime, job.envs)  # what it wires is not the user's to set
        if (job.num_nodes or 0) > spec.num_nodes:
            raise ConfigError(
                f"--nodes {job.num_nodes}: cluster {cluster!r} has {spec.num_nodes} node(s); "
                f"`cloudtrain up --name {cluster}` with more, or ask for fewer"
            )
        nodes = rendezvous_first(self._live_nodes(cluster, spec.num_nodes))
        nodes = nodes[: job.num_nodes or len(nodes)]
        if job.runtime != "torch" and (job.min_nodes or job.max_restarts):
            flag = "--nodes MIN:MAX (elastic)" if job.min_nodes else "--max-restarts"
            raise ConfigError(
                f"{flag} is torchrun's and needs runtime torch, not {job.runtime!r}; "
                "--managed recovers any runtime's job"
            )
        gpus = 0 if job.runtime == "tensorflow" else spec.resources.count  # one worker, all GPUs
        nproc = job.nproc_per_node or gpus or 1
        args = entrypoint_args(job.entrypoint)
        if job.runtime == "tensorflow":
            workers.tensorflow_command(args, "python")  # a command is refused before anything
        name = job.name or Path(job.entrypoint[0]).stem or "job"
        rec = self.state.new_job(
            cluster, name, num_nodes=len(nodes), nproc_per_node=nproc, command=list(args)
        )
        self.state.add_event(
            cluster, "job", f"job {rec.id} submitted: {shlex.join(args)}", job_id=rec.id
        )
        override = job.envs.get(checkpoints.CHECKPOINT_ENV)
        self.state.update_job(
            rec.id,
            detail={
                "checkpoint_dir": override,
                "checkpoint_url": job.checkpoint_url,
                "checkpoint_keep": job.checkpoint_keep,
            },
        )
        policy = {"managed": dict(managed)} if managed else {}
        self.state.update_job(rec.id, detail={"spec": job.to_dict(), **policy})
        try:
            return self._launch(self._job(rec.id), nodes, job, resume, on_line)
        except BaseException as exc:
            status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
            self.finish(rec.id, status, detail={"error": f"{type(exc).__name__}: {exc}"})
            raise

    def relaunch(
        self,
        job_id: str,
        resume: Path | None,
        on_line: OnLine | None = None,
        *,
        on: Collection[int] | None = None,
    ) -> JobRecord:
        """Start the recorded job `job_id` again on its cluster's live nodes (or those of
        them in `on`: an elastic job's survivors, `cloudtrain.jobs.rehost`), as its next
        attempt (a managed job's recovery), every node first given the snapshot `resume`.
        Holds the cluster's lock; on any failure the ranks started are stopped and the error
        raised, the job's record left to the caller."""
        from cloudtrain import locks

        rec = self._job(job_id)
        with locks.cluster_lock(self.home, rec.cluster, "train", on_wait=log.warning):
            rec = self._job(job_id)
            if rec.finished or rec.detail.get("cancel_requested"):
                return rec  # cancelled while it was being recovered: start nothing
            live = self._live_nodes(rec.cluster, rec.num_nodes if on is None else len(on))
            nodes = rendezvous_first([n for n in live if on is None or n.index in on])
            nodes = nodes[: rec.num_nodes]
            if not nodes:
                raise NotFoundError(f"none of the nodes {sorted(on or ())} of {rec.cluster!r} "
                                    "runs")  # fmt: skip
            job = JobSpec.from_dict(rec.detail.get("spec") or {})
            return self._launch(rec, nodes, job, resume, on_line, attempt=attempt_of(rec) + 1)

    def _launch(
        self,
        rec: JobRecord,
        nodes: Sequence[NodeInfo],
        job: JobSpec,
        resume: Path | None,
        on_line: OnLine | None,
        attempt: int = 0,
    ) -> JobRecord:
        """Sync, restore, set up and start attempt `attempt` of `rec` on `nodes`; the ranks
        started are stopped again when anything fails (or Ctrl-C), and the error raised."""
        override = rec.detail.get("checkpoint_dir")
        args = list(rec.command)
        self.state.update_job(
            rec.id, detail={"attempt": attempt, "ran_on": [n.index for n in nodes]}
        )
        rec = self._job(rec.id)
        try:
            fan_out(lambda n: self._sync(n, job.workdir), nodes)
            # An fsdp recovery with no whole checkpoint kept starts afresh (the nodes' folders
            # emptied), not from the survivors' shards, whose lost peers' shards are gone.
            fresh = resume is None and attempt > 0 and job.strategy == "fsdp"
            with tempfile.TemporaryDirectory() as empty:
                given = Path(empty) if fresh else resume
                if given is not None:
                    fan_out(
                        lambda n: self._executor(n).put(
                            given, checkpoints.node_folder(n.root, rec.id, override)
                        ),
                        nodes,
                    )
            setup = job.setup
            if setup:
                fan_out(lambda n: self._setup(n, setup, job.envs, on_line), nodes)
            if job.runtime != "torch":
                fan_out(lambda n: self._framework(n, job.runtime, on_line), nodes)
            head = nodes[0]
            port = int(self._agent(head, "port").check().stdout.strip())
            argvs = self._argvs(rec, job, nodes, args, port, attempt)

            def start(n: NodeInfo, argv: list[str]) -> int:
                return self._start(rec, n, nodes, argv, job, attempt)

            # The head first: a Horovod job's head serves the rendezvous the others' workers
            # look for. (torchrun's ranks are the rendezvous's: by (address, pid), so on nodes
            # that share an address, the local provider's, node 0 need not hold rank 0.)
            rest = list(zip(nodes[1:], argvs[1:], strict=True))
            pids = [start(head, argvs[0]), *fan_out(lambda na: start(*na), rest)]
        except BaseException:
            self._stop(rec, nodes, mark=True)
            raise
        detail = {
            "head": f"{head.private_ip}:{port}",
            rehost.HEAD_KEY: head.index,
            "nodes": [  # the shape every refresh writes (`node_state`), and where it started
                {"state": "running", "exit_code": None, "index": n.index, "pid": p}
                for n, p in zip(nodes, pids, strict=True)
            ],
        }
        self.state.update_job(
            rec.id, status="running", started_at=None if attempt else time.time(), detail=detail
        )
        again = f" (attempt {attempt + 1})" if attempt else ""
        self.state.add_event(
            rec.cluster, "job", f"job {rec.id} running on {len(nodes)} node(s){again}",
            job_id=rec.id,
        )  # fmt: skip
        return self._job(rec.id)

    def _live_nodes(self, cluster: str, expected: int) -> list[NodeInfo]:
        """The cluster's nodes as the provider sees them now (its tags are the truth)."""
        record = self.state.cluster(cluster)
        nodes = self.provider.describe(cluster, record.spec.cluster_id if record else None)
        running = [n for n in nodes if n.state == "running"]
        if len(running) < expected:
            others = "".join(f", node {n.index} {n.state}" for n in nodes if n.state != "running")
            raise NotFoundError(
                f"cluster {cluster!r} has {len(running)} of its {expected} node(s) running"
                f"{others}; `cloudtrain up --name {cluster}` completes it, "
                f"`cloudtrain down {cluster}` removes it"
            )
        self.state.set_nodes(cluster, running)
        return running

    def _sync(self, node: NodeInfo, workdir: Path | None) -> None:
        sync_workdir(self._executor(node), node, workdir)

    def _setup(
        self, node: NodeInfo, setup: str, envs: Mapping[str, str], on_line: OnLine | None
    ) -> None:
        run_setup(self._executor(node), node, setup, envs, on_line)

    def _env(
        self, rec: JobRecord, node: NodeInfo, nodes: Sequence[NodeInfo], job: JobSpec
    ) -> dict[str, str]:
        record = self.state.cluster(rec.cluster)
        gpus = record.spec.resources.count if record else 0
        ips = [n.private_ip or "" for n in nodes]
        env = {"PYTHONUNBUFFERED": "1"}
        if not gpus:
            env["OMP_NUM_THREADS"] = "1"
        if node.ifname:
            env["GLOO_SOCKET_IFNAME"] = node.ifname
        env.update(self._fabric(node))
        env.update(job.envs)
        env.update(
            {
                "CLOUDTRAIN_CLUSTER": rec.cluster,
                "CLOUDTRAIN_JOB_ID": rec.id,
                "CLOUDTRAIN_NODE_RANK": str(node.index),
                "CLOUDTRAIN_NUM_NODES": str(len(nodes)),
                "CLOUDTRAIN_NODE_IPS": ",".join(ips),
                "CLOUDTRAIN_HEAD_IP": ips[0],
                "CLOUDTRAIN_GPUS_PER_NODE": str(gpus),
                "CLOUDTRAIN_NODE_ROOT": node.root,
                "CLOUDTRAIN_RUNTIME": job.runtime,
            }
        )
        if job.strategy:
            env["CLOUDTRAIN_STRATEGY"] = job.strategy
        own = job.envs.get("CLOUDTRAIN_CHECKPOINT_DIR")
        env["CLOUDTRAIN_CHECKPOINT_DIR"] = checkpoints.node_folder(node.root, rec.id, own)
        return env

    def _fabric(self, node: NodeInfo) -> dict[str, str]:
        """The NCCL settings the node's bootstrap wrote for its network (``<root>/nccl.env``:
        EFA, InfiniBand, the interface); none when there is no such file."""
        done = self._executor(node).run(["cat", f"{node.root}/nccl.env"], timeout=60)
        if done.returncode != 0:
            return {}
        words = shlex.split(done.stdout, comments=True)
        return dict(w.split("=", 1) for w in words if "=" in w)

    def _argvs(
        self,
        rec: JobRecord,
        job: JobSpec,
        nodes: Sequence[NodeInfo],
        args: Sequence[str],
        port: int,
        attempt: int,
    ) -> list[list[str]]:
        """Each node's command for the job's runtime (`nodes` in rank order, the head first;
        `port` is free on the head): torchrun, or the spawner of TensorFlow's or Horovod's
        workers (`cloudtrain.jobs.workers`)."""
        nproc, head = rec.nproc_per_node, nodes[0]
        if job.runtime == "tensorflow":
            ports = fan_out(lambda n: [int(p) for p in self._agent(
                n, "port", "--count", str(nproc)).check().stdout.split()], nodes)  # fmt: skip
            envs = workers.tensorflow_envs(nodes, ports)
            return [workers.spawn_argv(n.python, e, workers.tensorflow_command(args, n.python))
                    for n, e in zip(nodes, envs, strict=True)]  # fmt: skip
        if job.runtime == "horovod":
            addr = head.private_ip or ""
            timeout_s = workers.horovod_timeout_s(job.envs)  # the user's, when set
            envs = workers.horovod_envs(nodes, nproc, addr, port, timeout_s)
            serve = (addr, port, nodes, nproc)
            return [
                workers.spawn_argv(n.python, e, workers.command(args, n.python),
                                   serve if n is head else None, timeout_s)
                for n, e in zip(nodes, envs, strict=True)
            ]  # fmt: skip
        return [
            Launch(
                python=node.python,
                num_nodes=len(nodes),
                nproc_per_node=nproc,
                head=f"{head.private_ip}:{port}",
                job_id=rec.id + (f".{attempt}" if attempt else ""),
                is_head=node.index == head.index,
                local_addr=node.private_ip or "",
                max_restarts=max(job.max_restarts, ELASTIC_MIN_RESTARTS if job.min_nodes else 0),
                args=args,
                min_nodes=job.min_nodes,
                start_method=job.start_method,
            ).argv()
            for node in nodes
        ]

    def _framework(self, node: NodeInfo, runtime: str, on_line: OnLine | None) -> None:
        """Make the runtime's framework importable on `node` (cloud nodes install it, once),
        or fail with what to install (`cloudtrain.node.runtimes`)."""
        emit = (lambda line: on_line(node.index, line)) if on_line else None
        done = self._agent(node, "runtime", runtime, "--root", node.root, timeout=None,
                           on_output=emit)  # fmt: skip
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise ConfigError(f"node {node.index}: " + (lines[-1] if lines else
                           f"the {runtime} runtime's check exited {done.returncode}"))  # fmt: skip

    def _start(
        self,
        rec: JobRecord,
        node: NodeInfo,
        nodes: Sequence[NodeInfo],
        argv: Sequence[str],
        job: JobSpec,
        attempt: int,
    ) -> int:
        folder = job_dir(node, rec.id, attempt)
        return self._executor(node).start_detached(
            argv,
            env={**self._env(rec, node, nodes, job), "CLOUDTRAIN_RUN_DIR": folder},
            cwd=_workdir(node),
            job_dir=folder,
        )

    # -- watching ---------------------------------------------------------------------------

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

    def _note_preemptions(
        self, rec: JobRecord, nodes: Sequence[NodeInfo], statuses: Sequence[Mapping[str, Any]]
    ) -> None:
        """A node whose cloud announced its preemption (its agent recorded the notice) is an
        event of the job, once per notice, recorded at the heartbeat that sees it
        (`cloudtrain.jobs.preemptions`)."""
        preemptions.note(self.state, self._job(rec.id), nodes, statuses)

    def _note_agents(
        self, rec: JobRecord, nodes: Sequence[NodeInfo], statuses: Sequence[Mapping[str, Any]]
    ) -> None:
        """A node whose resident agent had stopped, and that the heartbeat started again, is
        an event of the cluster."""
        for node, status in zip(nodes, statuses, strict=True):
            why = (status.get("agent") or {}).get("restarted")
            if why:
                self.state.add_event(rec.cluster, "agent",
                                     f"node {node.index}'s agent was not running ({why}); "
                                     "started again", job_id=rec.id)  # fmt: skip

    def _note_progress(self, rec: JobRecord, statuses: Sequence[Mapping[str, Any]]) -> None:
        """Record the furthest step a node reported (``detail["progress"]``); once a recovered
        attempt says where it resumed, the recovery's ``steps_redone`` (an event too)."""
        reports = [s["progress"] for s in statuses if isinstance(s.get("progress"), dict)]
        if not reports:
            return
        furthest = max(reports, key=lambda p: int(p.get("step") or 0))
        detail: dict[str, Any] = {"progress": furthest}
        recoveries = list(self._job(rec.id).detail.get("recoveries") or [])
        last = recoveries[-1] if recoveries else None
        resumed = furthest.get("resumed_from")
        if last and "step_at_loss" in last and "steps_redone" not in last and resumed is not None:
            redone = max(0, int(last["step_at_loss"]) - int(resumed))
            last.update(resumed_at_step=int(resumed), steps_redone=redone)
            detail["recoveries"] = recoveries
            self.state.add_event(rec.cluster, "recovery",
                                 f"job {rec.id}: resumed at step {resumed}, {redone} step(s) "
                                 "redone", job_id=rec.id)  # fmt: skip
        self.state.update_job(rec.id, detail=detail)

    def pull_metrics(self, rec: JobRecord, nodes: Sequence[NodeInfo] | None = None) -> None:
        """Copy home the new lines of the current attempt's metrics from `nodes` (default: the
        job's); a node that does not answer is logged and tried again next time."""
        attempt = attempt_of(rec)
        closes = self._closes

        def pull(node: NodeInfo) -> None:
            folder = job_dir(node, rec.id, attempt)
            try:
                metrics.pull(metrics.copy_path(self.home, rec.id, attempt, node.index),
                             lambda offset: self._agent(node, "metrics", folder, "--offset",
                                                        str(offset)).check().stdout)  # fmt: skip
            except (CommandError, ProviderError, OSError) as exc:
                if self._closes != closes:  # ended by `close` (Ctrl-C): not the node's fault
                    return
                log.warning("could not copy the metrics of %s from node %d: %s", rec.id,
                            node.index, exc)  # fmt: skip

        fan_out(pull, ran_on(rec, nodes) if nodes is not None else self._job_nodes(rec))

    def _read_log(self, node: NodeInfo, rec: JobRecord, tail: int | None = None) -> str:
        args = ["follow", "--once", run_dir(node, rec)]
        if tail is not None:
            args[2:2] = ["--tail", str(tail)]
        return self._agent(node, *args, timeout=300).stdout

    def refresh(self, job_id: str) -> JobRecord:
        """Read the job's state from its nodes and record it. Idempotent; blocks for one round
        trip to every node. A managed job's outcome is its watcher's to record."""
        rec = self._job(job_id)
        if rec.finished:
            return rec
        nodes = self._job_nodes(rec)
        statuses = fan_out(lambda n: self._status(n, rec), nodes)
        verdict = self._verdict(rec, nodes, statuses)
        if verdict is None or rec.detail.get("managed"):
            return self._job(rec.id)
        return self.record(rec, verdict, ended_at=last_end(statuses))  # not when it was seen

    def _verdict(
        self,
        rec: JobRecord,
        nodes: Sequence[NodeInfo],
        statuses: Sequence[Mapping[str, Any]],
        *,
        lost: Mapping[int, str] | None = None,
    ) -> Verdict | None:
        """Record each node's state; once no node runs the attempt, how it ended (None while
        it runs, or cannot be told). A node that cannot be reached keeps the job open, unless
        `lost` says its host went away while the job was followed (then the job failed
        there)."""
        states = [node_state(s) for s in statuses]
        self.state.update_job(rec.id, detail={"nodes": states})
        self._note_preemptions(rec, nodes, statuses)
        self._note_agents(rec, nodes, statuses)
        self._note_progress(rec, statuses)
        statuses = preemptions.remembered(self._job(rec.id), nodes, statuses)  # node gone since
        return judge(rec, nodes, statuses, lost or {},
                     lambda node: read_failure(self._read_log(node, rec, tail=80)))  # fmt: skip

    def record(
        self, rec: JobRecord, verdict: Verdict, *, ended_at: float | None = None
    ) -> JobRecord:
        """Record how the job ended (once: a job that already ended keeps its status), and
        when: `ended_at` as its nodes said (`State.finish_job` bounds it), else now."""
        if verdict.status == "failed":
            detail = {"failed_node": verdict.node, "reason": verdict.reason,
                      "log_tail": verdict.tail, "cause": verdict.cause}  # fmt: skip
            code: int | None = verdict.exit_code if verdict.exit_code is not None else -1
            message = f"failed: node {verdict.node} {verdict.reason}"
        else:
            detail, code, message = {}, verdict.exit_code, verdict.status
        recorded = self.finish(
            rec.id, verdict.status, exit_code=code, detail=detail, ended_at=ended_at
        )
        if recorded:
            self.state.add_event(rec.cluster, "job", f"job {rec.id} {message}", job_id=rec.id)
        return self._job(rec.id)

    def finish(
        self,
        job_id: str,
        status: str,
        *,
        exit_code: int | None = None,
        detail: Mapping[str, Any] | None = None,
        ended_at: float | None = None,
    ) -> bool:
        """Record the job's final status unless it has one already; whether it was recorded."""
        return self.state.finish_job(
            job_id, status, exit_code=exit_code, detail=detail, ended_at=ended_at
        )

    def follow(self, job_id: str, on_line: OnLine) -> JobRecord:
        """Stream every node's log to `on_line(node_index, line)` until the job ends, keep a
        copy under ``<home>/logs/<job>/``, and record the outcome. When a node fails, the
        others are stopped. Blocks; a KeyboardInterrupt stops following and leaves the job."""
        verdict = self.watch_attempt(job_id, on_line)
        rec = self._job(job_id)
        if verdict is None and not rec.finished and rec.detail.get("cancel_requested"):
            # stopped by a `down` (or a cancel) whose teardown left no node to say so: the
            # job was cancelled, whichever of the two records it first
            self.finish(job_id, "cancelled")
            rec = self._job(job_id)
        if rec.finished or verdict is None:
            return rec
        return self.record(rec, verdict)

    def watch_attempt(
        self,
        job_id: str,
        on_line: OnLine,
        *,
        append: bool = False,
        regrow: Callable[[int], bool] | None = None,
        absent: Collection[int] = (),
    ) -> Verdict | None:
        """Follow the job's current attempt to its end (see `follow`) and say how it ended,
        recording nothing but the nodes' states. Every `HEARTBEAT_S` each node is asked for
        its part: one that has not answered for `heartbeat_timeout_s()` is lost, and the
        others are stopped. With `append`, the log copies grow (a managed job's attempts).

        An elastic job's survivors go on without a lost node but its head (the rendezvous
        host: its loss ends the attempt, `cloudtrain.jobs.rehost`); with `regrow` (a managed
        elastic job's watcher), `regrow(index)` runs in a thread of its own for each one (and
        from the start for those `absent`, lost before this attempt), making it again while
        they train. Once it says the node is back, the attempt is stopped and its
        verdict is ``regrow``: the watcher starts the next one on every node. (A replacement
        that joins the running attempt instead, at torchrun's next round, deadlocked in
        torch 2.13's rank assignment when it came while the survivors re-formed; a restart
        from the newest checkpoint costs what a membership change costs: every worker
        restarts and resumes.)"""
        rec = self._job(job_id)
        nodes = self._job_nodes(rec)
        stop_once = threading.Lock()
        closes = self._closes
        heard = [-math.inf]  # when a node last printed a line
        lost: dict[int, str] = {}
        copy_dir = self.home / "logs" / job_id
        copy_dir.mkdir(parents=True, exist_ok=True)
        back: list[int] = []  # the nodes made again (filled by the regrow threads)
        restart: int | None = None  # the node whose return stopped the attempt
        regrowing: dict[int, threading.Thread] = {}
        head = rehost.head_of(rec)

        def goes_on(index: int) -> bool:  # the others go on without this node
            return elastic(rec) and index != head

        def stop_others(node: NodeInfo, why: str, *, itself: bool = False) -> None:
            if stop_once.acquire(blocking=False):
                log.info("job %s: node %d %s; stopping the others", job_id, node.index, why)
                others = [n for n in nodes if (itself or n is not node) and n.index not in lost]
                self._stop(rec, others, mark=False)

        def watch(node: NodeInfo) -> None:
            with open(copy_dir / f"node-{node.index}.log", "a" if append else "w") as copy:
                if append:  # a managed job's copy holds every attempt: say where one starts
                    copy.write(f"cloudtrain: attempt {attempt_of(rec) + 1} of {job_id}\n")
                    copy.flush()

                def emit(line: str) -> None:
                    copy.write(line + "\n")
                    copy.flush()
                    heard[0] = time.monotonic()
                    on_line(node.index, line)

                with contextlib.suppress(ProviderError):  # unreachable: the status says so
                    self._agent(node, "follow", run_dir(node, rec), timeout=None,
                                on_output=emit)  # fmt: skip
            if self._closes != closes:  # left (Ctrl-C): the job goes on, nothing to judge
                return
            status = self._status(node, rec)
            if "unreachable" in status:
                lost[node.index] = status["unreachable"]
            code = status["exit_code"]
            if code == 0 or status["cancelled"]:
                return
            if code is not None or not goes_on(node.index):  # an elastic job's survivors go on
                # a node that exited answers: what its launcher left (its ranks, when the
                # launcher was killed) stops too
                stop_others(node, node_state(status)["state"], itself=code is not None)

        def make_again(index: int) -> None:
            assert regrow is not None
            with contextlib.suppress(Exception):  # `regrow` says why; the survivors go on
                if regrow(index):
                    back.append(index)

        for index in absent if regrow is not None else ():
            regrowing[index] = threading.Thread(target=make_again, args=(index,), daemon=True)
            regrowing[index].start()

        threads = {n.index: threading.Thread(target=watch, args=(n,), daemon=True) for n in nodes}
        for t in threads.values():
            t.start()
        silent: dict[int, float] = {}  # node → when it first did not answer
        vanished: dict[int, int] = {}  # node → heartbeats that found its processes gone
        copies = saves.HomeCopies(  # each save that completes comes home at once
            rec, nodes, self._executor, lambda: self.pull_checkpoints(job_id), lost=lost
        )
        next_beat = time.monotonic() + HEARTBEAT_S
        next_metrics = 0.0

        def followed(index: int) -> bool:
            return index not in lost and vanished.get(index, 0) < 2

        while any(t.is_alive() for i, t in threads.items() if followed(i)):
            for t in threads.values():
                t.join(timeout=0.2 / len(threads))
            if back and stop_once.acquire(blocking=False):  # the cluster is whole again
                restart = back[0]
                log.info("job %s: node %d is back; stopping the attempt", job_id, restart)
                self._stop(rec, [n for n in nodes if n.index not in lost], mark=False)
            now = time.monotonic()
            if now > next_beat:
                beats = fan_out(lambda n: self._status(n, rec), nodes)
                self.pull_metrics(rec, [n for n in nodes if n.index not in lost])
                self.state.update_job(rec.id, detail={"nodes": [node_state(b) for b in beats]})
                self._note_agents(rec, nodes, beats)
                self._note_preemptions(rec, nodes, beats)  # before the node goes with it
                self._note_progress(rec, beats)
                for node, status in zip(nodes, beats, strict=True):
                    state = node_state(status)["state"]
                    if state != "unreachable":
                        silent.pop(node.index, None)
                    elif now - silent.setdefault(node.index, now) > heartbeat_timeout_s():
                        why = status["unreachable"]
                        lost[node.index] = f"no answer for {now - silent[node.index]:.0f} s: {why}"
                        if not goes_on(node.index):
                            stop_others(node, "stopped answering")
                    if state == "vanished":  # its follower may wait on files that are gone
                        vanished[node.index] = vanished.get(node.index, 0) + 1
                        if not goes_on(node.index):
                            stop_others(node, state)
                if regrow is not None and elastic(rec):
                    for node, status in zip(nodes, beats, strict=True):
                        gone = not followed(node.index) or not threads[node.index].is_alive()
                        ended = node_state(status)["state"] in ("vanished", "unreachable")
                        if gone and ended and goes_on(node.index) and node.index not in regrowing:
                            regrowing[node.index] = threading.Thread(
                                target=make_again, args=(node.index,), daemon=True
                            )
                            regrowing[node.index].start()
                next_beat = time.monotonic() + HEARTBEAT_S
            if now > next_metrics and now - heard[0] < 2 * METRICS_S:  # it prints: keep pace
                self.pull_metrics(rec, [n for n in nodes if n.index not in lost])
                next_metrics = time.monotonic() + METRICS_S
            copies.tick()  # each save that completes comes home at once (and every 30 s)
        for thread in regrowing.values():  # a node made again is the next attempt's
            thread.join()
        copies.close()
        self.pull_metrics(rec, [n for n in nodes if n.index not in lost])
        self.pull_checkpoints(job_id)
        if self._job(job_id).finished:
            return None
        if restart is not None:
            return Verdict("failed", "regrow", node=restart, reason="is back")
        statuses = fan_out(lambda n: self._status(n, rec), nodes)
        return self._verdict(rec, nodes, statuses, lost=lost)

    def logs(self, job_id: str, on_line: OnLine, *, follow: bool = False) -> JobRecord:
        """Print a job's logs from its nodes (or the copy kept when its cluster is gone, and
        for a managed job, whose copy holds every attempt): the tail of each, bounded
        (`logtail`), with a line saying what was left out."""
        rec = self._job(job_id)
        if follow and not rec.finished:
            return self.follow(job_id, on_line)
        nodes = ran_on(rec, self.state.nodes(rec.cluster))
        if nodes and rec.status != "pending" and not rec.detail.get("managed"):
            for node in nodes:
                folder = run_dir(node, rec)
                done = self._agent(
                    node, "follow", "--once", "--tail", str(logtail.LINES), folder, timeout=300
                )
                if cut := logtail.skipped(done.stderr):
                    on_line(node.index, logtail.left_out(cut, f"{folder}/node.log on the node"))
                for line in done.stdout.splitlines():
                    on_line(node.index, line)
            return self.refresh(job_id)
        copies = sorted((self.home / "logs" / job_id).glob("node-*.log"))
        if not copies:
            raise NotFoundError(f"job {job_id}: no logs left (its cluster {rec.cluster!r} is gone)")
        for copy in copies:
            index = int(copy.stem.split("-")[1])
            text, cut = logtail.read(copy)
            if cut:
                on_line(index, logtail.left_out(cut, str(copy)))
            for line in text.splitlines():
                on_line(index, line)
        return rec

    def pull_checkpoints(
        self, job_id: str, *, lost: int | None = None, nodes: Sequence[NodeInfo] | None = None
    ) -> Path | None:
        """Copy the checkpoint folder of `job_id` on its first node (or, when node `lost` is
        the first, on the next one: every node's local rank 0 writes its own copy; an fsdp
        job's shards from every node, `Kept.pull_sharded`) to the user's machine
        (`cloudtrain.jobs.checkpoints`), then a new snapshot to the job's bucket if it has one;
        the newest snapshot kept (an fsdp job's: the newest that holds a complete checkpoint,
        `shards.newest_usable`), or None. A node or a bucket that does not answer is logged,
        not raised: the snapshot before it stands (an unpushed one is pushed next time)."""
        from cloudtrain.errors import CloudtrainError

        rec = self._job(job_id)
        keep = rec.detail.get("checkpoint_keep") or checkpoints.KEEP
        kept = checkpoints.Kept(self.home, job_id, keep=keep)
        found = self.state.nodes(rec.cluster) if nodes is None else nodes  # or where they went
        nodes = [n for n in ran_on(rec, found) if n.index != lost]
        newest = kept.newest()

        def warn(index: int, exc: Exception) -> None:
            log.warning("could not copy the checkpoints of %s from node %d: %s", job_id,
                        index, exc)  # fmt: skip

        override = rec.detail.get("checkpoint_dir")
        sharded = (rec.detail.get("spec") or {}).get("strategy") == "fsdp"
        if nodes and sharded:
            sources = [
                (n.index, self._executor(n), checkpoints.node_folder(n.root, job_id, override))
                for n in nodes
            ]
            newest = kept.pull_sharded(sources, warn)
        elif nodes:
            head = nodes[0]
            try:
                newest = kept.pull(
                    self._executor(head), checkpoints.node_folder(head.root, job_id, override)
                )
            except (CommandError, ProviderError, OSError) as exc:
                warn(head.index, exc)
        url = rec.detail.get("checkpoint_url")
        if url and newest is not None:
            try:
                kept.push(checkpoints.bucket_of(url), sharded=sharded)
            except (CloudtrainError, OSError) as exc:
                log.warning("could not copy the checkpoints of %s to %s: %s", job_id, url, exc)
        if sharded:  # a lost node's last copy and the survivors' newer shards may not make one
            return shards.newest_usable(kept.snapshots())
        return newest

    def archive_logs(self, cluster: str, nodes: Sequence[NodeInfo] | None = None) -> None:
        """Copy every job's node logs of `cluster` to ``<home>/logs`` (before a teardown), from
        `nodes` when given (a self-stopped cluster's folders, `cloudtrain.jobs.selfstopped`)."""
        nodes = self.state.nodes(cluster) if nodes is None else nodes
        for rec in self.state.jobs(cluster):
            self.pull_metrics(rec, nodes)
            if rec.detail.get("managed"):
                continue  # its watcher keeps the copy of every attempt
            copy_dir = self.home / "logs" / rec.id
            for node in ran_on(rec, nodes):
                copy_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                try:  # as it comes, bounded: a node's log may be as long as it likes
                    with received.log_copy(copy_dir / f"node-{node.index}.log") as write:
                        args = ("follow", "--once", run_dir(node, rec))
                        self._agent(node, *args, timeout=300, on_output=write)
                except (CommandError, ProviderError) as exc:
                    log.warning(
                        "could not copy the logs of %s from node %d: %s", rec.id, node.index, exc
                    )
        jobs = self.state.jobs(cluster)
        if jobs:  # the nodes' checkpoint folders hold the newest job's last checkpoint
            self.pull_checkpoints(max(jobs, key=lambda r: r.seq).id, nodes=nodes)

    # -- stopping ---------------------------------------------------------------------------

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

    def cancel(self, job_id: str) -> JobRecord:
        """Stop every rank of the job on every node; blocks until they are gone. Idempotent."""
        rec = self._job(job_id)
        if rec.finished:
            return rec
        nodes = self._job_nodes(rec)
        self._stop(rec, nodes, mark=True)
        statuses = fan_out(lambda n: self._status(n, rec), nodes)
        verdict = self._verdict(rec, nodes, statuses)
        if verdict is None:
            return self._job(rec.id)
        return self.record(rec, verdict, ended_at=last_end(statuses))

    def stop(
        self, job_id: str, nodes: Sequence[NodeInfo] | None = None, *, mark: bool = False
    ) -> None:
        """Stop the job's current attempt on `nodes` (default: its cluster's), recording
        nothing; `mark` marks it cancelled on each node first. A managed job's watcher stops
        the rest of a broken attempt this way before it recovers the job."""
        rec = self._job(job_id)
        self._stop(rec, self._job_nodes(rec) if nodes is None else nodes, mark=mark)

    def raise_for_status(self, rec: JobRecord) -> JobRecord:
        """`rec` when it succeeded; `JobError` saying how it ended otherwise."""
        if rec.status == "succeeded":
            return rec
        if rec.status == "cancelled":
            raise JobError(rec.id, "cancelled", cancelled=True)
        if not rec.finished:  # its nodes went silent, or went away, without a verdict
            again = f"`cloudtrain logs {rec.id} -f` follows it again"
            raise JobError(rec.id, f"{rec.status}: its nodes did not say how it ended; {again}")
        node, reason = rec.detail.get("failed_node"), rec.detail.get("reason")
        said = [f"node {node}" if node is not None else "", str(reason or "")]
        raise JobError(rec.id, " ".join(["failed:", *filter(None, said)]).rstrip(":"))
