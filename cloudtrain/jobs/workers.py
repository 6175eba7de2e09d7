"""The node's ``spawn`` command (`cloudtrain.node.spawn`), which starts the workers of a runtime
that has no launcher of its own on the node (TensorFlow's, Horovod's: `cloudtrain.jobs.runtimes`)
with the variables the runtime decided for each, and stops them all when one fails."""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ["command", "spawn_argv"]


def command(args: Sequence[str], python: str) -> list[str]:
    """A worker's command from the job's torchrun-style arguments (`entrypoint_args`)."""
    if args[:1] == ["--module"]:
        return [python, "-m", *args[1:]]
    if args[:1] == ["--no-python"]:
        return list(args[1:])
    return [python, *args]  # a script (`entrypoint_args` dropped a leading ``python``)


def spawn_argv(
    python: str,
    envs: Sequence[dict[str, str]],
    worker: Sequence[str],
    options: Sequence[str] = (),
    timeout: float | None = None,
) -> list[str]:
    """The node's ``spawn`` command for its workers' `envs`, with the runtime's own `options`
    (a Horovod job's head: the rendezvous it serves and its hosts)."""
    argv = [python, "-m", "cloudtrain.node", "spawn", "--envs", json.dumps(list(envs)), *options]
    if timeout is not None:
        argv += ["--timeout", f"{timeout:g}"]
    return [*argv, "--", *worker]
