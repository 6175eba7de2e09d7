"""What cloudtrain knows about torchrun: the command for one node, and reading its failures.

The command is the documented torchrun interface (``python -m torch.distributed.run``, or the
same flags to `cloudtrain.jobs.warm`: `cloudtrain.jobs.elastic`, torchrun with workers forked
from its agent, the agent itself forked by the node's warm server when it has one) with the
c10d rendezvous hosted by the head node's agent, through cloudtrain's backend
(`cloudtrain.jobs.rendezvous`), whose stores listen on the head's private address only.
`--rdzv-conf is_host=` and `--local-addr` are given explicitly: agents that share a hostname
(the local provider's nodes, or VMs with identical hostnames) otherwise guess the store host
from the hostname and hang.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from cloudtrain.errors import ConfigError
from cloudtrain.jobs import rendezvous, spawned
from cloudtrain.model import NodeInfo

_PYTHON = re.compile(r"(.*/)?python(3(\.\d+)?)?")
_AGENT_TRACEBACK_END = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
_ROOT_CAUSE = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")


def entrypoint_args(entrypoint: Sequence[str]) -> list[str]:
    """torchrun's trailing arguments for an entrypoint: ``[script, args]``,
    ``[--module, mod, args]`` or ``[--no-python, cmd, args]``; a leading ``python`` is dropped
    (torchrun runs the script with its own interpreter)."""
    tokens = list(entrypoint)
    if tokens and _PYTHON.fullmatch(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        raise ConfigError("the job has nothing to run: give a script (train.py) or a run: command")
    if tokens[0] == "-m":
        return ["--module", *tokens[1:]]
    if tokens[0].endswith(".py"):
        return tokens
    return ["--no-python", *tokens]


def forks(start_method: str, args: Sequence[str]) -> bool:
    """Whether a job's agent forks its workers (`cloudtrain.jobs.elastic`), and is itself
    forked by the node's warm server when there is one (`cloudtrain.jobs.warm`): a Python
    entrypoint under ``--start-method fork``."""
    return start_method == "fork" and args[:1] != ["--no-python"]


#: How long an elastic job's rendezvous waits for more nodes once it has its minimum.
ELASTIC_LAST_CALL_S = 5
#: The restarts an elastic job gets at least: its survivors re-form by restarting.
ELASTIC_MIN_RESTARTS = 3


def rendezvous_first(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    """`nodes` with the one to host the rendezvous first: the lowest index of the on-demand
    nodes when some are spot (the store dies with its host, and the job with it), else the
    lowest index."""
    ordered = sorted(nodes, key=lambda n: n.index)
    stable = [n for n in ordered if not n.extra.get("spot")]
    head = (stable or ordered)[0]
    return [head, *(n for n in ordered if n is not head)]


@dataclass(frozen=True)
class Launch:
    """One node's share of a job."""

    python: str
    num_nodes: int
    nproc_per_node: int
    head: str  # "ip:port" of the rendezvous store, on the head node
    job_id: str
    is_head: bool
    local_addr: str
    max_restarts: int
    args: Sequence[str]
    #: an elastic job goes on while this many nodes are left (torchrun's ``--nnodes MIN:MAX``)
    min_nodes: int | None = None
    #: how the workers start: ``fork`` from the agent, which imported torch already
    #: (`cloudtrain.jobs.elastic`, through `cloudtrain.jobs.warm`), or ``spawn``, new
    #: interpreters (torchrun itself)
    start_method: str = "fork"

    def argv(self) -> list[str]:
        nnodes = str(self.num_nodes)
        conf = f"is_host={int(self.is_head)}"
        if self.min_nodes is not None:
            nnodes = f"{self.min_nodes}:{self.num_nodes}"
            # the survivors of a lost node form the next round after this many seconds
            conf += f",last_call_timeout={ELASTIC_LAST_CALL_S}"
        python = self.args[:1] != ["--no-python"]
        forked = forks(self.start_method, self.args)
        launcher = ["cloudtrain.jobs.warm", "--start-method", "fork"] if forked else [
            "torch.distributed.run"]  # fmt: skip
        args = list(self.args)
        if python and not forked:  # spawned workers run the script through the import guard
            args = ["-m", spawned.__name__, *args]
        return [
            self.python, "-m", *launcher,
            "--nnodes", nnodes,
            "--nproc-per-node", str(self.nproc_per_node),
            "--rdzv-backend", rendezvous.BACKEND,
            "--rdzv-endpoint", self.head,
            "--rdzv-id", self.job_id,
            "--rdzv-conf", conf,
            "--local-addr", self.local_addr,
            "--max-restarts", str(self.max_restarts),
            *args,
        ]  # fmt: skip


#: What a rank prints when the machine, not the script, failed it: the GPU's memory (ECC), the
#: GPU gone from the bus, the driver's Xid reports, NCCL's own system errors, a bus error.
HARDWARE = re.compile(
    r"uncorrectable ECC error|ECC_UNCORRECTABLE|cudaErrorECCUncorrectable|fallen off the bus"
    r"|\bNVRM: Xid\b|NCCL error.*unhandled system error|\bBus error\b",
    re.IGNORECASE,
)
#: A worker killed by SIGBUS (a bad page of memory) reports this exit code.
SIGBUS_EXIT = -7


@dataclass(frozen=True)
class Failure:
    """A failed node's log, with torchrun's own traceback taken out. `hardware`: the log
    says the machine failed the rank (`HARDWARE`), a managed job's watcher recovers it as
    it recovers a lost node."""

    tail: str
    rank: int | None = None
    worker_exit: int | None = None
    hardware: bool = False

    def killed_by(self, agent_exit: int | None) -> int | None:
        """The signal that ended the attempt on this node, if one did: the rank's (torchrun
        reports ``exitcode: -N``), else the launcher's own (the node's shell records 128+N for
        it, and no rank is reported: it did not get to report). None for an exit of its own."""
        if self.worker_exit is not None:
            return -self.worker_exit if self.worker_exit < 0 else None
        if agent_exit is not None and 128 < agent_exit < 128 + signal.NSIG:
            return agent_exit - 128
        return None

    def reason(self, agent_exit: int | None, *, oom_kills: int | None = None) -> str:
        """What ended the node's part, for the job's record: `agent_exit`, the launcher's code,
        and a signal that killed a rank or the launcher by name; for SIGKILL, whether the
        kernel's OOM killer did it, as far as `oom_kills` (the node's count of them while the
        attempt ran, `cloudtrain.node.oom`; None: not known) tells."""
        if agent_exit is None:
            return "its processes vanished"
        number = self.killed_by(agent_exit)
        if number is not None:
            who = (
                "its launcher"
                if self.worker_exit is None
                else (f"rank {self.rank}" if self.rank is not None else "a rank")
            )
            why = _why_killed(oom_kills) if number == signal.SIGKILL else ""
            return f"exited {agent_exit}: {who} was killed by {signal_name(number)}{why}"
        if self.worker_exit is not None and self.rank is not None:
            return f"exited {agent_exit} (rank {self.rank} exited {self.worker_exit})"
        return f"exited {agent_exit}"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 64`` for a number with no name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _why_killed(oom_kills: int | None) -> str:
    if oom_kills is None:
        return " (out of memory, or another process: the node's memory cgroup does not say)"
    if oom_kills > 0:
        return " (out of memory: the kernel's OOM killer)"
    return " (not by the OOM killer, which counted no kill in the node's memory cgroup)"


def read_failure(log_tail: str, lines: int = 20) -> Failure:
    """Drop the agent's ChildFailedError traceback and its boxed report (keeping the failed
    rank and its exit code from it), so what is left is what the training script printed."""
    kept: list[str] = []
    rank = worker_exit = None
    skipping = False
    for line in log_tail.splitlines():
        if line.startswith("Traceback (most recent call last):"):
            skipping = True  # the agent's traceback or the script's: decided at its end
            block = [line]
            continue
        if skipping:
            block.append(line)
            if line.startswith(_AGENT_TRACEBACK_END):
                skipping = False  # the agent's: drop it and what follows up to the report
            elif not line.startswith((" ", "\t")):
                skipping = False  # the script's own traceback ended: keep it
                kept.extend(block)
            continue
        match = _ROOT_CAUSE.match(line)
        if match:
            value = int(match.group(2))
            if match.group(1) == "rank":
                rank = value if rank is None else rank
            else:
                worker_exit = value if worker_exit is None else worker_exit
            continue
        if (
            line.startswith(("====", "----"))
            or line.strip().endswith(" FAILED")
            or re.match(
                r"^\s*(Failures:|<NO_OTHER_FAILURES>|Root Cause|\[\d+\]:|time\s*:|host\s*:|"
                r"error_file\s*:|traceback\s*:)",
                line,
            )
        ):
            continue
        kept.append(line)
    if skipping:
        kept.extend(block)
    hardware = bool(HARDWARE.search(log_tail)) or worker_exit == SIGBUS_EXIT
    return Failure("\n".join(kept[-lines:]), rank, worker_exit, hardware)
