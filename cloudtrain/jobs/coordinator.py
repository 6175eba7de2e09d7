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
                  └───────► cancelled     `cancel`, or an interrupted start
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cloudtrain.errors import CommandError, JobError, NotFoundError, ProviderError
from cloudtrain.executors.base import SSH_FAILED, Executor, RunResult, fan_out
from cloudtrain.jobs import checkpoints
from cloudtrain.jobs.torchrun import Launch, entrypoint_args, read_failure
from cloudtrain.model import NodeInfo
from cloudtrain.provision.provider import Provider
from cloudtrain.state import JobRecord, State

log = logging.getLogger(__name__)

OnLine = Callable[[int, str], None]
KILL_GRACE_S = 10.0
#: How often a followed job's checkpoints are copied to the user's machine.
CHECKPOINT_PULL_S = 30.0


@dataclass(frozen=True)
class JobSpec:
    """What to run: `entrypoint` is a script and its arguments (``train.py --epochs 3``),
    ``-m module ...``, or any command; a leading ``python`` is dropped (torchrun runs it)."""

    entrypoint: tuple[str, ...]
    workdir: Path | None = None
    setup: str | None = None
    envs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    nproc_per_node: int | None = None
    max_restarts: int = 0
    name: str | None = None
    #: a job whose newest kept checkpoint every node gets before this one starts
    resume_from: str | None = None


def _job_dir(node: NodeInfo, job_id: str) -> str:
    return f"{node.root}/jobs/{job_id}"


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


class Coordinator:
    """Jobs on the clusters in `state`, reached through `provider`'s executors."""

    def __init__(self, state: State, provider: Provider, *, home: Path) -> None:
        self.state = state
        self.provider = provider
        self.home = home
        self._executors: dict[str, Executor] = {}

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
        for ex in self._executors.values():
            ex.close()
        self._executors.clear()

    # -- starting ---------------------------------------------------------------------------

    def submit(self, cluster: str, job: JobSpec, on_line: OnLine | None = None) -> JobRecord:
        """Start `job` on every node of `cluster` and return once all of them run it.

        Blocks for the sync, setup and start; not for the training. Holds the cluster's lock
        while it starts the job (`cloudtrain.locks`: an `up` or `down` of the cluster waits).
        Raises `CommandError` when setup fails on a node, `NotFoundError` for an unknown
        cluster. On any failure (or Ctrl-C) the ranks already started are stopped and the job
        is recorded as such."""
        from cloudtrain import locks

        with locks.cluster_lock(self.home, cluster, "train", on_wait=log.warning):
            return self._submit(cluster, job, on_line)

    def _submit(self, cluster: str, job: JobSpec, on_line: OnLine | None) -> JobRecord:
        record = self.state.cluster(cluster)
        if record is None:
            raise NotFoundError(f"no cluster named {cluster!r}; `cloudtrain status` lists them")
        spec = record.spec
        resume = None  # checked before anything is made: a job with nothing kept is an error
        if job.resume_from:
            resume = checkpoints.Kept(self.home, job.resume_from).required()
        nodes = self._live_nodes(cluster, spec.num_nodes)
        nproc = job.nproc_per_node or spec.resources.count or 1
        args = entrypoint_args(job.entrypoint)
        name = job.name or Path(job.entrypoint[0]).stem or "job"
        rec = self.state.new_job(
            cluster, name, num_nodes=len(nodes), nproc_per_node=nproc, command=list(args)
        )
        self.state.add_event(
            cluster, "job", f"job {rec.id} submitted: {shlex.join(args)}", job_id=rec.id
        )
        override = job.envs.get(checkpoints.CHECKPOINT_ENV)
        self.state.update_job(rec.id, detail={"checkpoint_dir": override})
        try:
            fan_out(lambda n: self._sync(n, job.workdir), nodes)
            if resume is not None:
                fan_out(lambda n: self._executor(n).put(
                    resume, checkpoints.node_folder(n.root, override)), nodes)  # fmt: skip
            setup = job.setup
            if setup:
                fan_out(lambda n: self._setup(n, setup, job.envs, on_line), nodes)
            head = nodes[0]
            port = int(self._agent(head, "port").check().stdout.strip())
            # The head first: under c10d torchrun ranks nodes by (address, pid), so on nodes that
            # share an address (the local provider) this makes global rank 0 the head's.
            pids = [self._start(rec, head, nodes, nproc, args, port, job)]
            pids += fan_out(lambda n: self._start(rec, n, nodes, nproc, args, port, job), nodes[1:])
        except BaseException as exc:
            self._stop(rec.id, nodes, mark=True)
            status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
            self.state.update_job(
                rec.id,
                status=status,
                ended_at=time.time(),
                detail={"error": f"{type(exc).__name__}: {exc}"},
            )
            raise
        detail = {
            "head": f"{head.private_ip}:{port}",
            "nodes": [
                {"index": n.index, "node_id": n.node_id, "pid": p}
                for n, p in zip(nodes, pids, strict=True)
            ],
        }
        self.state.update_job(rec.id, status="running", started_at=time.time(), detail=detail)
        self.state.add_event(
            cluster, "job", f"job {rec.id} running on {len(nodes)} node(s)", job_id=rec.id
        )
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
        if workdir is not None:
            self._executor(node).put(workdir, _workdir(node))
        else:
            self._executor(node).run(["mkdir", "-p", _workdir(node)]).check()

    def _setup(
        self, node: NodeInfo, setup: str, envs: Mapping[str, str], on_line: OnLine | None
    ) -> None:
        """Run the setup script on `node`, skipped when the same script (and environment)
        already succeeded there: a hash of both is kept in ``<node root>/setup.sha256``."""
        digest = hashlib.sha256(json.dumps([setup, sorted(envs.items())]).encode()).hexdigest()
        marker = f"{node.root}/setup.sha256"
        ex = self._executor(node)
        if ex.run(["cat", marker]).stdout.strip() == digest:
            return
        emit = (lambda line: on_line(node.index, line)) if on_line else None
        ex.run(in_python_env(node, setup), cwd=_workdir(node), env=dict(envs),
               on_output=emit).check()  # fmt: skip
        ex.run(["/bin/sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", digest, marker]).check()

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
            }
        )
        env.setdefault("CLOUDTRAIN_CHECKPOINT_DIR", f"{node.root}/checkpoints")
        if "CLOUDTRAIN_CHECKPOINT_DIR" in job.envs:
            env["CLOUDTRAIN_CHECKPOINT_DIR"] = job.envs["CLOUDTRAIN_CHECKPOINT_DIR"]
        return env

    def _fabric(self, node: NodeInfo) -> dict[str, str]:
        """The NCCL settings the node's bootstrap wrote for its network (``<root>/nccl.env``:
        EFA, InfiniBand, the interface); none when there is no such file."""
        done = self._executor(node).run(["cat", f"{node.root}/nccl.env"], timeout=60)
        if done.returncode != 0:
            return {}
        words = shlex.split(done.stdout, comments=True)
        return dict(w.split("=", 1) for w in words if "=" in w)

    def _start(
        self,
        rec: JobRecord,
        node: NodeInfo,
        nodes: Sequence[NodeInfo],
        nproc: int,
        args: Sequence[str],
        port: int,
        job: JobSpec,
    ) -> int:
        head = nodes[0]
        argv = Launch(
            python=node.python,
            num_nodes=len(nodes),
            nproc_per_node=nproc,
            head=f"{head.private_ip}:{port}",
            job_id=rec.id,
            is_head=node.index == head.index,
            local_addr=node.private_ip or "",
            max_restarts=job.max_restarts,
            args=args,
        ).argv()
        return self._executor(node).start_detached(
            argv,
            env=self._env(rec, node, nodes, job),
            cwd=_workdir(node),
            job_dir=_job_dir(node, rec.id),
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
        return nodes

    def _status(self, node: NodeInfo, job_id: str) -> dict[str, Any]:
        """The job's state on `node` as its agent reads it, or ``{"unreachable": why}`` when
        the node cannot be reached (the job may still run there)."""
        try:
            done = self._agent(node, "status", _job_dir(node, job_id))
        except ProviderError as exc:  # could not (re)connect
            return _unreachable(str(exc))
        if done.returncode == SSH_FAILED:  # the connection broke; the agent never exits 255
            return _unreachable(done.stderr.strip().splitlines()[-1:] or ["connection lost"])
        return dict(json.loads(done.check().stdout))

    def _note_preemptions(
        self, rec: JobRecord, nodes: Sequence[NodeInfo], statuses: Sequence[Mapping[str, Any]]
    ) -> None:
        """A node whose cloud announced its preemption (its agent recorded the notice) is an
        event of the job, once per node."""
        known = dict(rec.detail.get("preemptions") or {})
        for node, status in zip(nodes, statuses, strict=True):
            notice = status.get("preemption")
            if not notice or str(node.index) in known:
                continue
            known[str(node.index)] = notice
            when = f" at {notice['not_before']}" if notice.get("not_before") else ""
            self.state.add_event(
                rec.cluster, "preemption",
                f"job {rec.id}: node {node.index}'s cloud will {notice.get('action')} it{when} "
                f"({notice.get('source')} notice); the job was told to checkpoint",
                job_id=rec.id,
            )  # fmt: skip
            self.state.update_job(rec.id, detail={"preemptions": known})

    def _read_log(self, node: NodeInfo, job_id: str, tail: int | None = None) -> str:
        args = ["follow", "--once", _job_dir(node, job_id)]
        if tail is not None:
            args[2:2] = ["--tail", str(tail)]
        return self._agent(node, *args, timeout=300).stdout

    def refresh(self, job_id: str) -> JobRecord:
        """Read the job's state from its nodes and record it. Idempotent; blocks for one round
        trip to every node."""
        rec = self._job(job_id)
        if rec.finished:
            return rec
        nodes = self._job_nodes(rec)
        statuses = fan_out(lambda n: self._status(n, job_id), nodes)
        return self._conclude(rec, nodes, statuses)

    def _conclude(
        self,
        rec: JobRecord,
        nodes: Sequence[NodeInfo],
        statuses: Sequence[Mapping[str, Any]],
        *,
        lost: Mapping[int, str] | None = None,
    ) -> JobRecord:
        """Record each node's state and, once no node runs the job, its outcome. A node that
        cannot be reached keeps the job open, unless `lost` says its host went away while
        the job was followed (then the job failed there)."""
        lost = lost or {}
        states = [node_state(s) for s in statuses]
        self.state.update_job(rec.id, detail={"nodes": states})
        self._note_preemptions(rec, nodes, statuses)
        if any(s["state"] == "running" for s in states):
            return self._job(rec.id)
        gone = [(n, s) for n, s in zip(nodes, states, strict=True) if s["state"] == "unreachable"]
        if any(n.index not in lost for n, _ in gone):
            return self._job(rec.id)  # cannot tell yet
        if gone:
            node, why = gone[0][0], lost[gone[0][0].index]
            return self._fail(rec, node, -1, f"went away ({why})", "")
        codes = [s["exit_code"] for s in statuses]
        now = time.time()
        if any(s["cancelled"] for s in statuses):
            self.state.update_job(
                rec.id, status="cancelled", ended_at=now, exit_code=_first_nonzero(codes)
            )
            self.state.add_event(rec.cluster, "job", f"job {rec.id} cancelled", job_id=rec.id)
            return self._job(rec.id)
        failed = [
            (s.get("ended") or now, n, c)
            for n, s, c in zip(nodes, statuses, codes, strict=True)
            if c != 0
        ]
        if not failed:
            self.state.update_job(rec.id, status="succeeded", exit_code=0, ended_at=now)
            self.state.add_event(rec.cluster, "job", f"job {rec.id} succeeded", job_id=rec.id)
            return self._job(rec.id)
        _, node, code = min(failed, key=lambda f: (f[0], f[1].index))
        failure = read_failure(self._read_log(node, rec.id, tail=80))
        return self._fail(rec, node, code, failure.reason(code), failure.tail)

    def _fail(
        self, rec: JobRecord, node: NodeInfo, code: int | None, reason: str, tail: str
    ) -> JobRecord:
        self.state.update_job(
            rec.id,
            status="failed",
            exit_code=code if code is not None else -1,
            ended_at=time.time(),
            detail={"failed_node": node.index, "reason": reason, "log_tail": tail},
        )
        self.state.add_event(
            rec.cluster, "job", f"job {rec.id} failed: node {node.index} {reason}", job_id=rec.id
        )
        return self._job(rec.id)

    def follow(self, job_id: str, on_line: OnLine) -> JobRecord:
        """Stream every node's log to `on_line(node_index, line)` until the job ends, keep a
        copy under ``<home>/logs/<job>/``, and record the outcome. When a node fails, the
        others are stopped. Blocks; a KeyboardInterrupt stops following and leaves the job."""
        rec = self._job(job_id)
        nodes = self._job_nodes(rec)
        stop_once = threading.Lock()
        lost: dict[int, str] = {}

        def watch(node: NodeInfo) -> None:
            copy_dir = self.home / "logs" / job_id
            copy_dir.mkdir(parents=True, exist_ok=True)
            with open(copy_dir / f"node-{node.index}.log", "w") as copy:

                def emit(line: str) -> None:
                    copy.write(line + "\n")
                    on_line(node.index, line)

                with contextlib.suppress(ProviderError):  # unreachable: the status says so
                    self._agent(node, "follow", _job_dir(node, job_id), timeout=None,
                                on_output=emit)  # fmt: skip
            status = self._status(node, job_id)
            if "unreachable" in status:
                lost[node.index] = status["unreachable"]
            failed = status["exit_code"] != 0 and not status["cancelled"]
            if failed and stop_once.acquire(blocking=False):
                log.info("job %s: node %d %s; stopping the others", job_id, node.index,
                         node_state(status)["state"])  # fmt: skip
                others = [n for n in nodes if n is not node and n.index not in lost]
                self._stop(job_id, others, mark=False)

        threads = [threading.Thread(target=watch, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        next_pull = time.monotonic() + CHECKPOINT_PULL_S
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.2)
            if time.monotonic() > next_pull:  # brought up to date while the job runs
                self.pull_checkpoints(job_id)
                next_pull = time.monotonic() + CHECKPOINT_PULL_S
        self.pull_checkpoints(job_id)
        rec = self._job(job_id)
        if rec.finished:
            return rec
        statuses = fan_out(lambda n: self._status(n, job_id), nodes)
        return self._conclude(rec, nodes, statuses, lost=lost)

    def logs(self, job_id: str, on_line: OnLine, *, follow: bool = False) -> JobRecord:
        """Print a job's logs from its nodes (or the copy kept when its cluster is gone)."""
        rec = self._job(job_id)
        if follow and not rec.finished:
            return self.follow(job_id, on_line)
        nodes = self.state.nodes(rec.cluster)
        if nodes and rec.status != "pending":
            for node in nodes:
                for line in self._read_log(node, job_id).splitlines():
                    on_line(node.index, line)
            return self.refresh(job_id)
        copies = sorted((self.home / "logs" / job_id).glob("node-*.log"))
        if not copies:
            raise NotFoundError(f"job {job_id}: no logs left (its cluster {rec.cluster!r} is gone)")
        for copy in copies:
            index = int(copy.stem.split("-")[1])
            for line in copy.read_text().splitlines():
                on_line(index, line)
        return rec

    def pull_checkpoints(self, job_id: str) -> Path | None:
        """Copy the head node's checkpoint folder of `job_id` to the user's machine
        (`cloudtrain.jobs.checkpoints`); the newest snapshot kept, or None. A node that does
        not answer is logged, not raised: the snapshot before it stands."""
        rec = self._job(job_id)
        nodes = self.state.nodes(rec.cluster)
        if not nodes:
            return checkpoints.Kept(self.home, job_id).newest()
        head = nodes[0]
        remote = checkpoints.node_folder(head.root, rec.detail.get("checkpoint_dir"))
        try:
            return checkpoints.Kept(self.home, job_id).pull(self._executor(head), remote)
        except (CommandError, ProviderError, OSError) as exc:
            log.warning("could not copy the checkpoints of %s from node 0: %s", job_id, exc)
            return checkpoints.Kept(self.home, job_id).newest()

    def archive_logs(self, cluster: str) -> None:
        """Copy every job's node logs of `cluster` to ``<home>/logs`` (before a teardown)."""
        nodes = self.state.nodes(cluster)
        for rec in self.state.jobs(cluster):
            copy_dir = self.home / "logs" / rec.id
            for node in nodes:
                try:
                    out = self._read_log(node, rec.id)
                except (CommandError, ProviderError) as exc:
                    log.warning(
                        "could not copy the logs of %s from node %d: %s", rec.id, node.index, exc
                    )
                    continue
                if out:
                    copy_dir.mkdir(parents=True, exist_ok=True)
                    (copy_dir / f"node-{node.index}.log").write_text(out)
        jobs = self.state.jobs(cluster)
        if jobs:  # the nodes' checkpoint folders hold the newest job's last checkpoint
            self.pull_checkpoints(max(jobs, key=lambda r: r.seq).id)

    # -- stopping ---------------------------------------------------------------------------

    def _stop(self, job_id: str, nodes: Sequence[NodeInfo], *, mark: bool) -> None:
        """Stop the job's processes on `nodes` (TERM, then KILL after the grace); with `mark`,
        the job is marked cancelled on each node first."""

        def stop(node: NodeInfo) -> None:
            args = [
                "kill",
                "--match",
                f"CLOUDTRAIN_JOB_ID={job_id}",
                "--match",
                f"CLOUDTRAIN_NODE_ROOT={node.root}",
                "--grace",
                str(KILL_GRACE_S),
                "--job-dir",
                _job_dir(node, job_id),
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
        self._stop(job_id, nodes, mark=True)
        statuses = fan_out(lambda n: self._status(n, job_id), nodes)
        return self._conclude(rec, nodes, statuses)

    def raise_for_status(self, rec: JobRecord) -> JobRecord:
        """`rec` when it succeeded; `JobError` saying how it ended otherwise."""
        if rec.status == "succeeded":
            return rec
        if rec.status == "cancelled":
            raise JobError(rec.id, "cancelled", cancelled=True)
        where = f"node {rec.detail.get('failed_node')} {rec.detail.get('reason', '')}".strip()
        raise JobError(rec.id, f"failed: {where}")


def _unreachable(why: str | Sequence[str]) -> dict[str, Any]:
    text = why if isinstance(why, str) else " ".join(why)
    return {"unreachable": text, "exit_code": None, "alive": False, "cancelled": False}


def node_state(status: Mapping[str, Any]) -> dict[str, Any]:
    """One node's part in a job, for `status`: ``running``, ``exited`` (with its code),
    ``cancelled``, ``vanished`` (no process and no exit code) or ``unreachable``."""
    if "unreachable" in status:
        return {"state": "unreachable", "exit_code": None, "why": status["unreachable"]}
    code = status["exit_code"]
    if code is None:
        state = "running" if status["alive"] else "vanished"
    else:
        state = "cancelled" if status["cancelled"] else "exited"
    found = {"state": state, "exit_code": code}
    if status.get("preemption"):
        found["preempted"] = True
    return found


def _first_nonzero(codes: Sequence[int | None]) -> int | None:
    return next((c for c in codes if c not in (0, None)), None)
