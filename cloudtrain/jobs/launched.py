"""Which runtime started this worker, and the refusal of a script written for another.
Stdlib only: a forked torchrun worker installs the guard before the script runs.

=========================  =====================================  ===========================
the job's runtime          what each worker finds                 a script it refuses
=========================  =====================================  ===========================
torch (torchrun)           ``RANK``, ``WORLD_SIZE``               ``import horovod.torch``
horovod (cloudtrain's      ``HOROVOD_RANK``, ``HOROVOD_SIZE``     ``cloudtrain.runtime.init()``,
spawner)                                                          ``cloudtrain.runtime.hvd.init()``
tensorflow                 ``TF_CONFIG``, ``RANK``                the same
=========================  =====================================  ===========================

Each of those would make every worker a world of one on its own (Horovod without its
rendezvous, torch.distributed without torchrun's variables): N separate trainings that
"succeed". Refused where the mismatch shows, before any training: one line naming the runtime
to use, exit 1 (`WrongRuntimeError` is a `SystemExit`, which a script's ``except Exception``
does not swallow and Python prints as one line). A job of one worker is a world of one either
way, and is left alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

__all__ = ["HOROVOD_MODULES", "WrongRuntimeError", "check_torch_group", "guard_imports", "workers"]

#: The Horovod frameworks a torchrun worker must not import.
HOROVOD_MODULES = ("horovod.torch", "horovod.tensorflow", "horovod.keras", "horovod.mxnet")


class WrongRuntimeError(SystemExit):
    """The script is written for another runtime than the job's (its message: one line)."""


def workers(env: Mapping[str, str]) -> tuple[str | None, int]:
    """The runtime that started a process with `env`, and its number of workers: ("torch",
    WORLD_SIZE), ("horovod", HOROVOD_SIZE), ("tensorflow", the workers in TF_CONFIG), or
    (None, 1) for a plain ``python script.py``."""

    def count(name: str) -> int:
        raw = env.get(name, "")
        return int(raw) if raw.isdigit() else 1

    if "RANK" in env and "WORLD_SIZE" in env:
        return "torch", count("WORLD_SIZE")
    if "HOROVOD_RANK" in env:
        return "horovod", count("HOROVOD_SIZE")
    if "TF_CONFIG" in env:
        try:
            cluster = json.loads(env["TF_CONFIG"]).get("cluster", {})
            return "tensorflow", max(1, sum(len(v) for v in cluster.values()))
        except (ValueError, AttributeError, TypeError):
            return "tensorflow", 1
    return None, 1


def check_torch_group(env: Mapping[str, str] | None = None) -> None:
    """Before a torch.distributed group is made from torchrun's variables: raise
    `WrongRuntimeError` when another runtime started this process among others."""
    runtime, n = workers(os.environ if env is None else env)
    if runtime in ("horovod", "tensorflow") and n > 1:
        other = "import horovod.torch as hvd" if runtime == "horovod" else "TF_CONFIG"
        raise WrongRuntimeError(
            f"cloudtrain: the job's runtime is {runtime} ({n} workers), and this script makes "
            "its process group with cloudtrain.runtime, which needs torchrun: each worker "
            f"would train alone. Train it with --runtime torch (the default), or use {other}"
        )


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, size: int) -> None:
        self.size = size

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in HOROVOD_MODULES:
            raise WrongRuntimeError(
                f"cloudtrain: this script imports {fullname}, but the job's runtime is torch "
                f"(torchrun, {self.size} workers), where Horovod would make each worker a world "
                "of one. Train it with --runtime horovod, or import cloudtrain.runtime.hvd as hvd"
            )
        return None


def guard_imports(env: Mapping[str, str] | None = None) -> bool:
    """In a torchrun worker of a job of several: make an import of Horovod's frameworks raise
    `WrongRuntimeError`. True when the guard was installed."""
    runtime, n = workers(os.environ if env is None else env)
    if runtime != "torch" or n < 2:
        return False
    if not any(isinstance(f, _Refuse) for f in sys.meta_path):
        sys.meta_path.insert(0, _Refuse(n))
    return True
