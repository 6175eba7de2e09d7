"""GCP prices: the Cloud Billing Catalog API's Compute Engine SKUs.

``GET https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus`` (Compute Engine),
page after page (``nextPageToken``). Authorised with an API key when ``CLOUDTRAIN_GCP_API_KEY``
is set (plain urllib), else with google-auth's default credentials (the ``[gcp]`` extra;
``gcloud auth application-default login``) through ``AuthorizedSession``.
``CLOUDTRAIN_GCP_BILLING_ENDPOINT`` replaces ``https://cloudbilling.googleapis.com``.

Compute Engine bills a GPU machine by its parts, so a row's price is the sum of
- its vCPUs × the host series' core SKU (``A2 Instance Core running in Americas``, ``N1
  Predefined Instance Core running in Americas``; an ``a2-ultragpu`` host takes ``A2 Ultra``
  SKUs where they exist, else the A2 ones),
- its memory (GiB) × the series' RAM SKU (``... Instance Ram running in ...``),
- its GPUs × the GPU SKU (``Nvidia Tesla A100 GPU``, ``Nvidia Tesla A100 80GB GPU``,
  ``Nvidia Tesla V100 GPU`` ``running in ...``),
each SKU taken where ``serviceRegions`` holds the row's region, usage type ``OnDemand``. The
spot price is the same sum over the ``Preemptible`` SKUs (``Spot Preemptible A2 Instance
Core ...``, or the older ``Preemptible ...``); a part without one leaves the spot price
unknown. A SKU's price is ``pricingInfo[-1].pricingExpression.tieredRates[-1].unitPrice``
(``units`` + ``nanos``/1e9), per hour (``h``) or per GiB-hour (``GiBy.h``). The local SSD that
an ``a2-ultragpu`` machine comes with is not counted. A catalog row names its host and GPUs in
``instance_type``: ``a2-highgpu-1g``, ``n1-highmem-8+1xnvidia-tesla-v100``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from cloudtrain.errors import one_line
from cloudtrain.plan.catalog import InstanceType
from cloudtrain.plan.prices import (
    TIMEOUT_S,
    Key,
    PriceListError,
    Quote,
    Reading,
    decimal,
    decode,
    error_detail,
    get_json,
)

ENDPOINT = "https://cloudbilling.googleapis.com"
#: Compute Engine's service in the Cloud Billing Catalog.
SERVICE = "services/6F81-5844-456A"
PAGE_SIZE = 5000
MAX_PAGES = 200
#: The GPU SKUs' names of the catalog's accelerators.
GPU_SKUS = {
    "V100": "Nvidia Tesla V100 GPU",
    "A100": "Nvidia Tesla A100 GPU",
    "A100-80GB": "Nvidia Tesla A100 80GB GPU",
}
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
_WHERE = "the Cloud Billing Catalog API"
_NO_CREDENTIALS = (
    "no credentials: set CLOUDTRAIN_GCP_API_KEY, or run `gcloud auth application-default login`"
)

Get = Callable[[str], dict[str, Any]]
Sku = dict[str, Any]


def read(rows: Sequence[InstanceType]) -> Reading:
    """The on-demand and spot prices of `rows`. Blocks; read-only. Raises `PriceListError`
    when there are no credentials or the API refuses or garbles."""
    skus = list(_skus(_getter()))
    quotes: dict[Key, Quote] = {}
    problems: list[str] = []
    for row in rows:
        try:
            ondemand = _machine(skus, row, "OnDemand")
            spot = _machine(skus, row, "Preemptible") if ondemand is not None else None
        except PriceListError as exc:
            problems.append(f"{row.instance_type} in {row.region}: {exc}")
            continue
        if ondemand is not None:
            quotes[(row.instance_type, row.region)] = Quote(ondemand, spot)
    return Reading(quotes, tuple(problems))


def _machine(skus: list[Sku], row: InstanceType, usage: str) -> Decimal | None:
    """`row`'s hourly price from the SKUs of `usage`; None when a part has no SKU."""
    host = row.instance_type.split("+")[0]
    series = host.split("-")[0].upper()
    gpu = GPU_SKUS.get(row.accelerator)
    if gpu is None:
        raise PriceListError(f"no GPU SKU is known for {row.accelerator}")
    families = [f"{series} Instance", f"{series} Predefined Instance"]
    if "ultragpu" in host:
        families.insert(0, f"{series} Ultra Instance")
    core = ram = None
    for family in families:
        core = _price(skus, f"{family} Core", row.region, usage, "h")
        ram = _price(skus, f"{family} Ram", row.region, usage, "GiBy.h")
        if core is not None and ram is not None:
            break
    each_gpu = _price(skus, gpu, row.region, usage, "h")
    if core is None or ram is None or each_gpu is None:
        return None
    total = core * row.vcpus + ram * row.memory_gib + each_gpu * row.accelerator_count
    return total.normalize()


def _price(skus: list[Sku], name: str, region: str, usage: str, unit: str) -> Decimal | None:
    """The unit price of the SKU ``<name> running in ...`` of `usage` in `region`; None when
    there is none, `PriceListError` when several SKUs disagree."""
    found: set[Decimal] = set()
    for sku in skus:
        category = sku.get("category") or {}
        if category.get("usageType") != usage or region not in (sku.get("serviceRegions") or []):
            continue
        description = str(sku.get("description", ""))
        if usage == "Preemptible":
            description = description.removeprefix("Spot ").removeprefix("Preemptible ")
        if description.startswith(f"{name} running in "):
            price = _unit_price(sku, unit)
            if price is not None:
                found.add(price)
    if len(found) > 1:
        shown = ", ".join(str(p) for p in sorted(found))
        raise PriceListError(f"several {usage} SKUs {name!r} ({shown})")
    return found.pop() if found else None


def _unit_price(sku: Sku, unit: str) -> Decimal | None:
    """The SKU's latest price per `unit`; None when it is priced per another unit."""
    try:
        expression = sku["pricingInfo"][-1]["pricingExpression"]
        if expression.get("usageUnit") != unit:
            return None
        money = expression["tieredRates"][-1]["unitPrice"]
        if money.get("currencyCode", "USD") != "USD":
            raise PriceListError(f"SKU {sku.get('skuId')} is priced in {money['currencyCode']}")
        units = decimal(money.get("units") or "0")
        return (units + Decimal(int(money.get("nanos") or 0)).scaleb(-9)).normalize()
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        raise PriceListError(f"SKU {sku.get('skuId')} has no price: {exc!r}") from None


def _skus(get: Get) -> Iterator[Sku]:
    """Every Compute Engine SKU, page after page."""
    base = os.environ.get("CLOUDTRAIN_GCP_BILLING_ENDPOINT") or ENDPOINT
    token = ""
    for _ in range(MAX_PAGES):
        query: dict[str, str | int] = {"pageSize": PAGE_SIZE, "currencyCode": "USD"}
        if token:
            query["pageToken"] = token
        page = get(f"{base.rstrip('/')}/v1/{SERVICE}/skus?{urlencode(query)}")
        skus = page.get("skus")
        if not isinstance(skus, list) or not all(isinstance(s, dict) for s in skus):
            raise PriceListError(f"{_WHERE} answered no skus: keys {sorted(page)}")
        yield from skus
        token = str(page.get("nextPageToken") or "")
        if not token:
            return
    raise PriceListError(f"{_WHERE} sent more than {MAX_PAGES} pages")


def _getter() -> Get:
    """How to GET a page: with the API key, or with google-auth's default credentials."""
    key = os.environ.get("CLOUDTRAIN_GCP_API_KEY")
    if key:
        return lambda url: get_json(f"{url}&{urlencode({'key': key})}", _WHERE)
    try:
        import google.auth
        import requests
        from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
        from google.auth.transport.requests import AuthorizedSession
    except ImportError:
        raise PriceListError(_NO_CREDENTIALS + " (with the [gcp] extra installed)") from None
    try:
        credentials, _ = google.auth.default(scopes=[SCOPE])
    except DefaultCredentialsError:
        raise PriceListError(_NO_CREDENTIALS) from None
    session = AuthorizedSession(credentials)

    def get(url: str) -> dict[str, Any]:
        try:
            answer = session.get(url, timeout=TIMEOUT_S)
        except (GoogleAuthError, requests.RequestException) as exc:
            raise PriceListError(f"{_WHERE} could not be read: {one_line(str(exc), 200)}") from None
        if answer.status_code != 200:
            detail = error_detail(answer.content)
            raise PriceListError(f"{_WHERE} answered HTTP {answer.status_code}: {detail}")
        return decode(answer.content, _WHERE)

    return get
