"""The planner: a spec becomes catalog offers, cheapest first, in the order apply tries them."""

from __future__ import annotations

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.model import Offer
from cloudtrain.plan.catalog import FIELDS, parse
from cloudtrain.plan.planner import offers
from cloudtrain.spec import ClusterSpec, Resources


def _spec(provider: str, gpus: str | None, **resources: object) -> ClusterSpec:
    accelerator, count = (None, 0)
    if gpus is not None:
        name, _, n = gpus.partition(":")
        accelerator, count = name, int(n)
    res = Resources(accelerator=accelerator, count=count, **resources)  # type: ignore[arg-type]
    return ClusterSpec(name="exp1", provider=provider, num_nodes=2, resources=res)


def _error(spec: ClusterSpec) -> str:
    with pytest.raises(ConfigError) as info:
        offers(spec)
    return str(info.value)


def test_a100_8_on_aws_is_every_region_cheapest_first() -> None:
    result = offers(_spec("aws", "A100:8"))
    assert result[0] == Offer(
        provider="aws",
        region="us-east-1",
        zones=("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"),
        instance_type="p4d.24xlarge",
        price_per_node_hour=32.7726,
        spot=False,
        accelerator="A100",
        accelerator_count=8,
    )
    assert [(o.region, o.price_per_node_hour) for o in result] == [
        ("us-east-1", 32.7726),
        ("us-west-2", 32.7726),
        ("eu-west-1", 35.40),
    ]


def test_spot_uses_the_spot_price_and_skips_regions_without_one() -> None:
    result = offers(_spec("aws", "V100:8", spot=True))
    assert [(o.instance_type, o.region, o.price_per_node_hour, o.spot) for o in result] == [
        ("p3.16xlarge", "us-east-1", 6.29, True)
    ]


def test_region_narrows_the_offers() -> None:
    result = offers(_spec("aws", "V100:1", region="eu-west-1"))
    assert [(o.region, o.zones) for o in result] == [
        ("eu-west-1", ("eu-west-1a", "eu-west-1b", "eu-west-1c"))
    ]


def test_zone_narrows_the_zones_and_implies_the_region() -> None:
    result = offers(_spec("aws", "A100:8", zone="us-west-2b"))
    assert [(o.region, o.zones) for o in result] == [("us-west-2", ("us-west-2b",))]
    azure = offers(_spec("azure", "A100-80GB:1", zone="2"))
    assert [(o.instance_type, o.region, o.zones) for o in azure] == [
        ("Standard_NC24ads_A100_v4", "eastus", ("2",))
    ]


def test_a_zone_that_does_not_offer_the_shape_lists_the_zones_that_do() -> None:
    assert _error(_spec("aws", "A100-80GB:8", zone="us-east-1f")) == (
        "aws does not offer A100-80GB:8 (p4de.24xlarge) in zone us-east-1f; "
        "zones that do: us-east-1: us-east-1a, us-east-1b"
    )
    assert _error(_spec("aws", "A100:8", region="eu-west-1", zone="eu-west-1b")) == (
        "aws does not offer A100:8 (p4d.24xlarge) in zone eu-west-1b; "
        "zones that do: eu-west-1: eu-west-1a, eu-west-1c"
    )


def test_zone_with_spot_in_a_region_without_a_spot_price() -> None:
    assert _error(_spec("aws", "A100:8", zone="eu-west-1a", spot=True)) == (
        "no spot price is known for A100:8 (p4d.24xlarge) on aws in eu-west-1; drop spot to use "
        "on-demand, or use a region with a spot price: us-east-1"
    )


def test_an_azure_zone_in_several_regions_needs_the_region() -> None:
    lines = ["# prices_read_on: 2026-01-02", ",".join(FIELDS)]
    for region, price in (("eastus", "3.6"), ("westus2", "3.7")):
        lines.append(
            f"azure,Standard_NC24ads_A100_v4,A100-80GB,1,80,8.0,24,220,{region},1;2;3,{price},,"
            "available,"
        )
    cat = parse("\n".join(lines))
    with pytest.raises(ConfigError) as info:
        offers(_spec("azure", "A100-80GB:1", zone="1"), cat)
    assert str(info.value) == (
        "zone 1 of azure exists in eastus, westus2: set the region too (--region)"
    )
    result = offers(_spec("azure", "A100-80GB:1", zone="1", region="westus2"), cat)
    assert [(o.region, o.zones, o.price_per_node_hour) for o in result] == [
        ("westus2", ("1",), 3.7)
    ]


def test_catalog_errors_reach_the_user() -> None:
    assert _error(_spec("azure", "V100:1")).startswith(
        "azure retired Standard_NC6s_v3 (V100:1) on 2025-09-30"
    )
    assert _error(_spec("aws", "V100:2")).startswith("aws has no V100:2 machine")
    assert _error(_spec("local", "A100:1")) == (
        "local has no GPUs in the catalog; GPU providers: aws, azure, gcp"
    )


def test_cpu_only_cloud_nodes_are_refused_for_now() -> None:
    assert _error(_spec("aws", None)) == (
        "CPU-only nodes on aws are not in the catalog yet; pass --gpus (e.g. --gpus V100:1) "
        "or set resources.accelerator in the task file"
    )
