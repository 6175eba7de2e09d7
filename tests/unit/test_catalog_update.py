"""``cloudtrain catalog update`` and what it leaves behind: prices read from the recorded price
lists (the stand-in of tests/unit/test_prices.py) laid over the catalog, the file written to
``$CLOUDTRAIN_HOME``, `load` preferring it, the read dates, and the stale-catalog warning."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.plan import catalog, prices
from cloudtrain.plan.catalog import Catalog, InstanceType
from cloudtrain.plan.prices import PriceListError, Reading
from tests.conftest import Cli
from tests.unit import test_prices
from tests.unit.test_prices import CUT, HTML, PriceLists

TODAY = datetime.date(2026, 12, 3)
SHIPPED_ON = "2026-11-01"


@pytest.fixture
def lists(monkeypatch: pytest.MonkeyPatch) -> Iterator[PriceLists]:
    yield from test_prices.serve(monkeypatch)


def _prices(cat: Catalog) -> dict[tuple[str, str], tuple[str, str, str]]:
    """(type, region) → (on-demand, spot, read on), as the catalog file writes them."""
    return {
        (r.instance_type, r.region): (
            catalog.money(r.ondemand_usd_per_hour),
            "" if r.spot_usd_per_hour is None else catalog.money(r.spot_usd_per_hour),
            r.prices_read_on,
        )
        for r in cat.rows
    }


# --- update: the prices read, laid over the catalog -------------------------------------------


def test_update_reads_every_cloud_and_keeps_what_it_could_not_read(lists: PriceLists) -> None:
    result = prices.update(catalog.shipped(), today=TODAY)
    got = _prices(result.catalog)
    day = TODAY.isoformat()
    assert got[("p3.2xlarge", "us-east-1")] == ("3.06", "0.918", day)
    assert got[("p4d.24xlarge", "us-east-1")] == ("21.9576", "9.8307", day)
    assert got[("p4de.24xlarge", "us-east-1")] == ("27.447", "", day)  # no spot price now
    assert got[("p4d.24xlarge", "us-west-2")] == ("21.9576", "12.4", day)
    assert got[("p3.2xlarge", "eu-west-1")] == ("3.305", "", SHIPPED_ON)  # not in the list
    assert got[("a2-highgpu-1g", "us-central1")] == ("3.673385", "1.688781", day)
    assert got[("n1-highmem-8+1xnvidia-tesla-v100", "us-central1")] == (
        "2.953212",
        "1.091624",
        day,
    )
    assert got[("Standard_NC24ads_A100_v4", "eastus")] == ("3.673", "0.3673", day)
    assert got[("Standard_ND96amsr_A100_v4", "eastus")] == ("32.77", "", day)
    assert got[("Standard_ND40rs_v2", "eastus")] == ("22.032", "2.424", SHIPPED_ON)
    assert got[("Standard_NC6s_v3", "eastus")] == ("3.06", "0.398", SHIPPED_ON)  # retired

    # the rows are the same machines, in the same order; only prices and dates moved
    def machine(r: InstanceType) -> tuple[object, ...]:
        priced = ("ondemand_usd_per_hour", "spot_usd_per_hour", "prices_read_on")
        return tuple(getattr(r, f) for f in catalog.FIELDS if f not in priced)

    assert [machine(r) for r in result.catalog.rows] == [machine(r) for r in catalog.shipped().rows]
    assert result.catalog.prices_read_on == SHIPPED_ON  # the oldest row still sold
    assert [(o.provider, o.read, len(o.asked), o.error) for o in result.outcomes] == [
        ("aws", 12, 13, None),
        ("azure", 5, 6, None),
        ("gcp", 13, 13, None),
    ]
    assert [[(r.instance_type, r.region) for r in o.missing] for o in result.outcomes] == [
        [("p3.2xlarge", "eu-west-1")],
        [("Standard_ND40rs_v2", "eastus")],
        [],
    ]
    assert result.read == 30
    changed = {(c.new.instance_type, c.new.region) for c in result.changes}
    assert ("p4d.24xlarge", "us-east-1") in changed
    assert ("p3.8xlarge", "us-west-2") not in changed  # read, the same prices: a new date only
    assert got[("p3.8xlarge", "us-west-2")] == ("12.24", "", day)


def test_the_catalog_file_holds_the_exact_decimals(lists: PriceLists) -> None:
    text = catalog.dump(prices.update(catalog.shipped(), today=TODAY).catalog)
    assert text.startswith(f"# prices_read_on: {SHIPPED_ON}\n{','.join(catalog.FIELDS)}\n")
    assert (
        "gcp,a2-megagpu-16g,A100,16,40,8.0,96,1360,us-central1,"
        "us-central1-a;us-central1-b;us-central1-c;us-central1-f,55.739504,26.110128,available,,"
        "2026-12-03\n"
    ) in text
    assert (
        "aws,p4de.24xlarge,A100-80GB,8,80,8.0,96,1152,us-east-1,us-east-1a;us-east-1b,27.447,,"
        "available,spot often unavailable; EFA capable,2026-12-03\n"
    ) in text
    assert catalog.parse(text) == prices.update(catalog.shipped(), today=TODAY).catalog


@pytest.mark.parametrize(
    ("cloud", "body", "provider", "reason"),
    [
        ("pricing", HTML, "aws", "the Price List API answered no PriceList"),
        ("azure", HTML, "azure", "the Azure Retail Prices API answered no JSON: a page titled"),
        ("gcp", CUT, "gcp", "the Cloud Billing Catalog API answered no JSON: starting"),
    ],
)
def test_a_garbled_price_list_leaves_its_rows_and_the_other_clouds_update(
    lists: PriceLists, cloud: str, body: bytes, provider: str, reason: str
) -> None:
    lists.garbled[cloud] = body
    result = prices.update(catalog.shipped(), today=TODAY)
    (failed,) = [o for o in result.outcomes if o.error is not None]
    assert failed.provider == provider
    assert failed.error is not None
    assert failed.error.startswith(reason)
    assert "\n" not in failed.error
    for old, new in zip(catalog.shipped().rows, result.catalog.rows, strict=True):
        if old.provider == provider:
            assert new == old
    assert {o.provider for o in result.outcomes if o.read} == {"aws", "azure", "gcp"} - {provider}


def test_update_takes_the_providers_asked_and_refuses_unknown_ones() -> None:
    asked: list[list[InstanceType]] = []

    def fake(rows: Sequence[InstanceType]) -> Reading:
        asked.append(list(rows))
        raise PriceListError("no credentials")

    result = prices.update(catalog.shipped(), ["gcp"], today=TODAY, readers={"gcp": fake})
    assert [(o.provider, o.read, o.error) for o in result.outcomes] == [
        ("gcp", 0, "no credentials")
    ]
    assert [r.provider for r in asked[0]] == ["gcp"] * 13
    assert result.catalog.rows == catalog.shipped().rows
    with pytest.raises(ConfigError) as info:
        prices.update(catalog.shipped(), ["gcp", "oracle"])
    assert str(info.value) == (
        "no catalog rows for provider 'oracle'; the catalog's providers: aws, azure, gcp"
    )


def test_a_provider_without_a_price_list_reader_is_said_so() -> None:
    row = dataclasses.replace(catalog.shipped().rows[0], provider="lambdalabs")
    result = prices.update(Catalog(rows=(row,), prices_read_on=SHIPPED_ON))
    (outcome,) = result.outcomes
    assert outcome.error == "no price list reader for this provider"
    assert result.read == 0


# --- the file, and load ------------------------------------------------------------------------


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    catalog._load.cache_clear()
    yield
    catalog._load.cache_clear()


def test_save_is_private_and_atomic_and_load_prefers_it(
    lists: PriceLists, home: Path, fresh_cache: None
) -> None:
    assert catalog.load() is catalog.shipped()  # no file in this home yet
    updated = prices.update(catalog.shipped(), today=TODAY).catalog
    catalog.save(updated, catalog.home_path())
    path = home / "catalog.csv"
    assert catalog.home_path() == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert [p.name for p in home.iterdir()] == ["catalog.csv"]  # no temporary file left
    assert catalog.load() == updated
    assert catalog.load() is catalog.load()
    assert catalog.load().resolve("aws", "A100", 8)[0].ondemand_usd_per_hour == 21.9576


def test_a_newer_shipped_row_wins_over_an_older_home_row(home: Path, fresh_cache: None) -> None:
    shipped = catalog.shipped()
    older = [
        dataclasses.replace(r, ondemand_usd_per_hour=1.0, prices_read_on="2026-10-01")
        for r in shipped.rows
    ]
    newer = dataclasses.replace(
        shipped.rows[0], ondemand_usd_per_hour=2.5, prices_read_on="2026-12-01"
    )
    catalog.save(
        Catalog(rows=(newer, *older[1:]), prices_read_on="2026-10-01"), catalog.home_path()
    )
    loaded = catalog.load()
    assert loaded.rows[0].ondemand_usd_per_hour == 2.5
    assert loaded.rows[1:] == shipped.rows[1:]
    assert loaded.prices_read_on == SHIPPED_ON


@pytest.mark.parametrize(
    "text",
    [
        "<html>not a catalog</html>\n",
        "# prices_read_on: 2026-12-03\nprovider,instance_type\naws,p3.2xlarge\n",
        f"# prices_read_on: yesterday\n{','.join(catalog.FIELDS)}\n",
    ],
)
def test_a_corrupt_home_catalog_is_one_warning_and_the_shipped_prices(
    home: Path, fresh_cache: None, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    home.mkdir()
    (home / "catalog.csv").write_text(text)
    with caplog.at_level(logging.WARNING, logger="cloudtrain.plan.catalog"):
        assert catalog.load() is catalog.shipped()
        assert catalog.load() is catalog.shipped()
    (record,) = caplog.records  # once per version of the file
    message = record.getMessage()
    assert message.startswith(f"warning: ignoring {home / 'catalog.csv'} (")
    assert message.endswith("); using the prices shipped with cloudtrain, read on 2026-11-01")
    assert "\n" not in message


def test_rows_without_a_date_take_the_files_and_a_row_may_carry_its_own() -> None:
    header = ",".join(catalog.FIELDS)
    row = "aws,t,V100,1,16,7.0,8,61,us-east-1,us-east-1a,3.0,,available,"
    cat = catalog.parse(f"{header}\n{row},2026-12-01\n{row.replace(',t,', ',u,')},2026-10-02\n")
    assert [r.prices_read_on for r in cat.rows] == ["2026-12-01", "2026-10-02"]
    assert cat.prices_read_on == "2026-10-02"
    with pytest.raises(ValueError, match="catalog row 2: prices_read_on '12/01/2026' is no date"):
        catalog.parse(f"# prices_read_on: 2026-01-02\n{header}\n{row},12/01/2026\n")


def test_money_is_the_decimal_a_price_was_written_as() -> None:
    assert [catalog.money(v) for v in (3.06, 21.9576, 0.00001, 40.0, 1.688781)] == [
        "3.06",
        "21.9576",
        "0.00001",
        "40.0",
        "1.688781",
    ]


# --- stale prices -----------------------------------------------------------------------------


def test_a_stale_catalog_warns() -> None:
    shipped = catalog.shipped()
    assert shipped.staleness(today=datetime.date(2027, 1, 30)) is None  # 90 days: still fresh
    assert shipped.staleness(today=datetime.date(2027, 1, 31)) == (
        "prices read on 2026-11-01, 91 days ago; `cloudtrain catalog update` refreshes them"
    )
    fresh = [dataclasses.replace(r, prices_read_on="2027-01-20") for r in shipped.rows[:2]]
    assert shipped.staleness(today=datetime.date(2027, 1, 31), rows=fresh) is None
    # retired rows are never read again: they do not make the catalog stale
    sold = [
        dataclasses.replace(r, prices_read_on="2027-01-20") for r in shipped.rows if not r.retired
    ]
    retired = [r for r in shipped.rows if r.retired]
    assert (
        Catalog(rows=(*sold, *retired), prices_read_on="2027-01-20").staleness(
            today=datetime.date(2027, 2, 1)
        )
        is None
    )


def test_staleness_of_the_loaded_catalog(home: Path, fresh_cache: None) -> None:
    assert catalog.staleness(datetime.date(2027, 3, 1)) == (
        "prices read on 2026-11-01, 120 days ago; `cloudtrain catalog update` refreshes them"
    )
    updated = [dataclasses.replace(r, prices_read_on="2027-02-20") for r in catalog.shipped().rows]
    catalog.save(Catalog(rows=tuple(updated), prices_read_on="2027-02-20"), catalog.home_path())
    assert catalog.staleness(datetime.date(2027, 3, 1)) is None


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_update_prints_changes_and_what_was_not_read(
    lists: PriceLists, run_cli: Cli, home: Path, fresh_cache: None
) -> None:
    lists.garbled["gcp"] = CUT
    result = run_cli("catalog", "update")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        "aws: read 12 of 13 rows; not in the price list, kept as they were: p3.2xlarge (eu-west-1)",
        "azure: read 5 of 6 rows; not in the price list, kept as they were: Standard_ND40rs_v2 "
        "(eastus)",
    ]
    assert lines[2].startswith(
        'gcp: not read: the Cloud Billing Catalog API answered no JSON: starting \'{"skus": '
    )
    assert "changed prices, USD per node-hour" in result.stdout
    p4d = next(ln for ln in lines if "p4d.24xlarge" in ln and "us-east-1" in ln)
    assert "32.7726 → 21.9576" in p4d
    assert "9.61 → 9.8307" in p4d
    p4de = next(ln for ln in lines if "p4de.24xlarge" in ln)
    assert "40.96575 → 27.447" in p4de
    assert "7.81 → -" in p4de
    assert not any("gcp" in ln.split("│")[1:2][0] for ln in lines if ln.count("│") > 2)
    today = datetime.date.today().isoformat()
    assert f"wrote {home / 'catalog.csv'}: the prices of 17 rows, read on {today}" in result.stderr
    shown = json.loads(run_cli("catalog", "show", "--json", "--provider", "aws").stdout)
    assert shown["updated_file"] == str(home / "catalog.csv")
    assert shown["prices_read_on"] == SHIPPED_ON  # p3.2xlarge in eu-west-1 was not read
    rows = {(r["instance_type"], r["region"]): r for r in shown["rows"]}
    assert rows[("p4d.24xlarge", "us-east-1")]["ondemand_usd_per_hour"] == 21.9576
    assert rows[("p4d.24xlarge", "us-east-1")]["prices_read_on"] == today
    assert {r["provider"] for r in shown["rows"]} == {"aws"}


def test_cli_update_dry_run_writes_nothing(
    lists: PriceLists, run_cli: Cli, home: Path, fresh_cache: None
) -> None:
    result = run_cli("catalog", "update", "--provider", "azure", "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("azure: read 5 of 6 rows")
    assert "0.444 → 0.3673" in result.stdout
    assert "dry run: nothing written" in result.stderr
    assert not (home / "catalog.csv").exists()
    assert lists.requests("pricing") == lists.requests("gcp") == []


def test_cli_update_fails_only_when_nothing_was_read(
    lists: PriceLists, run_cli: Cli, home: Path
) -> None:
    for cloud in ("pricing", "azure", "gcp"):
        lists.garbled[cloud] = HTML
    result = run_cli("catalog", "update")
    assert result.exit_code == 3
    assert result.stderr == (
        "error: aws, azure, gcp: PricesNotRead: no price could be read; nothing changed\n"
    )
    assert [ln.split(": ")[1] for ln in result.stdout.splitlines()] == ["not read"] * 3
    assert not (home / "catalog.csv").exists()
    bad = run_cli("catalog", "update", "--provider", "oracle")
    assert bad.exit_code == 2
    assert "no catalog rows for provider 'oracle'" in bad.stderr


def test_cli_show_warns_of_stale_prices(
    run_cli: Cli, monkeypatch: pytest.MonkeyPatch, fresh_cache: None
) -> None:
    old = [dataclasses.replace(r, prices_read_on="2026-01-02") for r in catalog.shipped().rows]
    stale = Catalog(tuple(old), "2026-01-02")
    monkeypatch.setattr(catalog, "shipped", lambda: stale)
    result = run_cli("catalog", "show", "--provider", "gcp")
    assert result.exit_code == 0
    assert "a2-highgpu-1g" in result.stdout
    assert "2026-01-02" in result.stdout
    assert "prices as shipped with cloudtrain" in result.stdout
    age = (datetime.date.today() - datetime.date(2026, 1, 2)).days
    assert result.stderr == (
        f"warning: prices read on 2026-01-02, {age} days ago; `cloudtrain catalog update` "
        "refreshes them\n"
    )


@pytest.mark.integration
def test_the_installed_cli_updates_and_falls_back_from_a_corrupt_file(
    lists: PriceLists, tmp_path: Path
) -> None:
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "COLUMNS": "200"}

    def cloudtrain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cloudtrain.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = cloudtrain("catalog", "update", "--provider", "gcp")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gcp: read 13 of 13 rows\n")
    assert "3.673 → 3.673385" in done.stdout
    path = tmp_path / "home" / "catalog.csv"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    shown = cloudtrain("catalog", "show", "--json", "--provider", "gcp")
    rows = json.loads(shown.stdout)["rows"]
    assert rows[0]["ondemand_usd_per_hour"] == 3.673385
    assert shown.stderr == ""
    path.write_text("# prices_read_on: 2026-12-03\n\x00garbage\n")
    shown = cloudtrain("catalog", "show", "--json", "--provider", "gcp")
    assert shown.returncode == 0
    assert json.loads(shown.stdout)["rows"][0]["ondemand_usd_per_hour"] == 3.673
    (line,) = shown.stderr.splitlines()
    assert line.startswith(f"warning: ignoring {path} (")
    assert "Traceback" not in shown.stderr
