"""Where a spec that names no provider should run: the cheapest offer of every cloud at hand.

Pure, like the planner it builds on: the caller says which clouds may be used (those whose
credentials are present, `cloudtrain.provision.credentials`), and `rank` asks the planner for
each cloud's offers of the spec's shape (every region of the catalog that has it, cheapest
first, the spot price with ``spot``), merges them cheapest first, drops those over
``max_price`` (USD per node-hour, like the catalog's prices) and says why each cloud or offer
was left out. `Ranking.choices` cuts the ranking into the runs that one ``up`` on one cloud
tries in order (its engine fails over between their regions and zones); the caller moves to
the next run, and so to the next cloud, when one has no room (`cloudtrain.anywhere`).

Ties go by provider name, then region, so the ranking is the same on every machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from cloudtrain.errors import ConfigError
from cloudtrain.model import Offer
from cloudtrain.plan import planner
from cloudtrain.plan.catalog import Catalog
from cloudtrain.spec import ANYWHERE, ClusterSpec

__all__ = ["ANYWHERE", "Choice", "Ranking", "rank"]


@dataclass(frozen=True)
class Choice:
    """What one ``up`` on one cloud tries: its regions, in order."""

    provider: str
    regions: tuple[str, ...]


@dataclass(frozen=True)
class Ranking:
    """Offers of every cloud considered, cheapest first, and why others were left out."""

    offers: tuple[Offer, ...]
    #: one line per cloud or offer left out: ``gcp: no credentials (…)``
    skipped: tuple[str, ...] = ()

    def choices(self) -> list[Choice]:
        """The ranking cut into runs of one cloud: ``[gcp (us-central1), aws (us-east-1,
        us-west-2), gcp (…)]`` — a cloud comes back when a dearer one sits between."""
        runs: list[Choice] = []
        for offer in self.offers:
            if runs and runs[-1].provider == offer.provider:
                last = runs[-1]
                runs[-1] = dataclasses.replace(last, regions=(*last.regions, offer.region))
            else:
                runs.append(Choice(offer.provider, (offer.region,)))
        return runs


def rank(
    spec: ClusterSpec,
    clouds: Sequence[str],
    *,
    max_price: float | None = None,
    catalog: Catalog | None = None,
    skipped: Sequence[str] = (),
) -> Ranking:
    """Every offer of `clouds` for `spec`'s shape, cheapest first, within `max_price`.

    `skipped` (clouds the caller left out, and why) is carried into the ranking. Raises
    `ConfigError` saying why when no offer is left."""
    why = list(skipped)
    found: list[Offer] = []
    for cloud in clouds:
        try:
            found += planner.offers(dataclasses.replace(spec, provider=cloud), catalog)
        except ConfigError as exc:
            why.append(f"{cloud}: {exc}")
    found.sort(key=_order)
    kept = [o for o in found if max_price is None or o.price_per_node_hour <= max_price]
    if found and not kept:
        cheapest = found[0]
        raise ConfigError(
            f"--max-price {max_price:g}: the cheapest offer of {spec.resources.gpus} is "
            f"{cheapest.provider} {cheapest.region} ({cheapest.instance_type}) at "
            f"${cheapest.price_per_node_hour:.2f}/node-hour; raise it"
        )
    if not kept:
        asked = spec.resources.gpus or "CPU-only nodes"
        raise ConfigError(f"no cloud at hand offers {asked}: {'; '.join(why) or 'none'}")
    over = len(found) - len(kept)
    if over:
        why.append(f"{over} offer(s) over --max-price {max_price:g} $/node-hour")
    return Ranking(offers=tuple(kept), skipped=tuple(why))


def _order(offer: Offer) -> tuple[float, str, str]:
    return (offer.price_per_node_hour, offer.provider, offer.region)
