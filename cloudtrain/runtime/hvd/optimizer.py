"""Horovod's `DistributedOptimizer` on torch.distributed.

Like Horovod's, the optimizer it returns is an instance of a class made for it, a subclass of
the wrapped optimizer's own class: ``isinstance(opt, torch.optim.SGD)`` holds and a torch LR
scheduler takes it. It shares the wrapped optimizer's ``param_groups`` (learning rates and
the other hyperparameters) and, as Horovod's, starts with a state of its own, empty: load or
broadcast a state into it after wrapping (what the wrapped optimizer held is not carried).
Its ``step()`` first reduces every gradient over all ranks (`synchronize`), then steps. The
differences from Horovod, on purpose: the gradients are reduced in one flat allreduce per dtype
and device when ``step()`` (or ``synchronize()``) is called, where Horovod overlaps them with
the backward pass through hooks; ``groups``/``num_groups`` (how Horovod batches its allreduces)
change nothing here; and Adasum is refused.

As in Horovod, a parameter that needs a gradient and has none on this rank (not used in this
rank's forward) gets zeros, so every rank reduces the same tensors; with
``backward_passes_per_step=N`` the N backward passes add up locally before the reduction; an
average is ``sum / size`` (``gradient_predivide_factor`` f: ``(g / f)`` summed, times
``f / size``); ``Compression.fp16`` sends float gradients as float16.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from cloudtrain.runtime.hvd.basics import Average, Sum, check_op, size
from cloudtrain.runtime.hvd.compression import Compression, Compressor
from cloudtrain.runtime.hvd.ops import reduce_flat
from cloudtrain.runtime.hvd.sets import ProcessSet, global_process_set, only_global

__all__ = ["DistributedOptimizer"]

Opt = TypeVar("Opt", bound=torch.optim.Optimizer)


class _Reducing(torch.optim.Optimizer):
    """What the made class adds to the wrapped optimizer's class (first in its MRO)."""

    _compression: type[Compressor]
    backward_passes_per_step: int
    op: str
    gradient_predivide_factor: float
    _synchronized: bool
    _should_synchronize: bool

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = _passes(passes)

    def synchronize(self) -> None:
        """Reduce every gradient over all ranks now (``step`` does it itself)."""
        self._synchronized = True
        if size() == 1:
            return
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        buckets: dict[tuple[torch.dtype, torch.device], list[tuple[torch.Tensor, Any]]] = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
            wire, ctx = self._compression.compress(grad)
            buckets.setdefault((wire.dtype, wire.device), []).append((p, (wire, ctx)))
        pre, post = 1.0, 1.0
        if self.op == Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        for members in buckets.values():
            flat = torch.cat([wire.reshape(-1) for _, (wire, _) in members])
            out, at = reduce_flat(flat, self.op, pre, post).to(members[0][1][0].device), 0
            for p, (wire, ctx) in members:
                part = out[at : at + wire.numel()].view_as(wire)
                at += wire.numel()
                assert p.grad is not None  # given zeros above
                grad = self._compression.decompress(part, ctx).to(p.grad.dtype)
                if p.grad.is_sparse:
                    p.grad = grad.to_sparse()
                else:
                    p.grad.copy_(grad)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` without the reduction, after a `synchronize` of your own (Horovod's
        pattern with a gradient scaler's ``unscale_``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(): the gradients are reduced twice",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)


def _passes(passes: int) -> int:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step {passes!r}: use 1 or more")
    return passes


def DistributedOptimizer(
    optimizer: Opt,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: str = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: object = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Opt:
    """`optimizer` whose ``step()`` first averages (or sums, ``op=hvd.Sum``) every gradient
    over all ranks; an instance of a subclass of `optimizer`'s class (see the module)."""
    _passes(backward_passes_per_step)
    if check_op(op) not in (Average, Sum):
        raise ValueError(f"op {op!r}: DistributedOptimizer reduces with hvd.Average or hvd.Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is for op=hvd.Average only")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor {gradient_predivide_factor!r}: use > 0")
    if compression not in (Compression.none, Compression.fp16):
        raise ValueError(f"compression {compression!r}: use hvd.Compression.none or .fp16")
    only_global(process_set)
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    if named_parameters is not None:
        named = list(named_parameters)
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"named_parameters: duplicate names {dups[:5]}")
        foreign = [n for n, p in named if id(p) not in owned]
        if foreign:
            raise ValueError(f"named_parameters not in the optimizer: {foreign[:5]}")
        if len({id(p) for _, p in named}) < len(owned):
            raise ValueError(
                "named_parameters was given but leaves some of the optimizer's parameters unnamed"
            )
    base = type(optimizer)
    made: type[_Reducing] = type(base.__name__, (_Reducing, base), {"__module__": base.__module__})
    wrapped: Any = object.__new__(made)
    wrapped.__dict__.update(optimizer.__dict__)  # the same param groups (lr, momentum ...)
    wrapped.state = defaultdict(dict)  # and, as Horovod's, a state of its own, empty
    wrapped._compression = compression
    wrapped.backward_passes_per_step = backward_passes_per_step
    wrapped.op = op
    wrapped.gradient_predivide_factor = float(gradient_predivide_factor)
    wrapped._synchronized = False
    wrapped._should_synchronize = True
    reducing: Opt = wrapped  # an instance of a subclass of `optimizer`'s class, as Horovod's
    return reducing
