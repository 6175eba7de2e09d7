"""What a job is, and how one attempt of it ended: the values the coordinator and a managed
job's watcher share, and the one decision both make (`judge`).

A job runs as attempts: the first in ``<node root>/jobs/<id>/``, each recovery of a managed job
in ``jobs/<id>.<n>`` (`job_dir`), with the rendezvous ``<id>.<n>``. Every node reports its part
through the node agent (`node_state`); `judge` turns those parts into a `Verdict` once no node
runs the attempt.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeGuard

from cloudtrain.errors import ConfigError
from cloudtrain.jobs import checkpoints
from cloudtrain.jobs.torchrun import Failure
from cloudtrain.model import NodeInfo
from cloudtrain.state import JobRecord

#: How often a followed job's checkpoints are copied to the user's machine.
CHECKPOINT_PULL_S = 30.0


#: How often a followed job's nodes are asked for their part (the heartbeat).
HEARTBEAT_S = 5.0
HEARTBEAT_TIMEOUT_ENV = "CLOUDTRAIN_HEARTBEAT_TIMEOUT_S"
CHECKPOINT_PULL_ENV = "CLOUDTRAIN_CHECKPOINT_PULL_S"


def _seconds(env: str, default: float) -> float:
    raw = os.environ.get(env, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{env} {raw!r} is not a number of seconds (> 0)")
    return value


def heartbeat_timeout_s() -> float:
    """How long a followed node may not answer before it counts as lost
    (``$CLOUDTRAIN_HEARTBEAT_TIMEOUT_S``, default 60 s)."""
    return _seconds(HEARTBEAT_TIMEOUT_ENV, 60.0)


def checkpoint_pull_s() -> float:
    """How often a followed job's checkpoints come home (``$CLOUDTRAIN_CHECKPOINT_PULL_S``)."""
    return _seconds(CHECKPOINT_PULL_ENV, CHECKPOINT_PULL_S)


@dataclass(frozen=True)
class Verdict:
    """How one attempt of a job ended. `cause`: ``ok``, ``cancelled``, ``exit`` (a rank's own
    non-zero exit, a signal it raised itself included: SIGSEGV, SIGABRT ...), ``killed`` (a
    rank or its launcher killed by SIGKILL from outside the script: the kernel's OOM killer
    most often, which `reason` names when the node could tell), or a node's loss:
    ``vanished`` (its processes were killed with no exit recorded), ``lost`` (its host stopped
    answering), ``preempted`` (its cloud said so), ``hardware`` (a rank died of what the
    machine did: an ECC error, a GPU off the bus ...)."""

    status: str  # succeeded | failed | cancelled
    cause: str
    node: int | None = None
    exit_code: int | None = None
    reason: str = ""
    tail: str = ""

    @property
    def lost_node(self) -> bool:
        """The attempt ended because a node went away, not because of what the script did."""
        return self.cause in ("vanished", "lost", "preempted", "hardware")

    @property
    def recoverable(self) -> bool:
        """A managed job starts again after it by default (no ``--retry-on-failure``): a lost
        node, or a process killed under the script. A SIGSEGV or SIGABRT is not: the same code
        on the same checkpoint most often crashes again, spending the budget."""
        return self.lost_node or self.cause == "killed"


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
    #: how many of the cluster's nodes run it (default: all)
    num_nodes: int | None = None
    #: an elastic job (``--nodes MIN:MAX``) goes on while this many of its nodes are left
    min_nodes: int | None = None
    name: str | None = None
    #: a job whose newest kept checkpoint every node gets before this one starts
    resume_from: str | None = None
    #: a bucket (``s3://BUCKET/PREFIX``) that keeps the job's checkpoints too; a `resume_from`
    #: job that this home keeps nothing of is restored from it (`cloudtrain.jobs.buckets`)
    checkpoint_url: str | None = None
    #: how many of the newest checkpoints are kept, here and in the bucket
    checkpoint_keep: int = checkpoints.KEEP
    #: what starts the processes on each node, and a torch job's strategy (ddp, fsdp):
    #: `cloudtrain.spec.frameworks`
    runtime: str = "torch"
    strategy: str | None = None
    #: how a torch job's workers start (`cloudtrain.jobs.elastic`): fork or spawn
    start_method: str = "fork"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the job's record (a managed job's watcher starts it again)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["entrypoint"] = list(self.entrypoint)
        data["workdir"] = None if self.workdir is None else str(self.workdir)
        data["envs"] = dict(self.envs)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["entrypoint"] = tuple(values.get("entrypoint") or ())
        if values.get("workdir") is not None:
            values["workdir"] = Path(values["workdir"])
        values["envs"] = MappingProxyType(dict(values.get("envs") or {}))
        return cls(**values)


def job_dir(node: NodeInfo, job_id: str, attempt: int = 0) -> str:
    """Where a job runs on `node`: ``jobs/<id>``, and ``jobs/<id>.<n>`` for the n-th recovery
    of a managed job (a fresh folder: no exit code or log of the attempt before it)."""
    return f"{node.root}/jobs/{job_id}" + (f".{attempt}" if attempt else "")


def attempt_of(rec: JobRecord) -> int:
    """Which start of the job runs now: 0, then one more for each recovery."""
    return int(rec.detail.get("attempt") or 0)


def run_dir(node: NodeInfo, rec: JobRecord) -> str:
    """Where the job's current attempt runs on `node`."""
    return job_dir(node, rec.id, attempt_of(rec))


def ran_on(rec: JobRecord, nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    """The nodes of its cluster (`nodes`) that the job's current attempt was started on: a job
    of ``--nodes 1`` on a two-node cluster is not judged by the node it never ran on. A record
    from before the attempt started (or from an older cloudtrain) names none: all of them."""
    started = set(rec.detail.get("ran_on") or ())
    if not started:
        return list(nodes)
    return [n for n in nodes if n.index in started]


def elastic(rec: JobRecord) -> bool:
    """An elastic job (``--nodes MIN:MAX``): a node lost on the way does not end it."""
    return bool((rec.detail.get("spec") or {}).get("min_nodes"))


def judge(
    rec: JobRecord,
    nodes: Sequence[NodeInfo],
    statuses: Sequence[Mapping[str, Any]],
    lost: Mapping[int, str],
    failure_of: Callable[[NodeInfo], Failure],
) -> Verdict | None:
    """How the attempt ended, from each node's status (`nodes` and `statuses` in one order);
    None while a node runs it, or cannot be told. A node that cannot be reached keeps it open,
    unless `lost` says its host went away while the job was followed (then it failed there).
    `failure_of(node)` reads a failed node's log."""
    states = [node_state(s) for s in statuses]
    if any(s["state"] == "running" for s in states):
        return None
    gone = [(n, s) for n, s in zip(nodes, states, strict=True) if s["state"] == "unreachable"]
    if any(n.index not in lost for n, _ in gone):
        return None  # cannot tell yet
    preempted = any(s.get("preemption") for s in statuses)
    codes = [s["exit_code"] for s in statuses]
    if elastic(rec) and 0 in codes and all(c in (0, None) for c in codes):
        return Verdict("succeeded", "ok", exit_code=0)  # on the nodes it had left
    if gone:
        node = gone[0][0]
        cause = "preempted" if preempted else "lost"
        return Verdict("failed", cause, node.index, -1, f"went away ({lost[node.index]})")
    if any(s["cancelled"] for s in statuses):
        return Verdict("cancelled", "cancelled", exit_code=first_nonzero(codes))
    now = time.time()
    failed = [
        (s.get("ended") or now, n, c)
        for n, s, c in zip(nodes, statuses, codes, strict=True)
        if c != 0
    ]
    if not failed:
        return Verdict("succeeded", "ok", exit_code=0)
    vanished = [n for n, st in zip(nodes, states, strict=True) if st["state"] == "vanished"]
    if vanished:  # its processes were killed under it: the cause, whatever the others said
        node, code, cause = vanished[0], None, "vanished"
    else:
        _, node, code = min(failed, key=lambda f: (f[0], f[1].index))
        cause = "exit"
    failure = failure_of(node) if code is not None else None
    if failure is not None and failure.hardware:
        cause = "hardware"
    elif failure is not None and failure.killed_by(code) == signal.SIGKILL:
        cause = "killed"
    if preempted:
        cause = "preempted"
    said = {n.index: s for n, s in zip(nodes, statuses, strict=True)}[node.index]
    oom_kills = _count(said.get("oom_kills"))
    reason = failure.reason(code, oom_kills=oom_kills) if failure else "its processes vanished"
    return Verdict("failed", cause, node.index, code, reason, failure.tail if failure else "")


def unreachable(why: str | Sequence[str]) -> dict[str, Any]:
    text = why if isinstance(why, str) else " ".join(why)
    return {"unreachable": text, "exit_code": None, "alive": False, "cancelled": False}


def on_our_clock(status: Mapping[str, Any], sent: float, received: float) -> dict[str, Any]:
    """A node's `status` with its ``ended`` (the node's clock) on this machine's clock. The
    node read its clock (``now``) between `sent` and `received`: a node clock outside that
    window is off by at least the gap, which is taken away (inside it, the clocks agree as far
    as can be told). What a node says is untrusted: an ``ended`` that is no finite number reads
    as not known (None)."""
    ended, now = status.get("ended"), status.get("now")
    found = {**status, "ended": None}
    if _finite(ended):
        found["ended"] = ended
        if _finite(now):  # > 0: the node's clock is ahead
            found["ended"] = ended - (max(0.0, now - received) - max(0.0, sent - now))
    return found


def last_end(statuses: Sequence[Mapping[str, Any]]) -> float | None:
    """When the last node of an attempt ended (``ended``, `on_our_clock`); None when a node
    cannot say (its processes vanished, it did not answer)."""
    ends = []
    for status in statuses:
        ended = status.get("ended")
        if not _finite(ended):
            return None
        ends.append(ended)
    return max(ends, default=None)


def _count(value: object) -> int | None:
    """A count a node said (untrusted): a whole number >= 0, else None (not known)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def node_state(status: Mapping[str, Any]) -> dict[str, Any]:
    """One node's part in a job, for `status`: ``running``, ``exited`` (with its code),
    ``cancelled``, ``stopped`` (no exit code: cloudtrain stopped it, after another node failed),
    ``vanished`` (no process and no exit code) or ``unreachable``."""
    if "unreachable" in status:
        return {"state": "unreachable", "exit_code": None, "why": status["unreachable"]}
    code = status["exit_code"]
    if code is None:
        # no exit code: killed under it, or by cloudtrain's own stop after another node failed
        state = "running" if status["alive"] else "stopped" if status.get("stopped") else "vanished"
    else:
        state = "cancelled" if status["cancelled"] else "exited"
    found = {"state": state, "exit_code": code}
    if status.get("preemption"):
        found["preempted"] = True
    return found


def first_nonzero(codes: Sequence[int | None]) -> int | None:
    return next((c for c in codes if c not in (0, None)), None)
