"""Which framework starts a job's processes (`RUNTIMES`) and how a torch job scales
(`STRATEGIES`): the task's ``runtime:`` and ``strategy:``, ``--runtime`` and ``--strategy``.

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

from cloudtrain.errors import SpecError, suggest

__all__ = ["RUNTIMES", "STRATEGIES", "validate_runtime", "validate_strategy"]

RUNTIMES = ("torch", "tensorflow", "horovod")
STRATEGIES = ("ddp", "fsdp")


def _one_of(value: object, allowed: tuple[str, ...], field: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        hint = suggest(value, allowed) if isinstance(value, str) else ""
        raise SpecError(field, f"{field} {value!r} is not one of {', '.join(allowed)}{hint}")
    return value


def validate_runtime(value: object, field: str = "runtime") -> str:
    return _one_of(value, RUNTIMES, field)


def validate_strategy(value: object, runtime: str, field: str = "strategy") -> str:
    """A torch job's strategy; the other runtimes have their own (Horovod's and TensorFlow's
    data parallelism), so a strategy with them is refused."""
    strategy = _one_of(value, STRATEGIES, field)
    if runtime != "torch":
        raise SpecError(
            field,
            f"{field} {strategy!r} is for the torch runtime; runtime {runtime!r} shards its own "
            "way (leave the strategy out)",
        )
    return strategy
