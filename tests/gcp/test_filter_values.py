"""Values pasted into a GCE ``filter`` (``labels.K = "V"``, ``name = "N"``) are refused unless
they are in the label alphabet, so none can close the quoted string and add a term of its own;
through the real provider, before any request."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.gcp import _resources as res
from cloudtrain.providers.gcp._client import Clients
from tests.gcp import test_provider
from tests.gcp.standin import StandIn
from tests.gcp.test_provider import Make, a100

make = test_provider.make  # the fixture

HOSTILE = [
    'exp1" OR labels.cloudtrain-owner != "',  # a quote: another term
    "exp1\\",  # a backslash: escapes the closing quote
    "Exp1",  # outside the alphabet, though harmless
    "",
    "x" * 64,  # longer than a label value may be
]


def test_values_in_the_label_alphabet_make_the_exact_filter() -> None:
    assert res.label_filter("cloudtrain-cluster", "exp1") == 'labels.cloudtrain-cluster = "exp1"'
    assert res.label_filter("cloudtrain-owner", res.owner_label("Ann@Host.example")) == (
        'labels.cloudtrain-owner = "_41nn_40_48ost_2eexample"'
    )
    assert res.name_filter("nvidia-tesla-v100") == 'name = "nvidia-tesla-v100"'


@pytest.mark.parametrize("value", HOSTILE)
def test_any_other_value_is_refused_naming_it(value: str) -> None:
    builds: list[tuple[Callable[[], object], str]] = [
        (lambda: res.label_filter("cloudtrain-cluster", value), "cloudtrain-cluster"),
        (lambda: res.name_filter(value), "name"),
        (lambda: res.labels("exp1", "ann", value), "cluster id"),
        (lambda: res.description("exp1", "ann", value), "cluster id"),
    ]
    for build, what in builds:
        with pytest.raises(ConfigError) as err:
            build()
        assert str(err.value).startswith(f"{what} {value!r} is not in GCE's label alphabet")


@pytest.mark.parametrize("value", HOSTILE[:2])
def test_the_provider_sends_nothing_with_such_a_value(make: Make, gcp: StandIn, value: str) -> None:
    provider = make()
    for verb in (provider.describe, provider.leftovers, provider.terminate, provider.holders):
        with pytest.raises(ConfigError, match="is not in GCE's label alphabet"):
            verb(value)
    clients = Clients()
    with pytest.raises(ConfigError, match=re.escape(f"name {'cloudtrain-' + value!r} is")):
        res.policies(clients, value)
    with pytest.raises(ConfigError, match=re.escape(f"name {'nvidia' + value!r} is")):
        res.accelerator_zones(clients, f"nvidia{value}")
    assert gcp.calls() == []
    # a record's id (the core makes it; a hand-edited state file could hold anything)
    with pytest.raises(ConfigError, match=re.escape(f"cluster id {value!r} is")):
        provider.plan(dataclasses.replace(a100(), cluster_id=value))
    assert {c.name for c in gcp.calls()} == {"acceleratorTypes.aggregatedList"}  # reads only
