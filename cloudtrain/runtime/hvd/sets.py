"""Horovod's process sets: here only the global one (every rank) exists."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ProcessSet",
    "add_process_set",
    "global_process_set",
    "only_global",
    "remove_process_set",
]


class ProcessSet:
    """A set of ranks; ``ProcessSet(None)`` (`global_process_set`) is every rank."""

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        self.ranks = None if ranks is None else sorted(ranks)
        self.process_set_id = 0 if ranks is None else None

    def included(self) -> bool:
        return self.ranks is None

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet({self.ranks})"


global_process_set = ProcessSet()


def _refuse(what: str) -> ValueError:
    return ValueError(
        f"{what}: cloudtrain.runtime.hvd has only the global process set (every rank); use "
        "--runtime horovod with Horovod itself for process sets"
    )


def only_global(process_set: ProcessSet) -> None:
    if process_set is not global_process_set and process_set.ranks is not None:
        raise _refuse(f"process set {process_set.ranks}")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    raise _refuse("hvd.add_process_set")


def remove_process_set(process_set: ProcessSet) -> bool:
    raise _refuse("hvd.remove_process_set")
