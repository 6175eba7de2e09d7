"""Azure prices: the Azure Retail Prices API (public, no account, no SDK).

``GET https://prices.azure.com/api/retail/prices?api-version=2023-01-01-preview&$filter=...``,
one query per row (``serviceName eq 'Virtual Machines'``, its ``armRegionName`` and
``armSkuName``), its pages followed through ``NextPageLink`` (on the same host only).
``CLOUDTRAIN_AZURE_PRICES_URL`` replaces the URL before the ``?`` (the tests' stand-in).

Of the items, only pay-as-you-go Linux hours count: ``type`` Consumption, ``unitOfMeasure``
``1 Hour``, USD, neither Windows (``productName``) nor Low Priority. An item with ``Spot`` in
its ``skuName`` or ``meterName`` is the spot price, the other the on-demand price; where
several remain, the one in effect latest (``effectiveStartDate``) wins.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

from cloudtrain.plan.catalog import InstanceType
from cloudtrain.plan.prices import (
    BadPrice,
    Key,
    PriceListError,
    Quote,
    Reading,
    decimal,
    get_json,
    same_site,
)

URL = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
#: Pages followed at most per query (a real answer for one SKU in one region has one).
MAX_PAGES = 50
_WHERE = "the Azure Retail Prices API"


def read(rows: Sequence[InstanceType]) -> Reading:
    """The on-demand and spot prices of `rows`. Blocks; read-only. Raises `PriceListError`
    when the API cannot be reached or answers no price list."""
    base = os.environ.get("CLOUDTRAIN_AZURE_PRICES_URL") or URL
    quotes: dict[Key, Quote] = {}
    problems: list[str] = []
    for row in rows:
        ondemand: list[tuple[str, Decimal]] = []
        spot: list[tuple[str, Decimal]] = []
        try:
            for item in _items(base, row.region, row.instance_type):
                if not _counts(item, row):
                    continue
                names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
                chosen = spot if "Spot" in names else ondemand
                when = str(item.get("effectiveStartDate") or "")
                chosen.append((when, decimal(item["retailPrice"])))
        except BadPrice as exc:  # this row's answer only: the other rows are read
            problems.append(f"{row.instance_type} in {row.region}: {exc}; kept the old prices")
            continue
        if ondemand:
            quotes[(row.instance_type, row.region)] = Quote(
                max(ondemand)[1], max(spot)[1] if spot else None
            )
    return Reading(quotes, tuple(problems))


def _counts(item: dict[str, Any], row: InstanceType) -> bool:
    """`item` is a pay-as-you-go hourly Linux price of `row`'s SKU in `row`'s region."""
    names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
    return (
        item.get("type") == "Consumption"
        and item.get("unitOfMeasure") == "1 Hour"
        and item.get("currencyCode", "USD") == "USD"
        and item.get("armRegionName") == row.region
        and item.get("armSkuName") == row.instance_type
        and "Windows" not in str(item.get("productName", ""))
        and "Low Priority" not in names
        and "retailPrice" in item
    )


def _items(base: str, region: str, sku: str) -> Iterator[dict[str, Any]]:
    """Every item of the query for `sku` in `region`, page after page."""
    query = (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{_literal(region)}' "
        f"and armSkuName eq '{_literal(sku)}'"
    )
    url: str | None = (
        f"{base}?{urlencode({'api-version': API_VERSION, '$filter': query}, quote_via=quote)}"
    )
    for _ in range(MAX_PAGES):
        if url is None:
            return
        page = get_json(url, _WHERE)
        items = page.get("Items")
        if not isinstance(items, list):
            raise PriceListError(f"{_WHERE} answered no Items: keys {sorted(page)}")
        for item in items:
            if not isinstance(item, dict):
                raise PriceListError(f"{_WHERE} answered an item that is no object: {item!r:.80}")
            yield item
        link = page.get("NextPageLink")
        if link and not (isinstance(link, str) and same_site(link, base)):
            raise PriceListError(f"{_WHERE} sent a NextPageLink to another site: {link!r:.120}")
        url = link or None
    raise PriceListError(f"{_WHERE} sent more than {MAX_PAGES} pages for {sku} in {region}")


def _literal(value: str) -> str:
    """`value` inside an OData string literal (a quote doubled)."""
    return value.replace("'", "''")
