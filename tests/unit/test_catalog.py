"""The shipped catalog: its data, lookups, ordering and the messages a user gets."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.plan import catalog
from cloudtrain.plan.catalog import Catalog, InstanceType, load, parse

HEADER = ",".join(catalog.FIELDS)


def _small(*rows: str, meta: str = "# prices_read_on: 2026-01-02") -> Catalog:
    """A catalog from a few CSV rows (provider,type,acc,count,region,zones,ondemand,spot,status)."""
    lines = [meta, HEADER]
    for row in rows:
        prov, typ, acc, count, region, zones, ondemand, spot, status = row.split(",")
        lines.append(
            f"{prov},{typ},{acc},{count},16,7.0,8,61,{region},{zones},{ondemand},{spot},{status},"
        )
    return parse("\n".join(lines))


def _names(rows: list[InstanceType]) -> list[tuple[str, str, str]]:
    return [(r.provider, r.instance_type, r.region) for r in rows]


def _error(cat: Catalog, *args: object, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        cat.resolve(*args, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


# --- the package data -------------------------------------------------------------------------


def test_load_reads_the_package_data_through_importlib_resources() -> None:
    text = resources.files("cloudtrain.data").joinpath("catalog.csv").read_text(encoding="utf-8")
    assert text.startswith("# prices_read_on: 2026-11-01\n")
    assert load() == parse(text)
    assert load() is load()  # cached


def test_the_installed_package_loads_from_another_directory(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        opened = []
        sys.addaudithook(lambda ev, args: ev == "open" and opened.append(str(args[0])))
        from cloudtrain.plan import catalog
        assert not [p for p in opened if p.endswith("catalog.csv")], "read at import time"
        c = catalog.load()
        assert [p for p in opened if p.endswith("catalog.csv")]
        print(c.prices_read_on, len(c.rows), c.resolve("aws", "A100", 8)[0].instance_type)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2026-11-01", str(len(load().rows)), "p4d.24xlarge"]


def test_accelerators_and_providers() -> None:
    cat = load()
    assert cat.accelerators() == ("A100", "A100-80GB", "V100", "V100-32GB")
    assert cat.providers() == ("aws", "azure", "gcp")
    assert cat.prices_read_on == "2026-11-01"


def test_azure_ncv3_rows_stay_marked_retired() -> None:
    rows = {r.instance_type: r for r in load().rows if r.provider == "azure"}
    for name in ("Standard_NC6s_v3", "Standard_NC12s_v3", "Standard_NC24s_v3"):
        assert rows[name].status == "retired 2025-09-30"
        assert rows[name].retired
        assert rows[name].zones == ()
    assert not rows["Standard_ND40rs_v2"].retired


def test_every_available_row_has_zones_in_its_region() -> None:
    for row in load().rows:
        if row.retired:
            continue
        assert row.zones, row
        if row.provider in ("aws", "gcp"):
            assert all(z.startswith(row.region) for z in row.zones), row
        else:
            assert set(row.zones) <= {"1", "2", "3"}, row


def test_facts_of_the_data() -> None:
    cat = load()
    assert {r.accelerator_count for r in cat.find(provider="aws", accelerator="V100")} == {1, 4, 8}
    assert {r.accelerator_count for r in cat.find(provider="aws", accelerator="A100")} == {8}
    for row in cat.rows:
        assert row.compute_capability == ("7.0" if row.accelerator.startswith("V100") else "8.0")
        assert row.ondemand_usd_per_hour > 0
        assert row.spot_usd_per_hour is None or row.spot_usd_per_hour < row.ondemand_usd_per_hour


def test_instance_type_price_and_gpus() -> None:
    p3 = load().find(provider="aws", accelerator="V100", count=1)[0]
    assert (p3.instance_type, p3.region) == ("p3.2xlarge", "us-east-1")
    assert p3.price(spot=False) == 3.06
    assert p3.price(spot=True) == 0.77
    assert p3.gpus == "V100:1"
    eu = load().resolve("aws", "V100", 1, region="eu-west-1")[0]
    assert eu.price(spot=True) is None


# --- find: ordering and filters ---------------------------------------------------------------


def test_find_is_cheapest_first_with_ties_by_provider_type_region() -> None:
    assert _names(load().find(accelerator="A100", count=8)) == [
        ("azure", "Standard_ND96asr_v4", "eastus"),
        ("gcp", "a2-highgpu-8g", "us-central1"),
        ("aws", "p4d.24xlarge", "us-east-1"),  # 32.7726, tied with us-west-2
        ("aws", "p4d.24xlarge", "us-west-2"),
        ("aws", "p4d.24xlarge", "eu-west-1"),
    ]


def test_find_spot_uses_spot_prices_and_leaves_out_unknown_ones() -> None:
    rows = load().find(accelerator="A100-80GB", count=8, spot=True)
    assert _names(rows) == [
        ("azure", "Standard_ND96amsr_A100_v4", "eastus"),  # 3.605 spot
        ("aws", "p4de.24xlarge", "us-east-1"),  # 7.81 spot; gcp has no spot price
    ]


def test_find_leaves_out_retired_rows_unless_asked() -> None:
    assert load().find(provider="azure", accelerator="V100") == []
    retired = load().find(provider="azure", accelerator="V100", include_retired=True)
    assert [r.instance_type for r in retired] == [
        "Standard_NC6s_v3",
        "Standard_NC12s_v3",
        "Standard_NC24s_v3",
    ]


# --- resolve ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "gpus", "expected"),
    [
        ("aws", "A100:8", "p4d.24xlarge"),
        ("aws", "V100:1", "p3.2xlarge"),
        ("aws", "V100:4", "p3.8xlarge"),
        ("aws", "V100:8", "p3.16xlarge"),
        ("aws", "V100-32GB:8", "p3dn.24xlarge"),
        ("aws", "A100-80GB:8", "p4de.24xlarge"),
        ("gcp", "A100:16", "a2-megagpu-16g"),
        ("gcp", "V100:2", "n1-highmem-16+2xnvidia-tesla-v100"),
        ("gcp", "A100-80GB:1", "a2-ultragpu-1g"),
        ("azure", "A100-80GB:1", "Standard_NC24ads_A100_v4"),
        ("azure", "V100-32GB:8", "Standard_ND40rs_v2"),
    ],
)
def test_resolve_picks_the_machine_type(provider: str, gpus: str, expected: str) -> None:
    name, count = gpus.split(":")
    rows = load().resolve(provider, name, int(count))
    assert {r.instance_type for r in rows} == {expected}


def test_resolve_is_cheapest_first_one_row_per_region() -> None:
    rows = load().resolve("aws", "V100", 1)
    assert [(r.region, r.ondemand_usd_per_hour) for r in rows] == [
        ("us-east-1", 3.06),
        ("us-west-2", 3.06),
        ("eu-west-1", 3.305),
    ]
    cat = _small(
        "aws,big,V100,1,us-east-1,us-east-1a,5.0,,available",
        "aws,small,V100,1,us-east-1,us-east-1a,4.0,,available",
    )
    assert [r.instance_type for r in cat.resolve("aws", "V100", 1)] == ["small"]


def test_resolve_spot_keeps_regions_with_a_spot_price() -> None:
    rows = load().resolve("aws", "A100", 8, spot=True)
    assert [(r.region, r.price(spot=True)) for r in rows] == [("us-east-1", 9.61)]


def test_resolve_region_and_accelerator_case() -> None:
    rows = load().resolve("aws", "a100", 8, region="eu-west-1")
    assert _names(rows) == [("aws", "p4d.24xlarge", "eu-west-1")]


def test_v100_2_on_aws_names_the_counts_and_who_has_it() -> None:
    assert _error(load(), "aws", "V100", 2) == (
        "aws has no V100:2 machine: aws offers V100 with 1, 4 or 8 GPUs per node; "
        "V100:2 is offered by gcp (n1-highmem-16+2xnvidia-tesla-v100)"
    )


def test_a100_3_is_offered_by_nobody() -> None:
    assert _error(load(), "aws", "A100", 3) == (
        "aws has no A100:3 machine: aws offers A100 only with 8 GPUs per node; no provider "
        "offers A100:3 (A100 GPUs per node elsewhere: azure 8; gcp 1, 2, 4, 8 or 16)"
    )


def test_retired_azure_v100_says_so_and_gives_alternatives() -> None:
    assert _error(load(), "azure", "V100", 1) == (
        "azure retired Standard_NC6s_v3 (V100:1) on 2025-09-30 (NCv3 series; Microsoft's "
        "migration guide recommends NC A100 v4); alternatives: V100:1 on aws (p3.2xlarge) or "
        "gcp (n1-highmem-8+1xnvidia-tesla-v100); A100-80GB:1 on azure (Standard_NC24ads_A100_v4)"
    )


def test_azure_v100_with_a_count_it_never_had() -> None:
    assert _error(load(), "azure", "V100", 8) == (
        "azure has no V100:8 machine: azure retired its V100 machines (retired 2025-09-30: "
        "Standard_NC6s_v3, Standard_NC12s_v3, Standard_NC24s_v3); V100:8 is offered by aws "
        "(p3.16xlarge) and gcp (n1-highmem-64+8xnvidia-tesla-v100)"
    )


def test_accelerator_the_provider_lacks() -> None:
    assert _error(load(), "gcp", "V100-32GB", 8) == (
        "gcp has no V100-32GB:8 machine: gcp offers A100, A100-80GB and V100; V100-32GB:8 is "
        "offered by aws (p3dn.24xlarge) and azure (Standard_ND40rs_v2)"
    )


def test_unknown_accelerator() -> None:
    assert _error(load(), "aws", "H100", 8) == (
        "unknown accelerator 'H100' — did you mean 'V100'?; known: A100, A100-80GB, V100, V100-32GB"
    )


def test_region_without_the_shape_lists_the_regions_that_have_it() -> None:
    assert _error(load(), "aws", "A100", 8, region="ap-south-1") == (
        "aws offers A100:8 (p4d.24xlarge) in eu-west-1, us-east-1 and us-west-2, not in ap-south-1"
    )


def test_spot_without_a_known_spot_price() -> None:
    assert _error(load(), "aws", "A100", 8, spot=True, region="eu-west-1") == (
        "no spot price is known for A100:8 (p4d.24xlarge) on aws in eu-west-1; drop spot to use "
        "on-demand, or use a region with a spot price: us-east-1"
    )
    assert _error(load(), "gcp", "A100-80GB", 8, spot=True) == (
        "no spot price is known for A100-80GB:8 (a2-ultragpu-8g) on gcp in us-central1; drop "
        "spot to use on-demand"
    )


def test_provider_without_catalog_rows() -> None:
    assert _error(load(), "local", "A100", 1) == (
        "local has no GPUs in the catalog; GPU providers: aws, azure, gcp"
    )


# --- parse ------------------------------------------------------------------------------------


def test_parse_reads_metadata_and_rows() -> None:
    cat = _small("aws,t,V100,1,us-east-1,us-east-1a; us-east-1b,3.0,1.0,")
    assert cat.prices_read_on == "2026-01-02"
    (row,) = cat.rows
    assert row.zones == ("us-east-1a", "us-east-1b")
    assert row.status == "available"
    assert row.spot_usd_per_hour == 1.0


def test_parse_refuses_a_file_without_prices_read_on() -> None:
    with pytest.raises(ValueError, match="prices_read_on"):
        _small("aws,t,V100,1,us-east-1,,3.0,,available", meta="# source: nowhere")


def test_parse_refuses_a_wrong_header_and_bad_numbers() -> None:
    with pytest.raises(ValueError, match="catalog header"):
        parse("# prices_read_on: 2026-01-02\nprovider,instance_type\naws,p3.2xlarge\n")
    with pytest.raises(ValueError, match="catalog row 2"):
        _small("aws,t,V100,one,us-east-1,,3.0,,available")
