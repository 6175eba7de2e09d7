"""Prices the catalog does not believe (`cloudtrain.plan.bounds`): a price list's 0, 1e-12,
1e999, Infinity, NaN or -1, or a price more than 5× from the shipped one, is refused for its
row alone with one line, and the row keeps its old price; through the recorded price lists of
tests/unit/test_prices.py (real boto3, urllib), and the CLI."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.plan import bounds, catalog, prices
from cloudtrain.plan.catalog import Catalog, InstanceType
from tests.conftest import Cli
from tests.unit import test_prices
from tests.unit.test_prices import PriceLists, Seen

TODAY = datetime.date(2026, 12, 3)
NC24 = ("Standard_NC24ads_A100_v4", "eastus")
P4D = ("p4d.24xlarge", "us-east-1")

Answer = Callable[[Seen], tuple[int, str, bytes]]


@pytest.fixture
def lists(monkeypatch: pytest.MonkeyPatch) -> Iterator[PriceLists]:
    yield from test_prices.serve(monkeypatch)


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    catalog._load.cache_clear()
    yield
    catalog._load.cache_clear()


def _edited(
    monkeypatch: pytest.MonkeyPatch, lists: PriceLists, cloud: str, sku: str, old: str, new: str
) -> list[str]:
    """The stand-in answers `cloud`'s requests for `sku` with `old` replaced by `new` in the
    recorded answer's text: a price list that says `new` where it said `old`. The list it
    returns gets an entry for each answer so edited."""
    recorded: Answer = getattr(lists, f"_{cloud}")
    edits: list[str] = []

    def answer(seen: Seen) -> tuple[int, str, bytes]:
        status, kind, body = recorded(seen)
        if sku in json.dumps(seen.query) and old.encode() in body:
            body = body.replace(old.encode(), new.encode())
            edits.append(seen.path)
        return status, kind, body

    monkeypatch.setattr(lists, f"_{cloud}", answer)
    return edits


def _row(cat: Catalog, key: tuple[str, str]) -> InstanceType:
    return next(r for r in cat.rows if (r.instance_type, r.region) == key)


# (the JSON text of the price, the line `update` prints for the row)
AZURE_BAD = [
    ("0", "on-demand price 0 USD/h is outside 0.05 to 50 USD per GPU-hour; kept 3.673"),
    ("1e-12", "on-demand price 0.000000000001 USD/h is outside 0.05 to 50 USD per GPU-hour"),
    ("1e999", "on-demand price 1E+999 USD/h is outside 0.05 to 50 USD per GPU-hour"),
    ("Infinity", "price inf is no number; kept the old prices"),
    ("NaN", "price nan is no number; kept the old prices"),
    ("-1", "price -1 is no price: not a finite amount of USD, 0 or more; kept the old prices"),
    ("20", "on-demand price 20 USD/h is more than 5× the shipped 3.673; kept 3.673"),
    ("0.5", "on-demand price 0.5 USD/h is less than a 5th of the shipped 3.673; kept 3.673"),
]


@pytest.mark.parametrize(("text", "line"), AZURE_BAD)
def test_an_unbelievable_azure_price_keeps_its_row_and_says_why(
    lists: PriceLists, monkeypatch: pytest.MonkeyPatch, text: str, line: str
) -> None:
    edits = _edited(
        monkeypatch, lists, "azure", NC24[0], '"retailPrice": 3.673,', f'"retailPrice": {text},'
    )
    result = prices.update(catalog.shipped(), ["azure"], today=TODAY)
    assert edits
    assert _row(result.catalog, NC24) == _row(catalog.shipped(), NC24)  # price and date kept
    (outcome,) = result.outcomes
    assert outcome.error is None
    assert outcome.read == 4  # the other rows are read (ND40rs_v2 is not in the list)
    (problem,) = outcome.problems
    assert problem.startswith(f"{NC24[0]} in eastus: ")
    assert line in problem
    assert "\n" not in problem
    assert NC24 not in {(c.new.instance_type, c.new.region) for c in result.changes}
    # every price now in the catalog is finite and inside the band
    for row in result.catalog.rows:
        assert bounds.refused(row.ondemand_usd_per_hour, row.accelerator_count, None) is None


def test_an_unbelievable_spot_price_keeps_the_old_spot_price_only(
    lists: PriceLists, monkeypatch: pytest.MonkeyPatch
) -> None:
    edits = _edited(
        monkeypatch, lists, "azure", NC24[0], '"retailPrice": 0.3673,', '"retailPrice": 0,'
    )
    result = prices.update(catalog.shipped(), ["azure"], today=TODAY)
    assert edits
    row = _row(result.catalog, NC24)
    assert (row.ondemand_usd_per_hour, row.spot_usd_per_hour) == (3.673, 0.444)
    assert row.prices_read_on == TODAY.isoformat()
    assert result.outcomes[0].problems == (
        f"{NC24[0]} in eastus: spot price 0 USD/h is outside 0.05 to 50 USD per GPU-hour; "
        "kept 0.444",
    )


AWS_BAD = [
    (
        "0.0000000000",
        "on-demand price 0 USD/h is outside 0.05 to 50 USD per GPU-hour (for 8 GPUs: "
        "0.4 to 400 USD/h); kept 32.7726",
    ),
    ("-1", "price '-1' is no price: not a finite amount of USD, 0 or more; kept the old prices"),
    ("Infinity", "price 'Infinity' is no price"),
    ("NaN", "price 'NaN' is no price"),
]


@pytest.mark.parametrize(("text", "line"), AWS_BAD)
def test_an_unbelievable_aws_price_keeps_its_row_and_the_rest_is_read(
    lists: PriceLists, monkeypatch: pytest.MonkeyPatch, text: str, line: str
) -> None:
    recorded: Answer = lists._pricing

    def answer(seen: Seen) -> tuple[int, str, bytes]:
        status, kind, body = recorded(seen)
        asked = {f["Field"]: f["Value"] for f in json.loads(seen.body)["Filters"]}
        if (asked["instanceType"], asked["regionCode"]) == P4D:
            # the Price List item is a JSON string inside the answer: its quotes come escaped
            old = b'\\"USD\\":\\"21.9576000000\\"'
            assert old in body
            body = body.replace(old, f'\\"USD\\":\\"{text}\\"'.encode())
        return status, kind, body

    monkeypatch.setattr(lists, "_pricing", answer)
    result = prices.update(catalog.shipped(), ["aws"], today=TODAY)
    assert _row(result.catalog, P4D) == _row(catalog.shipped(), P4D)
    outcome = result.outcomes[0]
    assert outcome.error is None
    assert outcome.read == 11  # 13 asked; p3.2xlarge in eu-west-1 is not in the list
    (problem,) = [p for p in outcome.problems if p.startswith("p4d.24xlarge in us-east-1: ")]
    assert line in problem
    assert _row(result.catalog, ("p4d.24xlarge", "us-west-2")).ondemand_usd_per_hour == 21.9576


def test_a_gcp_part_priced_far_off_makes_its_rows_refused(
    lists: PriceLists, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The A100 GPU SKU at 20 USD/h (a slip: about 3 is right): each A2 row's sum is more
    than 5× its shipped price, and refused; the V100 rows are read."""
    recorded: Answer = lists._gcp

    def answer(seen: Seen) -> tuple[int, str, bytes]:
        status, kind, body = recorded(seen)
        page = json.loads(body)
        for sku in page["skus"]:
            if sku["description"] == "Nvidia Tesla A100 GPU running in Americas":
                rate = sku["pricingInfo"][-1]["pricingExpression"]["tieredRates"][-1]
                rate["unitPrice"] = {"currencyCode": "USD", "units": "20", "nanos": 0}
        return status, kind, json.dumps(page).encode()

    monkeypatch.setattr(lists, "_gcp", answer)
    result = prices.update(catalog.shipped(), ["gcp"], today=TODAY)
    a2 = ("a2-highgpu-1g", "us-central1")
    assert _row(result.catalog, a2) == _row(catalog.shipped(), a2)
    (line,) = [p for p in result.outcomes[0].problems if p.startswith("a2-highgpu-1g ")]
    assert line == (
        "a2-highgpu-1g in us-central1: on-demand price 20.739477 USD/h is more than 5× the "
        "shipped 3.673; kept 3.673"
    )
    assert len(result.outcomes[0].problems) == 5  # a2-highgpu-1g/2g/4g/8g, a2-megagpu-16g
    v100 = _row(result.catalog, ("n1-highmem-8+1xnvidia-tesla-v100", "us-central1"))
    assert (v100.ondemand_usd_per_hour, v100.prices_read_on) == (2.953212, TODAY.isoformat())


def test_cli_update_prints_the_refusal_and_writes_the_old_row(
    lists: PriceLists,
    monkeypatch: pytest.MonkeyPatch,
    run_cli: Cli,
    home: Path,
    fresh_cache: None,
) -> None:
    _edited(monkeypatch, lists, "azure", NC24[0], '"retailPrice": 3.673,', '"retailPrice": 1e-12,')
    result = run_cli("catalog", "update", "--provider", "azure")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == (
        "azure: Standard_NC24ads_A100_v4 in eastus: on-demand price 0.000000000001 USD/h is "
        "outside 0.05 to 50 USD per GPU-hour; kept 3.673"
    )
    assert "Standard_NC24ads_A100_v4" not in result.stdout.split("changed prices")[1]
    written = catalog.parse((home / "catalog.csv").read_text())
    assert _row(written, NC24) == _row(catalog.shipped(), NC24)
    listed = run_cli("gpus", "--provider", "azure")
    (shown,) = [ln for ln in listed.stdout.splitlines() if NC24[0] in ln]
    assert "│  3.67 │    3.67 │" in shown  # not $0.00/h


@pytest.mark.parametrize("price", ["0", "1e-12", "inf", "nan", "400"])
def test_an_updated_catalog_file_with_an_unbelievable_price_keeps_the_shipped_one(
    home: Path, fresh_cache: None, caplog: pytest.LogCaptureFixture, price: str
) -> None:
    """A file an older version's `catalog update` wrote (or a hand edit): the shipped price
    stands for that row, the others are taken, and one warning says so."""
    shipped = catalog.shipped()
    rows = [dataclasses.replace(r, prices_read_on="2026-12-01") for r in shipped.rows]
    first = rows[0]  # aws p3.2xlarge, 1 V100, 3.06
    rows[0] = dataclasses.replace(first, ondemand_usd_per_hour=float(price))
    rows[1] = dataclasses.replace(rows[1], ondemand_usd_per_hour=12.0)
    home.mkdir()
    text = catalog.dump(Catalog(tuple(rows), "2026-12-01"))
    (home / "catalog.csv").write_text(text)
    with caplog.at_level(logging.WARNING, logger="cloudtrain.plan.catalog"):
        loaded = catalog.load()
    assert loaded.rows[0] == shipped.rows[0]
    assert loaded.rows[1].ondemand_usd_per_hour == 12.0
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith(
        f"warning: {home / 'catalog.csv'}: the shipped prices of 1 row(s) kept, theirs not "
        "believed (p3.2xlarge in us-east-1: on-demand price "
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("price", "gpus", "shipped", "why"),
    [
        (0.05, 1, None, None),
        (50.0, 1, None, None),
        (0.0499, 1, None, "price 0.0499 USD/h is outside 0.05 to 50 USD per GPU-hour"),
        (400.0, 8, 100.0, None),
        (float("-inf"), 1, None, "price -inf is not a finite number of USD"),
        (15.3, 1, 3.06, None),  # exactly 5×
        (15.31, 1, 3.06, "price 15.31 USD/h is more than 5× the shipped 3.06"),
    ],
)
def test_the_band_and_the_change_bound(
    price: float, gpus: int, shipped: float | None, why: str | None
) -> None:
    assert bounds.refused(price, gpus, shipped) == why


@pytest.mark.parametrize("given", ["nan", "inf", "-1", "abc", "1e7", "1e999"])
def test_a_node_price_that_is_no_price_is_one_line_naming_the_range(given: str) -> None:
    from cloudtrain.provision.provider import node_price

    with pytest.raises(ConfigError, match=r"give US dollars per node-hour, from 0 to less than"):
        node_price({"node_price": given})


def test_a_node_price_in_any_number_form_is_taken() -> None:
    from cloudtrain.provision.provider import node_price

    assert node_price({"node_price": 1e-09}) == 1e-09  # as click hands a float on
    assert node_price({"node_price": "2.5"}) == 2.5
    assert node_price({}) == 0.0
