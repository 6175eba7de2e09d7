"""Turn a spec into ranked catalog offers: cheapest first, the order `apply` tries them in.

Pure: reads the catalog (the shipped one unless another is passed) and nothing else. A zone in
the spec narrows an offer's zones to that one and implies its region; every refusal is a
`ConfigError` that says what is offered instead.
"""

from __future__ import annotations

from cloudtrain.errors import ConfigError
from cloudtrain.model import Offer
from cloudtrain.plan.catalog import Catalog, InstanceType, load
from cloudtrain.spec import ClusterSpec, Resources


def offers(spec: ClusterSpec, catalog: Catalog | None = None) -> tuple[Offer, ...]:
    """The catalog offers for `spec` on `spec.provider`, cheapest first (spot price when
    ``resources.spot``), one per region. Raises `ConfigError` when the catalog has none.
    """
    cat = catalog if catalog is not None else load()
    res = spec.resources
    if res.accelerator is None:
        raise ConfigError(
            f"CPU-only nodes on {spec.provider} are not in the catalog yet; pass --gpus "
            "(e.g. --gpus V100:1) or set resources.accelerator in the task file"
        )
    region = res.region
    if res.zone is not None:
        rows = cat.resolve(spec.provider, res.accelerator, res.count, region=region)
        region = _zone_region(rows, res.zone)
    rows = cat.resolve(spec.provider, res.accelerator, res.count, spot=res.spot, region=region)
    return tuple(_offer(row, res) for row in rows)


def _zone_region(rows: list[InstanceType], zone: str) -> str:
    """The region of `zone` among `rows`; `ConfigError` listing the zones that do offer them."""
    first = rows[0]
    regions = sorted({r.region for r in rows if zone in r.zones})
    if not regions:
        types = ", ".join(dict.fromkeys(r.instance_type for r in rows))
        offered = "; ".join(
            f"{r.region}: {', '.join(r.zones)}"
            for r in sorted(rows, key=lambda r: r.region)
            if r.zones
        )
        raise ConfigError(
            f"{first.provider} does not offer {first.gpus} ({types}) in zone {zone}; "
            f"zones that do: {offered or 'none listed'}"
        )
    if len(regions) > 1:
        raise ConfigError(
            f"zone {zone} of {first.provider} exists in {', '.join(regions)}: "
            "set the region too (--region)"
        )
    return regions[0]


def _offer(row: InstanceType, res: Resources) -> Offer:
    price = row.price(res.spot)
    if price is None:  # resolve() leaves out rows without a spot price
        raise ConfigError(f"no spot price is known for {row.instance_type} in {row.region}")
    return Offer(
        provider=row.provider,
        region=row.region,
        zones=(res.zone,) if res.zone is not None else row.zones,
        instance_type=row.instance_type,
        price_per_node_hour=price,
        spot=res.spot,
        accelerator=row.accelerator,
        accelerator_count=row.accelerator_count,
    )
