"""Which prices the catalog believes: a band per GPU-hour, and how far from the shipped price.

Every price a plan is made from, `--max-price` is compared with and `--max-cost` is turned into
an end time by comes from the catalog. A price list that answers ``0``, ``1e-12`` or ``1e999``
(a unit slip, a placeholder row, a corrupted answer) would plan machines at ``$0.00/h`` and
give a budget that never ends, or at ``$inf/h``. So a price is believed only when

- it is a finite number of USD per node-hour whose share per GPU lies within `LOW_PER_GPU` and
  `HIGH_PER_GPU` (every GPU machine any cloud sold, spot included, has been well inside), and
- it is within `MAX_CHANGE` times, up or down, the price shipped with cloudtrain for the same
  row (when there is one): list prices move by tens of percent, not by factors.

`refused` says why a price is not believed; ``cloudtrain catalog update`` keeps the row's old
price then and prints that line, and `cloudtrain.plan.catalog.load` keeps the shipped price for
such a row of an updated catalog file (written by an older version, or by hand).
"""

from __future__ import annotations

import math
from decimal import Decimal

#: The lowest believed price, USD per GPU-hour (the cheapest spot V100/A100 is about 0.3).
LOW_PER_GPU = Decimal("0.05")
#: The highest believed price, USD per GPU-hour (the dearest on-demand A100 is about 5).
HIGH_PER_GPU = Decimal(50)
#: A price read may be at most this many times the shipped one, or a this-many-th of it.
MAX_CHANGE = 5


def refused(
    price: Decimal | float, gpus: int, shipped: float | None, what: str = "price"
) -> str | None:
    """Why `price` (USD per hour of a node with `gpus` GPUs) is not believed, on one line
    naming `what` (``on-demand price``), the value and what is allowed; None when it is.
    `shipped`: the shipped catalog's price for the same row and kind, when it has one."""
    value = Decimal(repr(price)) if isinstance(price, float) else price  # as written: 3.06
    if not value.is_finite():
        return f"{what} {price} is not a finite number of USD"
    count = max(gpus, 1)
    low, high = (LOW_PER_GPU * count).normalize(), (HIGH_PER_GPU * count).normalize()
    shown = f"{value.normalize():f}" if value.adjusted() < 30 else f"{value:E}"
    if not low <= value <= high:
        per = "" if count == 1 else f" (for {count} GPUs: {low:f} to {high:f} USD/h)"
        return (
            f"{what} {shown} USD/h is outside {LOW_PER_GPU:f} to {HIGH_PER_GPU:f} USD per "
            f"GPU-hour{per}"
        )
    if shipped is None or not math.isfinite(shipped) or shipped <= 0:
        return None
    was = Decimal(repr(shipped))
    if value > was * MAX_CHANGE:
        return f"{what} {shown} USD/h is more than {MAX_CHANGE}× the shipped {was:f}"
    if value * MAX_CHANGE < was:
        return f"{what} {shown} USD/h is less than a {MAX_CHANGE}th of the shipped {was:f}"
    return None
