"""Runs jobs on a cluster: sync the workdir, run setup once per node, start the job's runtime
(`cloudtrain.jobs.runtimes`: torchrun, TensorFlow's or Horovod's workers) on every node detached
from this process, follow the logs and record the outcome (`cloudtrain.jobs.following`), copy
what the job makes home (`cloudtrain.jobs.pulling`), stop everything on cancel.

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

import hashlib
import json
import logging
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import CloudtrainError, ConfigError, JobError, NotFoundError
from cloudtrain.executors.base import Executor, fan_out
from cloudtrain.jobs import checkpoints, rehost, runtimes, shards, warm
from cloudtrain.jobs.attempts import JobSpec, attempt_of, job_dir, last_end
from cloudtrain.jobs.following import Following
from cloudtrain.jobs.nodes import OnLine
from cloudtrain.jobs.torchrun import entrypoint_args, rendezvous_first
from cloudtrain.model import NodeInfo
from cloudtrain.state import JobRecord

log = logging.getLogger(__name__)

__all__ = ["Coordinator", "OnLine", "in_python_env", "run_setup", "sync_workdir"]


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


class Coordinator(Following):
    """Jobs on the clusters in `state`, reached through `provider`'s executors: started here,
    followed and recorded (`cloudtrain.jobs.following`), their outputs copied home
    (`cloudtrain.jobs.pulling`), over their nodes (`cloudtrain.jobs.nodes`)."""

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
        runtime = runtimes.get(job.runtime)
        args = entrypoint_args(job.entrypoint)
        runtime.check(job, args)  # what it wires is not the user's to set, nor its flags
        if (job.num_nodes or 0) > spec.num_nodes:
            raise ConfigError(
                f"--nodes {job.num_nodes}: cluster {cluster!r} has {spec.num_nodes} node(s); "
                f"`cloudtrain up --name {cluster}` with more, or ask for fewer"
            )
        nodes = rendezvous_first(self._live_nodes(cluster, spec.num_nodes))
        nodes = nodes[: job.num_nodes or len(nodes)]
        nproc = job.nproc_per_node or runtime.workers_per_node(spec.resources.count) or 1
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
            if runtimes.get(job.runtime).installs:
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
        gpus = self._gpus(rec.cluster)
        ips = [n.private_ip or "" for n in nodes]
        env = self._node_env(node, gpus)
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

    def _gpus(self, cluster: str) -> int:
        record = self.state.cluster(cluster)
        return record.spec.resources.count if record else 0

    def _node_env(self, node: NodeInfo, gpus: int) -> dict[str, str]:
        """What every job's processes on `node` get before the job's own ``envs``."""
        env = {"PYTHONUNBUFFERED": "1"}
        if not gpus:
            env["OMP_NUM_THREADS"] = "1"
        if node.ifname:
            env["GLOO_SOCKET_IFNAME"] = node.ifname
        env.update(self._fabric(node))
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
        """Each node's command for the job's runtime (`cloudtrain.jobs.runtimes`; `nodes` in
        rank order, the head first; `port` is free on the head)."""

        def free_ports(count: int) -> list[list[int]]:
            def on(node: NodeInfo) -> list[int]:
                found = self._agent(node, "port", "--count", str(count)).check().stdout
                return [int(p) for p in found.split()]

            return fan_out(on, nodes)

        start = runtimes.Start(
            attempt_id=rec.id + (f".{attempt}" if attempt else ""),
            job=job,
            args=args,
            nodes=nodes,
            nproc=rec.nproc_per_node,
            port=port,
            free_ports=free_ports,
        )
        return runtimes.get(job.runtime).argvs(start)

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

    def prewarm(self, job_id: str, node: NodeInfo) -> None:
        """Ready `node` for the job's next start as its runtime says (`Runtime.prewarm`: a
        forked torch job's warm server), run with the job's environment. A head start only:
        a node it fails on is logged, and the job starts there as it would have."""
        rec = self._job(job_id)
        job = JobSpec.from_dict(rec.detail.get("spec") or {})
        args = runtimes.get(job.runtime).prewarm(job)
        if args is not None:
            self._ready(node, args, f"job {rec.id}", lambda: self._env(rec, node, [node], job))

    def prewarm_cluster(self, cluster: str, nodes: Sequence[NodeInfo]) -> None:
        """Ready a cluster's nodes, just up, for the jobs to come: the default runtime's
        `Runtime.prewarm` (a torch job's warm server, which imports torch while the user gets
        the prompt back), run with what every job's environment has; so the first job starts
        as warm as the next. A job whose own ``envs`` change what acts at import time starts
        cold, as it would have (`cloudtrain.jobs.warm`). A head start only, as `prewarm`;
        ``CLOUDTRAIN_WARM=0`` here (as in a job's ``envs``) readies nothing."""
        args = runtimes.get(JobSpec.runtime).prewarm(None)
        if args is None or os.environ.get(warm.SWITCH, "1") == "0":
            return
        gpus = self._gpus(cluster)

        def ready(node: NodeInfo) -> None:
            root = {"CLOUDTRAIN_NODE_ROOT": node.root}
            self._ready(node, args, f"cluster {cluster}", lambda: self._node_env(node, gpus) | root)

        fan_out(ready, nodes)

    def _ready(
        self, node: NodeInfo, args: Sequence[str], what: str, env: Callable[[], dict[str, str]]
    ) -> None:
        try:
            done = self._executor(node).run([node.python, *args], env=env(), cwd=node.root,
                                            timeout=60)  # fmt: skip
        except (CloudtrainError, OSError) as exc:
            log.info("%s: node %d not readied: %s", what, node.index, exc)
            return
        if done.returncode != 0:
            log.info("%s: node %d not readied: %s", what, node.index,
                     (done.stderr or done.stdout).strip()[-500:])  # fmt: skip

    # -- stopping ---------------------------------------------------------------------------

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
