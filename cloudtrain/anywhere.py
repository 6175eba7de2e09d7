"""`up` where it is cheapest: the optimizer's ranking tried in order, across clouds.

A spec whose provider is `ANYWHERE` (``up --gpus A100:8`` naming no provider) is placed here::

    place(spec)                    a recorded cluster stays where it is (its provider);
                                   else every cloud whose credentials are present, ranked
    up(spec, ranking)
      for each choice (one cloud, its regions in order):
          api.up(spec on that cloud, regions)     the engine fails over between regions, zones
          no room, no quota, credentials refused ──► next choice, when nothing is left of
                                                     this one (no record: `api.up` made nothing)
      every choice failed ──► CapacityError naming each

Crossing clouds is safe only when the cloud left holds nothing of the cluster: `api.up` keeps a
record of whatever a failed attempt left, and a kept record stops the failover (that cluster is
completed or removed where it is, never doubled on a second cloud). Two `up`s of one name race
safely: each `api.up` holds the cluster's lock, and the second finds the first's record and
completes that cluster where it is, whichever cloud it was about to try.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cloudtrain import api
from cloudtrain.errors import AccountError, AuthError, CapacityError, ConfigError, QuotaError
from cloudtrain.model import Event, NodeInfo, OnEvent, ignore_event
from cloudtrain.plan import optimizer
from cloudtrain.plan.optimizer import ANYWHERE, Ranking
from cloudtrain.provision import credentials, registry
from cloudtrain.provision.credentials import Presence
from cloudtrain.spec import ClusterSpec
from cloudtrain.state import State

#: What a cloud may answer that sends `up` on to the next cloud (anything else stops it).
FAIL_OVER = (CapacityError, QuotaError, AuthError, AccountError)


def on(spec: ClusterSpec, provider: str) -> ClusterSpec:
    """`spec` placed on `provider`, keeping only the provider options `provider` takes (``up
    --gpus A100:8 --profile dev --project p`` gives each cloud its own)."""
    keys = {option.key for option in registry.options(provider)}
    extra = {k: v for k, v in spec.extra.items() if k in keys}
    return dataclasses.replace(spec, provider=provider, extra=extra)


def clouds_at_hand(extra: Mapping[str, Any]) -> tuple[list[str], list[Presence]]:
    """The clouds whose credentials are present (offline), and the presence of the others."""
    found = [credentials.present(cloud, extra) for cloud in registry.clouds()]
    return [p.provider for p in found if p.found], [p for p in found if not p.found]


def rank(spec: ClusterSpec, max_price: float | None = None) -> Ranking:
    """Where `spec` may go, cheapest first: every cloud at hand when it names none, else its
    own provider (bounded by `max_price`). `ConfigError` when nowhere is left."""
    if spec.provider != ANYWHERE:
        if spec.provider not in registry.clouds():
            raise ConfigError(
                f"--max-price: provider {spec.provider!r} has no prices in the catalog; "
                f"clouds that do: {', '.join(registry.clouds())}"
            )
        return optimizer.rank(spec, [spec.provider], max_price=max_price)
    at_hand, missing = clouds_at_hand(spec.extra)
    if not at_hand:
        fixes = "; ".join(f"{p.provider}: {p.fix}" for p in missing)
        raise ConfigError(
            f"{spec.resources.gpus} on which cloud? no cloud's credentials were found "
            f"({fixes}); or name a provider with --provider (`cloudtrain check` says more)"
        )
    skipped = [p.text() for p in missing]
    return optimizer.rank(spec, at_hand, max_price=max_price, skipped=skipped)


def up(
    state: State,
    home: Path,
    spec: ClusterSpec,
    ranking: Ranking,
    on_event: OnEvent = ignore_event,
    *,
    bootstrap_timeout_s: float | None = 1800,
    before_unlock: Callable[[], None] | None = None,
) -> list[NodeInfo]:
    """`api.up` on each of `ranking`'s choices in turn until one has room (see the module's
    docstring; `before_unlock` as there). Returns the nodes; raises the last refusal when
    every choice failed."""
    choices = ranking.choices()
    failed: list[str] = []
    for i, choice in enumerate(choices):
        placed = on(spec, choice.provider)
        try:
            return api.up(
                state,
                home,
                placed,
                on_event,
                bootstrap_timeout_s=bootstrap_timeout_s,
                regions=choice.regions,
                before_unlock=before_unlock,
            )
        except FAIL_OVER as exc:
            failed.append(str(exc))
            if state.cluster(spec.name) is not None or len(choices) == 1:
                raise  # something is left there (complete or remove it there), or no other
            if i == len(choices) - 1:
                raise CapacityError(ANYWHERE, "NoCapacity", "; ".join(failed)) from exc
            following = choices[i + 1]
            on_event(
                Event(
                    "failover",
                    f"{exc}; trying {following.provider} ({', '.join(following.regions)})",
                )
            )
        except ConfigError:
            record = state.cluster(spec.name)
            if record is None or record.provider == choice.provider:
                raise
            # another `up` of this name placed it first, on another cloud: complete it there
            return api.up(
                state,
                home,
                on(spec, record.provider),
                on_event,
                bootstrap_timeout_s=bootstrap_timeout_s,
            )
    raise CapacityError(ANYWHERE, "NoOffer", "nowhere to try")  # `rank` never ranks nothing


def place(state: State, spec: ClusterSpec) -> ClusterSpec:
    """`spec` on its recorded cluster's provider when a cluster of that name exists (an `up`
    again completes it where it is), else `spec` unchanged."""
    record = state.cluster(spec.name)
    if spec.provider == ANYWHERE and record is not None:
        return on(spec, record.provider)
    return spec
