"""When a cluster stops billing by itself: idle time, lifetime, budget.

The user gives them to `up` (``--idle-minutes``, ``--down-when-idle``, ``--max-hours``,
``--max-cost``) or in the task file (the same names with ``_``); `up` resolves the lifetime and
the budget into one moment, `Limits.ends_at` (the budget at the price recorded at launch, for
every node the cluster has: never later than the cap), and hands the whole to each node's agent
(`cloudtrain.node.agent`), which acts with the user's machine off.

Every value is checked here, before anything is made, as the user wrote it: digits and one
point (``5``, ``0.05``), never ``1e3``, ``nan``, ``inf`` or a trailing newline.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cloudtrain.errors import SpecError

#: The longest idle time a cluster may be given before it stops itself: a week.
MAX_IDLE_MINUTES = 7 * 24 * 60
#: The longest lifetime: 120 days (GCE's longest maxRunDuration).
MAX_HOURS = 120 * 24
#: The largest budget one cluster may be given, USD.
MAX_COST = 1_000_000
#: The least a budget must buy: one minute of the cluster. A started VM is billed at least a
#: minute (AWS and GCE bill by the second with a one-minute minimum, Azure by the minute), so a
#: smaller budget is spent by the start itself, before any node could do anything.
MIN_BUDGET_S = 60
FIELDS = ("idle_minutes", "down_when_idle", "max_hours", "max_cost")
_NUMBER = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")


@dataclass(frozen=True)
class Limits:
    """What the user asked; `ends_at`/`ends_why` are what `up` resolved from it."""

    #: minutes without a job of cloudtrain's or an SSH session of the user's before the nodes go
    idle_minutes: float | None = None
    #: an idle cluster is deleted (the next command removes what the nodes could not), not kept
    #: as ``stopped`` for `up` to bring back
    down_when_idle: bool = False
    #: hours after `up` when the cluster is deleted, idle or not
    max_hours: float | None = None
    #: USD: the cluster is deleted when price × node-hours since `up` reaches it
    max_cost: float | None = None
    #: epoch seconds when the lifetime or the budget ends (the earlier), and which: ``lifetime``
    #: or ``budget`` (a node's agent says "its budget ended")
    ends_at: float | None = None
    ends_why: str | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, f) for f in FIELDS)

    def text(self) -> str:
        """``after 5 idle minute(s) (kept, stopped); at 2026-12-02 18:00:00, when its budget
        ends`` (``never`` for none)."""
        said = []
        if self.idle_minutes is not None:
            kept = "deleted" if self.down_when_idle else "kept, stopped"
            said.append(f"after {self.idle_minutes:g} idle minute(s) ({kept})")
        if self.ends_at is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.ends_at))
            said.append(f"at {when}, when its {self.ends_why} ends")
        return "; ".join(said) or "never"

    def ended_at(self, now: float | None = None) -> str | None:
        """``2026-12-04 14:02:11``, when the lifetime or budget ended by this machine's clock
        (no grace: nothing is made for it after); else None."""
        if self.ends_at is None or self.ends_at > (time.time() if now is None else now):
            return None
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.ends_at))

    def ended(self, now: float | None = None) -> str | None:
        """``its lifetime ended at 2026-12-04 14:02:11`` (`ended_at`), or None."""
        when = self.ended_at(now)
        return None if when is None else f"its {self.ends_why} ended at {when}"

    def resolved(self, created_at: float, price_per_hour: float) -> Limits:
        """With `ends_at`: `max_hours` after `created_at`, or when `max_cost` is spent at
        `price_per_hour` (the whole cluster's), whichever is first."""
        ends: list[tuple[float, str]] = []
        if self.max_hours is not None:
            ends.append((created_at + self.max_hours * 3600, "lifetime"))
        if self.max_cost is not None and price_per_hour > 0:
            spent_at = created_at + self.max_cost / price_per_hour * 3600
            ends.append((spent_at, "budget"))
        at, why = min(ends) if ends else (None, None)
        return dataclasses.replace(self, ends_at=at, ends_why=why)


def _number(value: object, field: str, top: float, allowed: str) -> float:
    text = str(value)
    number = float(text) if _NUMBER.fullmatch(text) and not isinstance(value, bool) else -1.0
    if not 0 < number <= top:
        raise SpecError(field, f"{field} {value!r}: {allowed}")
    return number


def validate_idle_minutes(value: object, field: str = "--idle-minutes") -> float:
    """Minutes without a job before a cluster stops itself: above 0 (0.05 is 3 s), at most a
    week."""
    allowed = (
        f"give minutes above 0 (0.05 is 3 s) and at most {MAX_IDLE_MINUTES} (a week), "
        "or `cloudtrain autostop NAME --off`"
    )
    return _number(value, field, MAX_IDLE_MINUTES, allowed)


def validate_max_hours(value: object, field: str = "--max-hours") -> float:
    """Hours after `up` when the cluster is deleted: above 0, at most 120 days."""
    return _number(
        value,
        field,
        MAX_HOURS,
        f"give hours above 0 (0.01 is 36 s) and at most {MAX_HOURS} (120 days)",
    )


def validate_max_cost(value: object, field: str = "--max-cost") -> float:
    """The cluster's budget in USD: above 0, at most a million."""
    return _number(
        value, field, MAX_COST, f"give US dollars above 0 (12.50) and at most {MAX_COST}"
    )


def refuse_spent_budget(max_cost: float, price_per_hour: float, what: str) -> None:
    """`SpecError` for a budget that buys less than `MIN_BUDGET_S` of a cluster priced
    `price_per_hour` (all its nodes; `what` says which, e.g. ``2 node(s) at $999.00/h``)."""
    least = price_per_hour * MIN_BUDGET_S / 3600
    if max_cost < least:
        cents = math.ceil(round(least * 100, 6)) / 100
        raise SpecError(
            "max_cost",
            f"--max-cost {max_cost:g}: a budget must pay for at least "
            f"one minute of the cluster ({what}: ${least:.4f}), the least a cloud "
            f"bills a started node; give at least {cents:.2f}",
        )


def limits_from_dict(data: Mapping[str, Any]) -> Limits:
    """The limits of a task mapping (its top-level fields), validated."""
    raw = {k: data.get(k) for k in FIELDS}
    down = raw["down_when_idle"] or False
    if not isinstance(down, bool):
        raise SpecError(
            "down_when_idle", f"down_when_idle {down!r} is not allowed; use true or false"
        )
    if down and raw["idle_minutes"] is None:
        raise SpecError(
            "down_when_idle",
            "down_when_idle needs idle_minutes (--idle-minutes "
            "N): how long idle before the cluster is deleted",
        )
    return Limits(
        idle_minutes=None
        if raw["idle_minutes"] is None
        else validate_idle_minutes(raw["idle_minutes"], "idle_minutes"),
        down_when_idle=down,
        max_hours=None
        if raw["max_hours"] is None
        else validate_max_hours(raw["max_hours"], "max_hours"),
        max_cost=None
        if raw["max_cost"] is None
        else validate_max_cost(raw["max_cost"], "max_cost"),
    )


def limits_of(data: Mapping[str, Any] | None) -> Limits:
    """Recorded limits back (older records have none)."""
    known = {f.name for f in dataclasses.fields(Limits)}
    return Limits(**{k: v for k, v in (data or {}).items() if k in known})
