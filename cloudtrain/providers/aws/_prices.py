"""AWS prices: the Price List query API (on-demand) and EC2's spot price history (spot).

Prerequisites: boto3 (the ``[aws]`` extra) and AWS credentials of any kind; the calls are
``pricing:GetProducts`` and ``ec2:DescribeSpotPriceHistory``, both read-only and free. The
Price List API answers from us-east-1 for every region. ``AWS_ENDPOINT_URL_PRICING`` and
``AWS_ENDPOINT_URL_EC2`` point boto3 elsewhere, as for any AWS tool (the tests' stand-in).

- On-demand: the product of the type in the region (``regionCode``) that is Linux, shared
  tenancy, with no pre-installed software and ``capacitystatus`` Used; the hourly USD price
  of its OnDemand term. One query per row, the filters checked again on what comes back.
- Spot: each zone's current price (``StartTime`` now, ``Linux/UNIX``), one query per region;
  the catalog keeps the highest zone's price, an estimate that holds in every zone of the
  region. A type with no spot price in the region gets none. When a region's spot history
  cannot be read, its rows keep their old spot price and the reading says why.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from cloudtrain.errors import one_line
from cloudtrain.plan.catalog import InstanceType
from cloudtrain.plan.prices import BadPrice, Key, PriceListError, Quote, Reading, decimal

#: The attributes every product read must have, besides its type and region.
PRODUCT = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}
#: The Price List API's region (it serves the prices of every region).
PRICING_REGION = "us-east-1"
SPOT_PRODUCT = "Linux/UNIX"


def read(rows: Sequence[InstanceType]) -> Reading:
    """The on-demand and spot prices of `rows`. Blocks; read-only. Raises `PriceListError`
    when boto3 or credentials are missing or the Price List API refuses or garbles."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise PriceListError("boto3 is not installed: pip install 'cloudtrain[aws]'") from None
    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise PriceListError("no credentials (configure the AWS CLI, or set AWS_PROFILE)")
    config = Config(connect_timeout=10, read_timeout=30)
    quotes: dict[Key, Decimal] = {}
    problems: list[str] = []
    try:
        pricing = session.client("pricing", region_name=PRICING_REGION, config=config)
        for row in rows:
            try:
                price = _ondemand(pricing, row.instance_type, row.region, problems)
            except BadPrice as exc:  # this row's answer only: the other rows are read
                problems.append(f"{row.instance_type} in {row.region}: {exc}; kept the old prices")
                continue
            if price is not None:
                quotes[(row.instance_type, row.region)] = price
    except (BotoCoreError, ClientError) as exc:
        raise PriceListError(f"the Price List API: {_reason(exc)}") from None
    spot: dict[Key, Decimal] = {}
    unread: set[str] = set()
    for region in dict.fromkeys(r.region for r in rows):
        types = sorted({r.instance_type for r in rows if r.region == region})
        try:
            ec2 = session.client("ec2", region_name=region, config=config)
            for itype, price in _spot(ec2, types).items():
                spot[(itype, region)] = price
        except (BotoCoreError, ClientError, PriceListError) as exc:
            unread.add(region)
            problems.append(f"spot prices in {region} not read: {_reason(exc)}")
    return Reading(
        {
            key: Quote(price, spot.get(key), spot_read=key[1] not in unread)
            for key, price in quotes.items()
        },
        tuple(problems),
    )


def _ondemand(pricing: Any, itype: str, region: str, problems: list[str]) -> Decimal | None:
    """The hourly on-demand price of `itype` in `region`; None when the price list has none
    (or several, a problem noted)."""
    filters = {"instanceType": itype, "regionCode": region, **PRODUCT}
    found: set[Decimal] = set()
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode="AmazonEC2",
        FormatVersion="aws_v1",
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
    )
    for page in pages:
        if "PriceList" not in page:
            raise PriceListError(f"the Price List API answered no PriceList: {_keys(page)}")
        for item in page["PriceList"]:
            found.update(_hourly(item, filters))
    if len(found) > 1:
        shown = ", ".join(str(p) for p in sorted(found))
        problems.append(f"{itype} in {region}: several on-demand prices ({shown}); kept the old")
        return None
    return found.pop() if found else None


def _hourly(item: object, filters: dict[str, str]) -> list[Decimal]:
    """The OnDemand hourly USD prices of one price-list item (a JSON string) whose product
    has every attribute of `filters`; none for another product."""
    try:
        data: Any = json.loads(item) if isinstance(item, str) else item
        attributes = data["product"]["attributes"]
        if any(attributes.get(k) != v for k, v in filters.items()):
            return []
        prices = []
        for term in data["terms"]["OnDemand"].values():
            for dimension in term["priceDimensions"].values():
                if dimension.get("unit") == "Hrs":
                    prices.append(decimal(dimension["pricePerUnit"]["USD"]))
        return prices
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PriceListError(f"a Price List item is not what it should be: {exc!r}") from None


def _spot(ec2: Any, types: list[str]) -> dict[str, Decimal]:
    """Each type's highest current zone price among `types` in the client's region."""
    latest: dict[tuple[str, str], tuple[datetime.datetime, Decimal]] = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=types,
        ProductDescriptions=[SPOT_PRODUCT],
        StartTime=datetime.datetime.now(datetime.UTC),
    )
    for page in pages:
        if "SpotPriceHistory" not in page:  # an answer that is no EC2 answer parses empty
            raise PriceListError(f"EC2 answered no spot price history: {_keys(page)}")
        for entry in page["SpotPriceHistory"]:
            itype, zone = entry.get("InstanceType"), entry.get("AvailabilityZone")
            if entry.get("ProductDescription") != SPOT_PRODUCT or itype not in types or not zone:
                continue
            when = entry.get("Timestamp") or datetime.datetime.min.replace(tzinfo=datetime.UTC)
            price = decimal(entry.get("SpotPrice"))
            key = (str(itype), zone)
            if key not in latest or when >= latest[key][0]:
                latest[key] = (when, price)
    highest: dict[str, Decimal] = {}
    for (itype, _), (_, price) in latest.items():
        highest[itype] = max(price, highest.get(itype, price))
    return highest


def _reason(exc: Exception) -> str:
    """One line for a botocore error: the AWS error code and message when there is one."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        error = response["Error"]
        return one_line(f"{error.get('Code', '?')}: {error.get('Message', '')}", 200)
    return one_line(str(exc), 200)


def _keys(page: object) -> str:
    if isinstance(page, dict):
        return f"keys {sorted(k for k in page if k != 'ResponseMetadata')}"
    return type(page).__name__
