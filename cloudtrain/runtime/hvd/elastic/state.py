"""Horovod's elastic state (``hvd.elastic.State``, ``ObjectState``, ``TorchState``) on
cloudtrain's world: what a training keeps in memory, committed, restored and synchronised.

=======================  ====================================================================
``commit()``             `save` (a copy in host memory of every model's and optimizer's
                         ``state_dict``, each LR scheduler's and `ElasticSampler`'s, and the
                         plain attributes), then `check_host_updates`
``restore()``            back to the last commit (an error in a collective: `run`)
``sync()``               every rank takes rank 0's (parameters, optimizer state, attributes):
                         `run` does it before the training function, and after each reset
``check_host_updates``   the newest notification (`on_hosts_updated`) agreed on every rank
                         (rank 0's, broadcast): `HostsUpdatedInterrupt` on all ranks at once
                         when it is newer than the last one seen
reset callbacks          run after each reset (``register_reset_callbacks``), e.g. to scale
                         the learning rate with the new ``hvd.size()``
=======================  ====================================================================

Assigning a model, optimizer, scheduler or sampler attribute (``state.model = other``) tracks
the new object and saves it at once, as Horovod does.
"""

from __future__ import annotations

import copy
import queue
from collections.abc import Callable, Iterable
from typing import Any

import torch

from cloudtrain.runtime.hvd.basics import HostsUpdatedInterrupt, rank
from cloudtrain.runtime.hvd.elastic.sampler import ElasticSampler
from cloudtrain.runtime.hvd.ops import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["HostUpdateResult", "ObjectState", "State", "TorchState"]


class HostUpdateResult:
    """What a host update did (Horovod's flags): a notification carries one of these."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class State:
    """What every elastic state does: commit, check for host updates, reset callbacks.
    Subclasses implement `save`, `restore` and `sync`."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[tuple[float, int]] = queue.Queue()
        self._last_updated_timestamp = 0.0
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Run each of `callbacks` after every reset (a rank failed, hosts came or went)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        """A notification that hosts were added or removed at `timestamp` (thread-safe)."""
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state in host memory (what `restore` goes back to), then raise
        `HostsUpdatedInterrupt` on every rank if hosts changed. Collective."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise `HostsUpdatedInterrupt` on every rank at once when a host update newer than
        the last one seen was notified (rank 0's notifications decide). Collective."""
        prev = newest = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
                update |= result
        prev, self._last_updated_timestamp, update = self._bcast_object((prev, newest, update))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain picklable attributes, given as keyword arguments."""

    def __init__(
        self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any
    ) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)


class _Handler:
    """How one tracked object is saved, restored and synchronised."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _Model(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _Optimizer(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


#: The tracked kinds, first match wins (`_handler`); anything else is a plain attribute.
HANDLERS: list[tuple[type, type[_Handler]]] = [
    (torch.nn.Module, _Model),
    (torch.optim.Optimizer, _Optimizer),
    (torch.optim.lr_scheduler.LRScheduler, _Handler),
    (ElasticSampler, _Handler),
]


def _handler(value: Any) -> _Handler | None:
    for kind, handler in HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """A PyTorch training's state: `model`, `optimizer` and any other keyword argument
    (more models, optimizers, LR schedulers, an `ElasticSampler`, plain values such as
    ``epoch=1, batch=0``), each an attribute of the state."""

    _handlers: dict[str, _Handler]

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, _Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            found = _handler(value)
            if found is None:
                plain[name] = value
            else:
                handlers[name] = found
        object.__setattr__(self, "_handlers", handlers)
        for name, found in handlers.items():
            object.__setattr__(self, name, found.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self) -> None:
        for found in self._handlers.values():
            found.save()
        super().save()

    def restore(self) -> None:
        for found in self._handlers.values():
            found.restore()
        super().restore()

    def sync(self) -> None:
        for found in self._handlers.values():
            found.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers: dict[str, _Handler] = self.__dict__.get("_handlers", {})
        if name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
