"""Which framework starts a job's processes (`runtimes`) and how a torch job scales
(`STRATEGIES`): the task's ``runtime:`` and ``strategy:``, ``--runtime`` and ``--strategy``.

A runtime is one module behind `cloudtrain.jobs.runtimes.Runtime`, found here by name: the
built-in ones (`BUILTIN`), and any a package registers with an entry point::

    [project.entry-points."cloudtrain.runtimes"]
    jax = "mypkg.jax_runtime:Jax"

Only names and ``module:Class`` strings live here (the task file is checked before anything
is imported or made); the strategies are torch's own, and a plugin's runtime takes none.

=============  ===================================================================================
torch          torchrun on every node (``--nproc-per-node``: GPUs per node, 1 on CPU); the script
               reads the strategy with ``runtime.strategy()``: ``ddp`` (replicas) or ``fsdp``
               (the model sharded over the ranks, sharded checkpoints)
tensorflow     one worker per node (or ``--nproc-per-node``), each with its ``TF_CONFIG``, for
               ``tf.distribute.MultiWorkerMirroredStrategy``
horovod        one worker per GPU (1 on CPU), wired by Horovod's own rendezvous on the head node,
               with no SSH between the nodes
=============  ===================================================================================
"""

from __future__ import annotations

from functools import cache

from cloudtrain.errors import SpecError, suggest

__all__ = ["BUILTIN", "STRATEGIES", "entry", "runtimes", "validate_runtime", "validate_strategy"]

GROUP = "cloudtrain.runtimes"
BUILTIN: dict[str, str] = {
    "torch": "cloudtrain.jobs.runtimes.torch:Torch",
    "tensorflow": "cloudtrain.jobs.runtimes.tensorflow:TensorFlow",
    "horovod": "cloudtrain.jobs.runtimes.horovod:Horovod",
}
#: The runtime whose strategies these are (torchrun's ranks, DDP or FSDP over them).
TORCH = "torch"
STRATEGIES = ("ddp", "fsdp")


@cache
def _plugins() -> dict[str, str]:
    from importlib.metadata import entry_points  # only when a name is not built in

    return {ep.name: ep.value for ep in entry_points(group=GROUP) if ep.name not in BUILTIN}


def runtimes() -> tuple[str, ...]:
    """Every runtime's name: the built-in ones first, then the plugins', sorted."""
    return (*BUILTIN, *sorted(_plugins()))


def entry(name: str) -> str:
    """The ``module:Class`` of runtime `name` (one `validate_runtime` accepted)."""
    return BUILTIN.get(name) or _plugins()[name]


def _one_of(value: object, allowed: tuple[str, ...], field: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        hint = suggest(value, allowed) if isinstance(value, str) else ""
        raise SpecError(field, f"{field} {value!r} is not one of {', '.join(allowed)}{hint}")
    return value


def validate_runtime(value: object, field: str = "runtime") -> str:
    if isinstance(value, str) and value in BUILTIN:  # reads no entry points
        return value
    return _one_of(value, runtimes(), field)


def validate_strategy(value: object, runtime: str, field: str = "strategy") -> str:
    """A torch job's strategy; the other runtimes have their own (Horovod's and TensorFlow's
    data parallelism), so a strategy with them is refused."""
    strategy = _one_of(value, STRATEGIES, field)
    if runtime != TORCH:
        raise SpecError(
            field,
            f"{field} {strategy!r} is for the torch runtime; runtime {runtime!r} shards its own "
            "way (leave the strategy out)",
        )
    return strategy
