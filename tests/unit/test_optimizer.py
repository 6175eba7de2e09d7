"""The optimizer: every cloud at hand ranked by price, cut into the runs `up` tries, and the
offline credentials check that says which clouds are at hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import anywhere
from cloudtrain.errors import CapacityError, ConfigError, QuotaError
from cloudtrain.model import Offer
from cloudtrain.plan.optimizer import ANYWHERE, Choice, Ranking, rank
from cloudtrain.provision.credentials import present
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources, task_from_dict
from cloudtrain.spec.taskfile import known
from cloudtrain.state import State

CLOUDS = ("aws", "azure", "gcp")


def _spec(gpus: str, *, spot: bool = False, nodes: int = 2, **extra: Any) -> ClusterSpec:
    name, _, count = gpus.partition(":")
    res = Resources(accelerator=name, count=int(count), spot=spot)
    return ClusterSpec(name="exp1", provider=ANYWHERE, num_nodes=nodes, resources=res,
                       extra=extra)  # fmt: skip


def _where(ranking: Ranking) -> list[tuple[str, str, float]]:
    return [(o.provider, o.region, o.price_per_node_hour) for o in ranking.offers]


def test_v100_1_is_ranked_across_clouds_and_a_retired_shape_is_said_why() -> None:
    ranking = rank(_spec("V100:1"), CLOUDS)
    assert _where(ranking) == [
        ("gcp", "us-central1", 2.95),
        ("aws", "us-east-1", 3.06),
        ("aws", "us-west-2", 3.06),
        ("aws", "eu-west-1", 3.305),
    ]
    assert ranking.choices() == [
        Choice("gcp", ("us-central1",)),
        Choice("aws", ("us-east-1", "us-west-2", "eu-west-1")),
    ]
    (azure,) = ranking.skipped
    assert azure.startswith("azure: azure retired Standard_NC6s_v3 (V100:1) on 2025-09-30")


def test_a100_8_on_demand_and_spot_rank_differently() -> None:
    assert [(p, r) for p, r, _ in _where(rank(_spec("A100:8"), CLOUDS))] == [
        ("azure", "eastus"),
        ("gcp", "us-central1"),
        ("aws", "us-east-1"),
        ("aws", "us-west-2"),
        ("aws", "eu-west-1"),
    ]
    spot = rank(_spec("A100:8", spot=True), CLOUDS)
    assert _where(spot) == [
        ("azure", "eastus", 2.992),
        ("aws", "us-east-1", 9.61),
        ("gcp", "us-central1", 14.431),
    ]
    assert all(o.spot for o in spot.offers)


def test_only_the_clouds_at_hand_are_ranked() -> None:
    ranking = rank(_spec("A100:8"), ["aws"], skipped=["gcp: no credentials (…)"])
    assert {o.provider for o in ranking.offers} == {"aws"}
    assert ranking.skipped == ("gcp: no credentials (…)",)


def test_max_price_bounds_the_offers_per_node_hour() -> None:
    ranking = rank(_spec("V100:1"), CLOUDS, max_price=3.06)
    assert [o.region for o in ranking.offers] == ["us-central1", "us-east-1", "us-west-2"]
    assert ranking.skipped[-1] == "1 offer(s) over --max-price 3.06 $/node-hour"
    with pytest.raises(ConfigError) as info:
        rank(_spec("V100:1"), CLOUDS, max_price=2.5)
    assert str(info.value) == (
        "--max-price 2.5: the cheapest offer of V100:1 is gcp us-central1 "
        "(n1-highmem-8+1xnvidia-tesla-v100) at $2.95/node-hour; raise it"
    )


def test_no_cloud_offering_the_shape_says_why_for_each() -> None:
    with pytest.raises(ConfigError) as info:
        rank(_spec("V100-32GB:1"), ["aws", "gcp"])
    message = str(info.value)
    assert message.startswith("no cloud at hand offers V100-32GB:1: aws: aws has no V100-32GB:1")
    assert "; gcp: gcp has no V100-32GB:1 machine" in message


def _offer(provider: str, region: str, price: float) -> Offer:
    return Offer(provider=provider, region=region, zones=(), instance_type="t",
                 price_per_node_hour=price, spot=False, accelerator="A100",
                 accelerator_count=8)  # fmt: skip


def test_a_cloud_comes_back_when_a_dearer_one_sits_between() -> None:
    ranking = Ranking((_offer("gcp", "a", 1), _offer("gcp", "b", 2), _offer("aws", "c", 3),
                       _offer("gcp", "d", 4)))  # fmt: skip
    assert ranking.choices() == [
        Choice("gcp", ("a", "b")),
        Choice("aws", ("c",)),
        Choice("gcp", ("d",)),
    ]


def test_a_task_naming_no_provider_goes_anywhere_with_gpus_and_stays_local_without() -> None:
    names = known()
    assert task_from_dict({"name": "a", "resources": {"accelerator": "A100:8"}},
                          names).cluster.provider == ANYWHERE  # fmt: skip
    assert task_from_dict({"name": "a"}, names).cluster.provider == "local"
    explicit = {"name": "a", "provider": "any", "resources": {"accelerator": "V100:1"}}
    assert task_from_dict(explicit, names).cluster.provider == ANYWHERE


# -- which clouds are at hand (offline) ---------------------------------------------------------


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No credentials of any cloud: a fresh HOME, no cloud variables."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SHARED_CREDENTIALS_FILE",
                 "AWS_CONFIG_FILE", "CLOUDSDK_CONFIG", "AZURE_CONFIG_DIR", "IDENTITY_ENDPOINT",
                 "MSI_ENDPOINT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_nothing_is_at_hand_on_a_bare_machine(bare: Path) -> None:
    assert [present(c).found for c in CLOUDS] == [False, False, False]
    with pytest.raises(ConfigError) as info:
        anywhere.rank(_spec("A100:8"))
    assert str(info.value).startswith(
        "A100:8 on which cloud? no cloud's credentials were found (aws: aws configure, "
        "AWS_PROFILE or --profile; azure: az login or "
    )


def test_aws_credentials_from_the_environment_or_a_profile(
    bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    assert present("aws").source == "the environment (AWS_ACCESS_KEY_ID)"
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (bare / ".aws").mkdir()
    (bare / ".aws" / "credentials").write_text(
        "[dev]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = secret\n"
    )
    assert not present("aws").found  # no default profile
    assert present("aws", {"profile": "dev"}).text() == (
        "aws: credentials from the shared credentials file, profile dev"
    )
    missing = present("aws", {"profile": "nope"})
    assert not missing.found
    assert "The config profile (nope) could not be found" in missing.fix


def test_gcp_needs_a_credentials_file_and_a_project(
    bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adc = bare / ".config" / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "c"}))
    assert present("gcp").fix.startswith("no project: --project, CLOUDSDK_CORE_PROJECT")
    (adc.parent / "configurations").mkdir()
    (adc.parent / "configurations" / "config_default").write_text("[core]\nproject = p7\n")
    assert present("gcp").text() == (
        "gcp: credentials from gcloud's application-default credentials, project p7"
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(bare / "missing.json"))
    assert "missing.json' is not a file" in present("gcp").fix


def test_azure_needs_credentials_and_a_subscription(
    bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = bare / ".azure" / "azureProfile.json"
    profile.parent.mkdir()
    profile.write_text("\ufeff" + json.dumps({"subscriptions": [{"id": "s1"}]}))
    assert present("azure").fix == "no subscription: --subscription or AZURE_SUBSCRIPTION_ID"
    assert present("azure", {"subscription": "s1"}).source == (
        "the Azure CLI's login, subscription s1"
    )
    monkeypatch.setenv("AZURE_CLIENT_ID", "c")
    monkeypatch.setenv("AZURE_TENANT_ID", "t")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "s")
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "s2")
    assert present("azure").source == "the environment (AZURE_CLIENT_SECRET), subscription s2"


# -- the failover between clouds (the real one runs against the stand-ins: tests/integration) --


def test_failover_moves_on_only_when_nothing_is_left_and_names_every_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = State.open(tmp_path)
    ranking = rank(_spec("V100:1", profile="dev", project="p1"), CLOUDS)
    tried: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []

    def refuse(state: State, home: Path, spec: ClusterSpec, *_: Any, **kw: Any) -> list[Any]:
        tried.append((spec.provider, kw["regions"], dict(spec.extra)))
        error = QuotaError if spec.provider == "gcp" else CapacityError
        raise error(spec.provider, "Full", "no room")

    monkeypatch.setattr("cloudtrain.api.up", refuse)
    events: list[str] = []
    with pytest.raises(CapacityError) as info:
        anywhere.up(state, tmp_path, _spec("V100:1", profile="dev", project="p1"), ranking,
                    lambda e: events.append(e.message))  # fmt: skip
    assert tried == [
        ("gcp", ("us-central1",), {"project": "p1"}),
        ("aws", ("us-east-1", "us-west-2", "eu-west-1"), {"profile": "dev"}),
    ]
    assert events == ["gcp: Full: no room; trying aws (us-east-1, us-west-2, eu-west-1)"]
    assert str(info.value) == "any: NoCapacity: gcp: Full: no room; aws: Full: no room"


def test_failover_stops_where_a_failed_attempt_left_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = State.open(tmp_path)
    spec = _spec("V100:1")
    calls: list[str] = []

    def half_made(state: State, home: Path, placed: ClusterSpec, *_: Any, **__: Any) -> list[Any]:
        calls.append(placed.provider)
        state.put_cluster(placed, status=ClusterStatus.PARTIAL)
        raise CapacityError(placed.provider, "NoCapacity", "room for one node of two")

    monkeypatch.setattr("cloudtrain.api.up", half_made)
    with pytest.raises(CapacityError, match="room for one node of two"):
        anywhere.up(state, tmp_path, spec, rank(spec, CLOUDS))
    assert calls == ["gcp"]  # never a second cluster of that name on aws
    assert anywhere.place(state, spec).provider == "gcp"  # `up` again completes it there
