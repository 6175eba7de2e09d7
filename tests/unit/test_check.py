"""``cloudtrain.check`` without a cloud: what quotas leave room for, when a cloud is usable, what
to fix; and ``cloudtrain check``'s input, output and exit status (the clouds' own calls are
tested against their stand-ins, in tests/<cloud>/test_check.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import check as core
from cloudtrain.check import GLOBAL, CloudCheck, Finding, Quota, Room
from cloudtrain.cli.check_cmd import machines
from cloudtrain.errors import AuthError, ConfigError, ProviderError
from cloudtrain.plan.catalog import InstanceType, load
from tests.conftest import Cli

GCP_A100 = load().find(provider="gcp", accelerator="A100")
ONE, EIGHT = (next(r for r in GCP_A100 if r.accelerator_count == n) for n in (1, 8))
NEEDS = tuple((r.instance_type, r.accelerator_count) for r in GCP_A100)


def gpus(region: str, limit: float, used: float | None, spot: bool | None) -> Quota:
    return Quota(region, "GPUS", limit, used, "GPUs", spot, NEEDS, "ask for more")


def test_left_is_the_limit_less_what_is_used_never_below_zero() -> None:
    assert gpus("us-central1", 16, 10, False).left == 6
    assert gpus("us-central1", 16, None, False).left == 16  # usage unknown: the limit
    assert gpus("us-central1", 4, 10, False).left == 0


def test_room_is_what_every_governing_quota_leaves() -> None:
    quotas = [
        gpus(GLOBAL, 12, 0, None),  # every region, on-demand and spot
        gpus("us-central1", 16, 8, False),  # on-demand only
        gpus("us-central1", 32, 0, True),  # spot only
        gpus("europe-west4", 0, 0, False),  # another region: governs nothing here
    ]
    room = {(r.row.instance_type, r.spot): r.nodes for r in core._room(quotas, [ONE, EIGHT])}
    assert room == {
        (ONE.instance_type, False): 8,  # the region's 8 left, under the project's 12
        (ONE.instance_type, True): 12,  # the project's 12, under the region's 32
        (EIGHT.instance_type, False): 1,
        (EIGHT.instance_type, True): 1,
    }
    assert [r.nodes for r in core._room([], [ONE])] == [None, None]  # nothing known


def test_usable_means_valid_and_room_for_a_node_where_it_is_known() -> None:
    def cloud(valid: bool | None, *nodes: int | None) -> CloudCheck:
        return CloudCheck("gcp", True, valid=valid, room=tuple(Room(ONE, False, n) for n in nodes))

    assert cloud(True).usable  # no quota read: not held against it
    assert cloud(True, None).usable
    assert cloud(True, 0, 2).usable
    assert not cloud(True, 0, 0).usable
    assert not cloud(True, 0, None).usable  # what is known leaves no room
    assert not cloud(False).usable
    assert not cloud(None).usable


def test_a_short_quota_says_how_far_to_raise_it() -> None:
    quotas = [gpus("us-central1", 10, 10, False), gpus("us-central1", 0, 0, True)]
    room = core._room(quotas, [ONE, EIGHT])
    [on_demand, spot] = core._short(quotas, room)
    assert on_demand == Finding(
        "GPUS (on-demand) in us-central1: 0 GPUs left, the smallest machine of interest needs 1",
        "raise it to at least 11 GPUs: ask for more",
    )
    assert spot.problem.startswith("GPUS (spot) in us-central1: 0 GPUs left")
    # a quota governing no machine considered (spot where the catalog knows no spot price)
    no_spot_price = [r for r in load().find(provider="gcp") if r.spot_usd_per_hour is None]
    assert core._short([gpus("us-central1", 0, 0, True)], core._room([], no_spot_price)) == []


def test_an_unreadable_quota_asks_for_a_permission_or_a_retry() -> None:
    denied = AuthError("gcp", "FORBIDDEN", "no")
    flaky = ProviderError("gcp", "HTTP_502", "a proxy", retryable=True)
    assert core.unread("X", denied, "compute.regions.get") == Finding(
        "X not read: FORBIDDEN: no", "allow compute.regions.get"
    )
    assert core.unread("X", flaky, "compute.regions.get").fix == core.RETRY_FIX


def _no_logins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine with no cloud login at all: an empty HOME, no credentials in the env."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "CLOUDSDK_CONFIG",
        "AZURE_CONFIG_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_no_credentials_present_means_no_call_and_a_fix(
    provider: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_logins(monkeypatch, tmp_path)

    def no_call(options: Mapping[str, Any], rows: Sequence[InstanceType]) -> core.Report:
        raise AssertionError("a cloud was called without credentials")

    monkeypatch.setattr(core.check_module(provider), "check", no_call)
    result = core.check(provider, load().find(provider=provider))
    assert (result.present, result.valid, result.usable) == (False, None, False)
    [finding] = result.findings
    assert finding.problem == "no credentials found"
    assert finding.fix


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # AWS keys are in the env (conftest)
    result = core.check("aws", load().find(provider="aws"))
    assert (result.present, result.valid, result.usable) == (True, None, False)
    assert result.findings == (Finding("boto3 not installed", "pip install 'cloudtrain[aws]'"),)


def test_the_machines_of_interest_come_from_the_catalog() -> None:
    assert machines("gcp", ()) == load().find(provider="gcp")
    assert {r.accelerator_count for r in machines("gcp", ("a100",))} == {1, 2, 4, 8, 16}
    assert [r.instance_type for r in machines("gcp", ("A100:8", "V100:8"))] == [
        "n1-highmem-64+8xnvidia-tesla-v100",
        "a2-highgpu-8g",
    ]
    assert machines("azure", ("V100:1",)) == []  # retired there
    with pytest.raises(ConfigError, match="unknown accelerator 'H100'"):
        machines("aws", ("H100:8",))


# -- the command ---------------------------------------------------------------------------------


@dataclass
class Clouds:
    """Stands for `cloudtrain.check.check`: answers `clouds.answers[provider]` (default: usable) and
    records what it was asked: (provider, how many machines, options, --gpus)."""

    answers: dict[str, CloudCheck] = field(default_factory=dict)
    asked: list[tuple[str, int, dict[str, Any], str]] = field(default_factory=list)

    def __call__(
        self,
        provider: str,
        rows: Sequence[InstanceType],
        options: Mapping[str, Any] | None = None,
        *,
        wanted: str = "",
    ) -> CloudCheck:
        self.asked.append((provider, len(rows), dict(options or {}), wanted))
        usable = CloudCheck(provider, True, "env", True, f"{provider} me")
        return self.answers.get(provider, usable)


@pytest.fixture
def clouds(monkeypatch: pytest.MonkeyPatch) -> Clouds:
    double = Clouds()
    monkeypatch.setattr(core, "check", double)
    return double


def not_usable(provider: str) -> CloudCheck:
    return CloudCheck(provider, False, findings=(Finding("no credentials found", "log in"),))


def test_every_cloud_is_checked_and_one_usable_is_enough(run_cli: Cli, clouds: Clouds) -> None:
    clouds.answers["gcp"] = not_usable("gcp")
    done = run_cli("check", "--json")
    assert done.exit_code == 0
    data = json.loads(done.output)
    assert [c["provider"] for c in data["clouds"]] == ["aws", "azure", "gcp", "kubernetes"]
    assert data["usable"] == ["aws", "azure", "kubernetes"]
    said = {"problem": "no credentials found", "fix": "log in", "blocks": False}
    assert data["clouds"][2]["findings"] == [said]

    for name in ("aws", "azure", "kubernetes"):
        clouds.answers[name] = not_usable(name)
    assert run_cli("check").exit_code == 1


def test_a_cloud_named_must_be_usable(run_cli: Cli, clouds: Clouds) -> None:
    clouds.answers["azure"] = not_usable("azure")
    assert run_cli("check", "--provider", "aws").exit_code == 0
    done = run_cli("check", "--provider", "aws", "--provider", "azure")
    assert done.exit_code == 1
    assert "azure: no credentials found\n      → log in" in done.output
    assert "aws me" in done.output


def test_gpus_and_account_options_reach_the_clouds(run_cli: Cli, clouds: Clouds) -> None:
    done = run_cli(
        "check", "--provider", "aws", "--provider", "gcp", "--gpus", "A100:8", "--profile", "dev"
    )
    assert done.exit_code == 0, done.output
    assert clouds.asked == [("aws", 3, {"profile": "dev"}, "A100:8"), ("gcp", 1, {}, "A100:8")]
    assert "nothing to fix" in done.output


def test_bad_input_is_refused_before_any_call(run_cli: Cli, clouds: Clouds) -> None:
    bad_gpus = run_cli("check", "--gpus", "H100:8")
    assert bad_gpus.exit_code == 2
    bad_option = run_cli("check", "--provider", "aws", "-o", "project=p1")
    assert bad_option.exit_code == 2
    assert "no cloud checked takes 'project'" in bad_option.output
    assert run_cli("check", "--provider", "ssh").exit_code == 2
    assert clouds.asked == []
