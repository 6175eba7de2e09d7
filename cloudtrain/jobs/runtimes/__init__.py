"""A job's runtime: what starts its processes on the nodes and wires them into one job.

Each runtime is one module here with one `Runtime` subclass (``torch``: torchrun and its
elastic agent; ``tensorflow``: a worker per node with its ``TF_CONFIG``; ``horovod``: Horovod's
workers and their gloo rendezvous); a package adds another with an entry point, found by name
in `cloudtrain.spec.frameworks` (so the task file is checked before anything is imported).
The coordinator asks a runtime five things and compares no runtime's name:

- `check`: refuse, before anything is made, what it cannot run (one line, `ConfigError`): the
  variables it wires itself set by the user (`wired`), torchrun's elastic flags where it has
  no elastic agent, a command it cannot start;
- `workers_per_node`: how many workers a node with that many GPUs runs (unless the job says);
- `installs`: whether a node's agent must make its framework importable first (``runtime NAME``,
  `cloudtrain.node.runtimes`);
- `argvs`: each node's command for one attempt (`Start`), the head's first;
- `prewarm`: the interpreter's arguments of a command, run with the job's environment, that
  readies a node for the job's next start (none: nothing to ready); a recovery runs it on a
  replacement node while the node's bootstrap checks its framework, and `up` runs the default
  runtime's on each new node for the jobs to come (no job yet: `job` is None).

How a failure reads (`cloudtrain.jobs.torchrun.read_failure`) and what a checkpoint is
(`cloudtrain.jobs.checkpoints`) are the same for the three: their workers write a log and a
checkpoint folder the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

from cloudtrain.errors import ConfigError
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.model import NodeInfo

__all__ = ["Runtime", "Start", "get"]


@dataclass(frozen=True)
class Start:
    """What a runtime is given to build each node's command for one attempt of a job."""

    #: the attempt's own id (the job's, ``.N`` after its first attempt)
    attempt_id: str
    job: JobSpec
    #: the job's command, torchrun-style (`cloudtrain.jobs.torchrun.entrypoint_args`)
    args: Sequence[str]
    #: in rank order, the head first
    nodes: Sequence[NodeInfo]
    #: workers on each node
    nproc: int
    #: a port free on the head, for the job's rendezvous
    port: int
    #: `free_ports(n)`: per node, in `nodes`' order, `n` ports free on it (its agent's choice)
    free_ports: Callable[[int], list[list[int]]]


class Runtime:
    """One runtime's answers (see the module's docstring); the defaults are the common case."""

    name: ClassVar[str]
    #: the variables it gives each worker to wire the job together: a job may not set them
    wired: ClassVar[tuple[str, ...]] = ()
    #: whether its launcher is torch's elastic agent (torchrun), whose flags then apply:
    #: ``--nodes MIN:MAX``, ``--max-restarts``, ``--start-method``
    elastic: ClassVar[bool] = False
    #: whether a node's agent makes the framework importable before the job starts
    installs: ClassVar[bool] = True

    def check(self, job: JobSpec, args: Sequence[str]) -> None:
        """Refuse (`ConfigError`, one line) a job this runtime cannot run as asked."""
        for name in self.wired:
            if name in job.envs:
                raise ConfigError(
                    f"envs: {name}={job.envs[name]!r}: cloudtrain sets {name} for each "
                    f"{self.name} worker (it wires the job together); leave it out"
                )
        if not self.elastic and (job.min_nodes or job.max_restarts):
            flag = "--nodes MIN:MAX (elastic)" if job.min_nodes else "--max-restarts"
            raise ConfigError(
                f"{flag} is torchrun's and needs runtime torch, not {self.name!r}; "
                "--managed recovers any runtime's job"
            )

    def workers_per_node(self, gpus: int) -> int:
        """A node's workers when the job does not say (0: one): one per GPU."""
        return gpus

    def argvs(self, start: Start) -> list[list[str]]:
        """Each node's command (`start.nodes`' order), started detached with the job's env."""
        raise NotImplementedError

    def prewarm(self, job: JobSpec | None) -> list[str] | None:
        """The arguments after the node's ``python`` of a short command that readies a node
        for `job`'s next start (run with the job's env, in the node's root), or, with no job,
        for a job of this runtime's defaults (run with what every job's env has); None: none."""
        return None


@cache
def get(name: str) -> Runtime:
    """The runtime `name` (one `cloudtrain.spec.frameworks.validate_runtime` accepted)."""
    from cloudtrain.spec.frameworks import entry

    module, _, attr = entry(name).partition(":")
    runtime = getattr(importlib.import_module(module), attr)()
    if not isinstance(runtime, Runtime):
        raise ConfigError(f"runtime {name!r}: {entry(name)} is not a cloudtrain Runtime")
    return runtime
