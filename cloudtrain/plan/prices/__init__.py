"""Reading the clouds' public price lists into the catalog (``cloudtrain catalog update``).

Each cloud's plugin has one reader (`cloudtrain.provision.plugin.Plugin.prices`), found by the
name the catalog gives the provider::

    read(rows: Sequence[InstanceType]) -> Reading

`read` gets the rows of its provider that are still sold and returns the prices it found for
them, keyed by (instance type, region), with a line for each thing it could not make out. It
blocks (a few HTTP calls), changes nothing anywhere, and raises `PriceListError` with a
one-line reason when the price list cannot be read at all: no SDK, no credentials, an answer
that is no price list (an HTML page from a proxy, JSON cut short), a refusal. Its SDK is
imported inside `read`, never at import time.

`update` runs the readers and lays what they read over a catalog: a row read gets the new
prices and today's date; a row not read keeps its prices and its date. A price that is not
believed (`cloudtrain.plan.bounds`: outside the band per GPU-hour, or more than 5× from the
shipped price) is refused with a line saying why: an on-demand price refused keeps the whole
row as it was, a spot price refused keeps the old spot price. A price that is no price at
all (negative, NaN, infinite) is refused for its row alone (`BadPrice`), never for the whole
list. Prices are decimals from the answers' own text (`Decimal`), so the catalog file shows
``3.06``, never ``3.0600000000001``.
"""

from __future__ import annotations

import dataclasses
import datetime
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from cloudtrain.errors import CloudtrainError, ConfigError, body_summary, one_line, suggest
from cloudtrain.plan import bounds
from cloudtrain.plan.catalog import Catalog, InstanceType, money, oldest, shipped

#: (instance type, region): the key of a price read.
Key = tuple[str, str]
#: Seconds to wait for a price list's answer.
TIMEOUT_S = 30.0


class PriceListError(CloudtrainError):
    """A price list could not be read; the message says why, on one line."""


class BadPrice(PriceListError):
    """One price of a price list is no price (negative, NaN, infinite, not a number): its row
    is refused, the rest of the list is read."""


@dataclass(frozen=True)
class Quote:
    """The prices read for one row, USD per node-hour. `spot` None: the price list has no spot
    price for it; `spot_read` False: the spot prices could not be read (the row keeps its old
    spot price)."""

    ondemand: Decimal
    spot: Decimal | None
    spot_read: bool = True


@dataclass(frozen=True)
class Reading:
    """What one cloud's price list said: the quotes found, and one line per problem (a row
    whose price is ambiguous, spot prices of a region that could not be read)."""

    quotes: Mapping[Key, Quote]
    problems: tuple[str, ...] = ()


Reader = Callable[[Sequence[InstanceType]], Reading]


@dataclass(frozen=True)
class Outcome:
    """One provider's part of an update. `error`: why nothing was read (None when read)."""

    provider: str
    asked: tuple[InstanceType, ...]
    read: int = 0
    error: str | None = None
    missing: tuple[InstanceType, ...] = ()
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Change:
    """A row whose prices changed: as it was and as it is now."""

    old: InstanceType
    new: InstanceType


@dataclass(frozen=True)
class Update:
    """The result of `update`: the new catalog, what each provider gave, what changed."""

    catalog: Catalog
    outcomes: tuple[Outcome, ...]
    changes: tuple[Change, ...] = field(default=())

    @property
    def read(self) -> int:
        """How many rows got prices read today."""
        return sum(o.read for o in self.outcomes)


def reader(provider: str) -> Reader | None:
    """The price-list reader of `provider`'s plugin; None when it has none (or is not known
    to this installation)."""
    from cloudtrain.provision import registry

    if provider not in registry.known():
        return None
    return registry.plugin(provider).prices


def update(
    catalog: Catalog,
    providers: Iterable[str] | None = None,
    *,
    today: datetime.date | None = None,
    readers: Mapping[str, Reader] | None = None,
) -> Update:
    """Read the prices of `catalog`'s rows still sold, of `providers` (default: every provider
    in the catalog), and return them laid over `catalog`. Blocks while the price lists
    answer; writes nothing. `readers` replaces the plugins' readers (tests). Raises
    `ConfigError` for a provider the catalog does not know; a price list that cannot be read
    is an `Outcome` with its `error`, never an exception."""
    known = catalog.providers()
    chosen = list(dict.fromkeys(providers or known))
    for name in chosen:
        if name not in known:
            raise ConfigError(
                f"no catalog rows for provider {name!r}{suggest(name, known)}; "
                f"the catalog's providers: {', '.join(known)}"
            )
    date = (today or datetime.date.today()).isoformat()
    rows = list(catalog.rows)
    as_shipped = {_key(r): r for r in shipped().rows}
    outcomes: list[Outcome] = []
    changes: list[Change] = []
    for name in chosen:
        mine = [i for i, r in enumerate(rows) if r.provider == name and not r.retired]
        asked = tuple(rows[i] for i in mine)
        read = (readers or {}).get(name) or reader(name)
        if read is None:
            outcomes.append(Outcome(name, asked, error="no price list reader for this provider"))
            continue
        try:
            reading = read(asked)
        except PriceListError as exc:
            outcomes.append(Outcome(name, asked, error=one_line(str(exc))))
            continue
        missing: list[InstanceType] = []
        problems = list(reading.problems)
        done = 0
        for i in mine:
            row = rows[i]
            quote = reading.quotes.get((row.instance_type, row.region))
            if quote is None:
                missing.append(row)
                continue
            quote, why = _believed(row, quote, as_shipped.get(_key(row), row))
            if why:
                problems.append(f"{row.instance_type} in {row.region}: {why}")
            if quote is None:
                continue
            new = _priced(row, quote, date)
            rows[i] = new
            done += 1
            if (new.ondemand_usd_per_hour, new.spot_usd_per_hour) != (
                row.ondemand_usd_per_hour,
                row.spot_usd_per_hour,
            ):
                changes.append(Change(row, new))
        outcomes.append(Outcome(name, asked, done, None, tuple(missing), tuple(problems)))
    new_catalog = Catalog(rows=tuple(rows), prices_read_on=oldest(rows))
    return Update(new_catalog, tuple(outcomes), tuple(changes))


def _key(row: InstanceType) -> tuple[str, str, str]:
    return row.provider, row.instance_type, row.region


def _believed(
    row: InstanceType, quote: Quote, reference: InstanceType
) -> tuple[Quote | None, str | None]:
    """`quote` as far as it is believed (`bounds.refused`, against the `reference` row's
    prices), and why not, on one line: None when the on-demand price is refused (the row is
    kept as it was), the quote without its spot price when only that one is."""
    gpus = row.accelerator_count
    why = bounds.refused(quote.ondemand, gpus, reference.ondemand_usd_per_hour, "on-demand price")
    if why:
        return None, f"{why}; kept {money(row.ondemand_usd_per_hour)}"
    if quote.spot_read and quote.spot is not None:
        why = bounds.refused(quote.spot, gpus, reference.spot_usd_per_hour, "spot price")
        if why:
            kept = row.spot_usd_per_hour
            return dataclasses.replace(quote, spot_read=False), (
                f"{why}; kept {'none' if kept is None else money(kept)}"
            )
    return quote, None


def _priced(row: InstanceType, quote: Quote, date: str) -> InstanceType:
    spot = row.spot_usd_per_hour
    if quote.spot_read:
        spot = None if quote.spot is None else float(quote.spot)
    return dataclasses.replace(
        row,
        ondemand_usd_per_hour=float(quote.ondemand),
        spot_usd_per_hour=spot,
        prices_read_on=date,
    )


# --- what the readers share ---------------------------------------------------------------


def decimal(value: object) -> Decimal:
    """A price from an answer (a string such as ``"3.0600000000"``, or a JSON number parsed
    as `Decimal`), without trailing zeros. Raises `BadPrice` for anything else."""
    shown = repr(value) if isinstance(value, str) else str(value)  # 'abc', inf, -1
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise BadPrice(f"price {shown} is no number")
    try:
        number = Decimal(value)
    except ArithmeticError:
        raise BadPrice(f"price {shown} is no number") from None
    if not number.is_finite() or number < 0:
        raise BadPrice(f"price {shown} is no price: not a finite amount of USD, 0 or more")
    return number.normalize() if number else Decimal(0)


def decode(body: bytes, where: str) -> dict[str, Any]:
    """An answer's JSON object (its floats as `Decimal`); `PriceListError` naming `where` and
    what came instead when it is none (an HTML page, JSON cut short)."""
    try:
        data = json.loads(body, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError):
        raise PriceListError(f"{where} answered no JSON: {body_summary(body)}") from None
    if not isinstance(data, dict):
        raise PriceListError(f"{where} answered no JSON object: {body_summary(body)}")
    return data


def error_detail(body: bytes) -> str:
    """The message of an error answer: ``error.message`` (Google), ``Error.Message`` (Azure),
    else what the body looks like."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body_summary(body)
    if isinstance(data, dict):
        inner = data.get("error") or data.get("Error")
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("Message")
            if message:
                return one_line(str(message), 200)
    return body_summary(body)


def get_json(url: str, where: str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """GET `url` (stdlib urllib, `TIMEOUT_S`) and return its JSON object. Every failure is a
    `PriceListError` naming `where` (never the URL: it may carry an API key)."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            body = answer.read()
    except urllib.error.HTTPError as exc:
        detail = error_detail(exc.read())
        raise PriceListError(f"{where} answered HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise PriceListError(f"{where} could not be reached: {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:  # a timeout, a reset, a cut body
        reason = one_line(str(exc), 200) or type(exc).__name__
        raise PriceListError(f"{where} could not be read: {reason}") from None
    return decode(body, where)


def same_site(url: str, base: str) -> bool:
    """`url` has `base`'s scheme and host: a next-page link is followed only there."""
    a, b = urlsplit(url), urlsplit(base)
    ports = {"http": 80, "https": 443}
    return (a.scheme, a.hostname, a.port or ports.get(a.scheme)) == (
        b.scheme,
        b.hostname,
        b.port or ports.get(b.scheme),
    )
