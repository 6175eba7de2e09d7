"""The GPU machine catalog: shapes, regions, zones and prices of the V100 and A100 machines.

The data ships in the package as ``cloudtrain/data/catalog.csv`` and is read on first use by
`load` (cached) through `importlib.resources`, so it works from a wheel or an editable install;
nothing is read at import time. ``cloudtrain catalog update`` (`cloudtrain.plan.prices`) reads
newer prices from the clouds' price lists into ``$CLOUDTRAIN_HOME/catalog.csv``; `load` lays
that file's prices over the shipped rows (the shipped file says which machines exist, the home
file what they cost, row by row, the newer read winning). A home file that cannot be read is
one warning, and the shipped prices.

A catalog file starts with ``# key: value`` comment lines — ``# prices_read_on: YYYY-MM-DD``
is the oldest date a price was read, and the date of every row that has none of its own —
then a CSV header (`FIELDS`) and one row per provider, instance type and region:

- ``zones``: the region's zones offering the type, ';'-separated (Azure zones are ``1``, ``2``,
  ``3``). AWS maps zone letters per account, so zones are a hint: a zone that does not offer the
  type fails with a capacity error and `apply` moves on to the next zone or offer.
- ``ondemand_usd_per_hour`` / ``spot_usd_per_hour``: Linux list prices in USD; spot is an
  estimate and may be empty (unknown).
- ``status``: ``available`` or ``retired YYYY-MM-DD``. Retired rows stay so that a request for
  them is answered with that fact and the alternatives, not with a cloud error.
- ``prices_read_on``: the day this row's prices were read (ISO); empty: the file's date.

Prices older than `STALE_DAYS` make `staleness` return a warning to show.
"""

from __future__ import annotations

import csv
import datetime
import functools
import io
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from importlib import resources
from pathlib import Path

from cloudtrain.errors import ConfigError, one_line, suggest

log = logging.getLogger(__name__)

#: Prices read longer ago than this many days make `staleness` warn.
STALE_DAYS = 90
#: The name of the updated catalog in ``$CLOUDTRAIN_HOME`` (`home_path`).
FILENAME = "catalog.csv"


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
    #: The day the prices were read, ``YYYY-MM-DD`` (`parse` fills it from the file's date).
    prices_read_on: str = ""

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
    """Every known machine type, and the date its prices were read (the oldest row's)."""

    rows: tuple[InstanceType, ...]
    prices_read_on: str

    def staleness(
        self, today: datetime.date | None = None, rows: Iterable[InstanceType] | None = None
    ) -> str | None:
        """A one-line warning when the oldest price of `rows` (default: every row still sold)
        was read more than `STALE_DAYS` days before `today`; None when the prices are fresh."""
        chosen = [r for r in self.rows if not r.retired] if rows is None else list(rows)
        oldest = min((r.prices_read_on for r in chosen if r.prices_read_on), default="")
        oldest = oldest or self.prices_read_on
        age = ((today or datetime.date.today()) - datetime.date.fromisoformat(oldest)).days
        if age <= STALE_DAYS:
            return None
        refresh = "`cloudtrain catalog update` refreshes them"
        return f"prices read on {oldest}, {age} days ago; {refresh}"

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
    """A `Catalog` from the text of a catalog file (see the module docstring for the format).
    Raises ValueError, naming the row, for anything else."""
    meta: dict[str, str] = {}
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line.strip():
            lines.append(line)
    reader = csv.DictReader(lines)
    try:
        if tuple(reader.fieldnames or ()) != FIELDS:
            raise ValueError(f"catalog header is {reader.fieldnames}, expected {list(FIELDS)}")
        read_on = meta.get("prices_read_on", "")
        if read_on:
            _date(read_on)
        rows = []
        for number, raw in enumerate(reader, start=2):
            if not (read_on or (raw.get("prices_read_on") or "").strip()):
                raise ValueError(
                    f"catalog row {number} has no prices_read_on, and the catalog no "
                    "'# prices_read_on: YYYY-MM-DD' line"
                )
            try:
                rows.append(_row(raw, read_on))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"catalog row {number}: {exc}") from exc
    except csv.Error as exc:
        raise ValueError(f"catalog is no CSV: {exc}") from exc
    if not read_on and not rows:
        raise ValueError("catalog has no '# prices_read_on: YYYY-MM-DD' line")
    return Catalog(rows=tuple(rows), prices_read_on=read_on or oldest(rows))


def _date(text: str) -> str:
    """`text` if it is an ISO date (``2026-11-01``); else ValueError."""
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"prices_read_on {text!r} is no date (YYYY-MM-DD)") from None
    return text


def oldest(rows: Sequence[InstanceType]) -> str:
    """The oldest read date of the rows still sold (of every row when none is)."""
    sold = [r for r in rows if not r.retired] or rows
    return min(r.prices_read_on for r in sold)


def _row(raw: dict[str, str], read_on: str) -> InstanceType:
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
        prices_read_on=_date((raw.get("prices_read_on") or "").strip() or read_on),
    )


def money(value: float) -> str:
    """A price as the decimal it was written as: ``3.06``, ``0.00001`` (never ``1e-05``)."""
    return format(Decimal(repr(value)), "f")


def dump(catalog: Catalog) -> str:
    """The text of a catalog file that `parse` reads back as `catalog`."""
    out = io.StringIO()
    out.write(f"# prices_read_on: {catalog.prices_read_on}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for r in catalog.rows:
        values = {f: getattr(r, f) for f in FIELDS}
        values["zones"] = ";".join(r.zones)
        values["ondemand_usd_per_hour"] = money(r.ondemand_usd_per_hour)
        spot = r.spot_usd_per_hour
        values["spot_usd_per_hour"] = "" if spot is None else money(spot)
        writer.writerow([values[f] for f in FIELDS])
    return out.getvalue()


def save(catalog: Catalog, path: Path) -> None:
    """Write `catalog` to `path`, private (0600) and atomically: a reader sees the old file or
    the new one, never half of one. Its folder is made (0700) when missing. Raises OSError."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(dump(catalog))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def overlay(base: Catalog, newer: Catalog, refused: list[str] | None = None) -> Catalog:
    """`base`'s rows, each with the prices and read date of `newer`'s same row (provider,
    instance type, region) where that was read on the same day or later, and its prices are
    believed (`cloudtrain.plan.bounds`, against `base`'s); a row that is not keeps `base`'s,
    and a line saying why is added to `refused`."""
    read = {(r.provider, r.instance_type, r.region): r for r in newer.rows}
    rows = []
    for row in base.rows:
        new = read.get((row.provider, row.instance_type, row.region))
        newer_read = new is not None and new.prices_read_on >= row.prices_read_on
        why = _disbelieved(row, new) if new is not None and newer_read else None
        if why and refused is not None:
            refused.append(f"{row.instance_type} in {row.region}: {why}")
        if new is not None and newer_read and not why:
            row = replace(
                row,
                ondemand_usd_per_hour=new.ondemand_usd_per_hour,
                spot_usd_per_hour=new.spot_usd_per_hour,
                prices_read_on=new.prices_read_on,
            )
        rows.append(row)
    return Catalog(rows=tuple(rows), prices_read_on=oldest(rows) if rows else base.prices_read_on)


def _disbelieved(row: InstanceType, new: InstanceType) -> str | None:
    """Why `new`'s prices are not believed for `row` (`bounds.refused`), or None."""
    from cloudtrain.plan import bounds

    gpus = row.accelerator_count
    why = bounds.refused(
        new.ondemand_usd_per_hour, gpus, row.ondemand_usd_per_hour, "on-demand price"
    )
    if why is None and new.spot_usd_per_hour is not None:
        why = bounds.refused(new.spot_usd_per_hour, gpus, row.spot_usd_per_hour, "spot price")
    return why


def home_path() -> Path:
    """Where ``cloudtrain catalog update`` writes the prices it read:
    ``$CLOUDTRAIN_HOME/catalog.csv``."""
    from cloudtrain.state import home

    return home() / FILENAME


@functools.cache
def shipped() -> Catalog:
    """The catalog shipped with cloudtrain, read once from the package data."""
    data = resources.files("cloudtrain.data").joinpath(FILENAME)
    return parse(data.read_text(encoding="utf-8"))


def load() -> Catalog:
    """The catalog: the shipped one with the prices of ``$CLOUDTRAIN_HOME/catalog.csv`` laid
    over it when that file exists. Cached per version of that file (the same object until it
    changes); a file that cannot be read is one warning logged, and the shipped prices."""
    path = home_path()
    try:
        st = path.stat()
    except OSError:
        return _load(None, 0, 0)
    return _load(str(path), st.st_mtime_ns, st.st_size)


def staleness(
    today: datetime.date | None = None, rows: Iterable[InstanceType] | None = None
) -> str | None:
    """`Catalog.staleness` of the catalog `load` gives: a warning line, or None."""
    return load().staleness(today, rows)


@functools.cache
def _load(path: str | None, mtime_ns: int, size: int) -> Catalog:
    base = shipped()
    if path is None:
        return base
    try:
        newer = parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning(
            "warning: ignoring %s (%s); using the prices shipped with cloudtrain, read on %s",
            path,
            one_line(str(exc), 160),
            base.prices_read_on,
        )
        return base
    refused: list[str] = []
    found = overlay(base, newer, refused)
    if refused:
        log.warning(
            "warning: %s: the shipped prices of %d row(s) kept, theirs not believed (%s%s)",
            path,
            len(refused),
            one_line(refused[0], 200),
            f"; and {len(refused) - 1} more" if len(refused) > 1 else "",
        )
    return found
