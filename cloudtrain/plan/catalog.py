"""The GPU machine catalog: shapes, regions, zones and prices of the V100 and A100 machines.

The data ships in the package as ``cloudtrain/data/catalog.csv`` and is read on first use by
`load` (cached) through `importlib.resources`, so it works from a wheel or an editable install;
nothing is read at import time. The file starts with ``# key: value`` comment lines — the
required one is ``# prices_read_on: YYYY-MM-DD``, the date the prices were read — then a CSV
header (`FIELDS`) and one row per provider, instance type and region:

- ``zones``: the region's zones offering the type, ';'-separated (Azure zones are ``1``, ``2``,
  ``3``). AWS maps zone letters per account, so zones are a hint: a zone that does not offer the
  type fails with a capacity error and `apply` moves on to the next zone or offer.
- ``ondemand_usd_per_hour`` / ``spot_usd_per_hour``: Linux list prices in USD; spot is an
  estimate and may be empty (unknown).
- ``status``: ``available`` or ``retired YYYY-MM-DD``. Retired rows stay so that a request for
  them is answered with that fact and the alternatives, not with a cloud error.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from importlib import resources

from cloudtrain.errors import ConfigError, suggest


@dataclass(frozen=True)
class InstanceType:
    """One machine type in one region, with its GPUs and prices."""

    provider: str
    instance_type: str
    accelerator: str
    accelerator_count: int
    gpu_memory_gb: int
    compute_capability: str
    vcpus: int
    memory_gib: int
    region: str
    zones: tuple[str, ...]
    ondemand_usd_per_hour: float
    spot_usd_per_hour: float | None
    status: str
    note: str

    @property
    def retired(self) -> bool:
        """The provider no longer sells this type (status ``retired YYYY-MM-DD``)."""
        return self.status.startswith("retired")

    @property
    def gpus(self) -> str:
        """The GPUs per node as a user writes them: ``V100:8``."""
        return f"{self.accelerator}:{self.accelerator_count}"

    def price(self, spot: bool) -> float | None:
        """USD per node-hour; None for spot when no spot price is known."""
        return self.spot_usd_per_hour if spot else self.ondemand_usd_per_hour


#: The CSV header: the fields of `InstanceType`, in order (zones ';'-separated).
FIELDS = tuple(f.name for f in fields(InstanceType))


@dataclass(frozen=True)
class Catalog:
    """Every known machine type, and the date its prices were read."""

    rows: tuple[InstanceType, ...]
    prices_read_on: str

    def accelerators(self) -> tuple[str, ...]:
        """Sorted accelerator names, retired rows included."""
        return tuple(sorted({r.accelerator for r in self.rows}))

    def providers(self) -> tuple[str, ...]:
        """Sorted names of the providers with catalog rows."""
        return tuple(sorted({r.provider for r in self.rows}))

    def find(
        self,
        *,
        provider: str | None = None,
        accelerator: str | None = None,
        count: int | None = None,
        spot: bool = False,
        include_retired: bool = False,
    ) -> list[InstanceType]:
        """Rows matching every given filter, cheapest first (spot price when `spot`).

        With `spot`, rows without a spot price are left out. Ties go by provider, type, region.
        """
        rows = [
            r
            for r in self.rows
            if (provider is None or r.provider == provider)
            and (accelerator is None or r.accelerator == accelerator)
            and (count is None or r.accelerator_count == count)
            and (include_retired or not r.retired)
            and r.price(spot) is not None
        ]
        return _cheapest_first(rows, spot)

    def resolve(
        self,
        provider: str,
        accelerator: str,
        count: int,
        *,
        spot: bool = False,
        region: str | None = None,
    ) -> list[InstanceType]:
        """The rows that give `count` × `accelerator` per node on `provider`: cheapest first,
        one per region. Raises `ConfigError` saying what is offered instead when none does.
        """
        if provider not in self.providers():
            raise ConfigError(
                f"{provider} has no GPUs in the catalog; "
                f"GPU providers: {', '.join(self.providers())}"
            )
        known = self.accelerators()
        name = {a.lower(): a for a in known}.get(accelerator.lower())
        if name is None:
            raise ConfigError(
                f"unknown accelerator {accelerator!r}{suggest(accelerator, known)}; "
                f"known: {', '.join(known)}"
            )
        gpus = f"{name}:{count}"
        mine = [r for r in self.rows if r.provider == provider and r.accelerator == name]
        rows = [r for r in mine if r.accelerator_count == count and not r.retired]
        if not rows:
            raise ConfigError(self._unavailable(provider, name, count, mine))
        everywhere = rows
        if region is not None:
            rows = [r for r in rows if r.region == region]
            if not rows:
                regions = sorted({r.region for r in everywhere})
                raise ConfigError(
                    f"{provider} offers {gpus} ({_types(everywhere)}) in "
                    f"{_join(regions, 'and')}, not in {region}"
                )
        if spot:
            priced = [r for r in rows if r.spot_usd_per_hour is not None]
            if not priced:
                where = region or _join(sorted({r.region for r in rows}), "or")
                hint = "; drop spot to use on-demand"
                others = sorted({r.region for r in everywhere if r.spot_usd_per_hour is not None})
                if others:
                    hint += f", or use a region with a spot price: {', '.join(others)}"
                raise ConfigError(
                    f"no spot price is known for {gpus} ({_types(rows)}) on {provider} "
                    f"in {where}{hint}"
                )
            rows = priced
        seen: set[str] = set()
        result = []
        for row in _cheapest_first(rows, spot):
            if row.region not in seen:
                seen.add(row.region)
                result.append(row)
        return result

    def _unavailable(self, provider: str, name: str, count: int, mine: list[InstanceType]) -> str:
        """Why `provider` has no `count` × `name` per node, and what is offered instead."""
        gpus = f"{name}:{count}"
        gone = [r for r in mine if r.accelerator_count == count]
        if gone:
            return self._retired_message(provider, gone[0])
        counts = sorted({r.accelerator_count for r in mine if not r.retired})
        shown = _join([str(c) for c in counts], "or") + (" GPU" if counts == [1] else " GPUs")
        if len(counts) == 1:
            why = f"{provider} offers {name} only with {shown} per node"
        elif counts:
            why = f"{provider} offers {name} with {shown} per node"
        elif mine:
            why = f"{provider} retired its {name} machines ({_retired(mine)})"
        else:
            offered = [
                a for a in self.accelerators() if self.find(provider=provider, accelerator=a)
            ]
            why = f"{provider} offers {_join(offered, 'and')}"
        return f"{provider} has no {gpus} machine: {why}; {self._elsewhere(provider, name, count)}"

    def _retired_message(self, provider: str, row: InstanceType) -> str:
        """`row` is retired: when, and the alternatives elsewhere and on the same provider."""
        date = row.status.removeprefix("retired").strip()
        note = f" ({row.note})" if row.note else ""
        alternatives = self._by_provider(
            self.find(accelerator=row.accelerator, count=row.accelerator_count),
            "or",
            f"{row.gpus} on ",
        )
        same = self.find(provider=provider, count=row.accelerator_count)
        alternatives += dict.fromkeys(f"{r.gpus} on {provider} ({r.instance_type})" for r in same)
        tail = f"; alternatives: {'; '.join(alternatives)}" if alternatives else ""
        return f"{provider} retired {row.instance_type} ({row.gpus}) on {date}{note}{tail}"

    def _elsewhere(self, provider: str, name: str, count: int) -> str:
        """Who else offers `name`:`count`, or the counts other providers have."""
        gpus = f"{name}:{count}"
        others = [r for r in self.find(accelerator=name, count=count) if r.provider != provider]
        if others:
            return f"{gpus} is offered by {self._by_provider(others, 'and')[0]}"
        per_provider: dict[str, set[int]] = {}
        for r in self.find(accelerator=name):
            if r.provider != provider:
                per_provider.setdefault(r.provider, set()).add(r.accelerator_count)
        if not per_provider:
            return f"no other provider offers {name}"
        counts = "; ".join(
            f"{p} {_join([str(c) for c in sorted(cs)], 'or')}"
            for p, cs in sorted(per_provider.items())
        )
        return f"no provider offers {gpus} ({name} GPUs per node elsewhere: {counts})"

    def _by_provider(self, rows: Iterable[InstanceType], word: str, prefix: str = "") -> list[str]:
        """``["aws (p3.2xlarge) or gcp (n1-…)"]``: each provider with its types, one string."""
        types: dict[str, list[str]] = {}
        for r in rows:
            names = types.setdefault(r.provider, [])
            if r.instance_type not in names:
                names.append(r.instance_type)
        if not types:
            return []
        parts = [f"{p} ({', '.join(t)})" for p, t in sorted(types.items())]
        return [prefix + _join(parts, word)]


def _cheapest_first(rows: Iterable[InstanceType], spot: bool) -> list[InstanceType]:
    return sorted(rows, key=lambda r: (r.price(spot) or 0.0, r.provider, r.instance_type, r.region))


def _join(items: Sequence[str], word: str) -> str:
    """``a, b or c``."""
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {word} {items[-1]}"


def _types(rows: Iterable[InstanceType]) -> str:
    return ", ".join(dict.fromkeys(r.instance_type for r in rows))


def _retired(rows: Iterable[InstanceType]) -> str:
    by_status: dict[str, list[str]] = {}
    for r in rows:
        if r.retired:
            by_status.setdefault(r.status, []).append(r.instance_type)
    return "; ".join(f"{s}: {', '.join(names)}" for s, names in sorted(by_status.items()))


def parse(text: str) -> Catalog:
    """A `Catalog` from the text of a catalog file (see the module docstring for the format)."""
    meta: dict[str, str] = {}
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line.strip():
            lines.append(line)
    reader = csv.DictReader(lines)
    if tuple(reader.fieldnames or ()) != FIELDS:
        raise ValueError(f"catalog header is {reader.fieldnames}, expected {list(FIELDS)}")
    if not meta.get("prices_read_on"):
        raise ValueError("catalog has no '# prices_read_on: YYYY-MM-DD' line")
    rows = []
    for number, raw in enumerate(reader, start=2):
        try:
            rows.append(_row(raw))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"catalog row {number}: {exc}") from exc
    return Catalog(rows=tuple(rows), prices_read_on=meta["prices_read_on"])


def _row(raw: dict[str, str]) -> InstanceType:
    spot = raw["spot_usd_per_hour"].strip()
    return InstanceType(
        provider=raw["provider"],
        instance_type=raw["instance_type"],
        accelerator=raw["accelerator"],
        accelerator_count=int(raw["accelerator_count"]),
        gpu_memory_gb=int(raw["gpu_memory_gb"]),
        compute_capability=raw["compute_capability"],
        vcpus=int(raw["vcpus"]),
        memory_gib=int(raw["memory_gib"]),
        region=raw["region"],
        zones=tuple(z.strip() for z in raw["zones"].split(";") if z.strip()),
        ondemand_usd_per_hour=float(raw["ondemand_usd_per_hour"]),
        spot_usd_per_hour=float(spot) if spot else None,
        status=raw["status"].strip() or "available",
        note=raw["note"].strip(),
    )


@functools.cache
def load() -> Catalog:
    """The catalog shipped with cloudtrain, read once from the package data."""
    data = resources.files("cloudtrain.data").joinpath("catalog.csv")
    return parse(data.read_text(encoding="utf-8"))
