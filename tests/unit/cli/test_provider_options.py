"""Providers' own options: declared by each provider, made into flags by the CLI, checked
against the provider the task names, and handed to it in the cluster's `extra`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from cloudtrain.cli.clusters import load_task
from cloudtrain.errors import ConfigError
from cloudtrain.providers.fake.provider import FakeProvider
from cloudtrain.provision import registry
from cloudtrain.provision.provider import Option
from tests.conftest import Cli


class PluginProvider(FakeProvider):
    """A provider from another package, with an option of its own."""

    options: ClassVar[tuple[Option, ...]] = (
        Option("endpoint", "mycloud: the API endpoint.", account=True),
        Option("fast", "mycloud: go fast.", kind="flag"),
    )


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_plugins", lambda: {"mycloud": f"{__name__}:PluginProvider"})


def test_every_builtin_option_is_a_flag_of_up(run_cli: Cli) -> None:
    text = run_cli("up", "--help").output
    for declared in registry.builtin_options().values():
        for opt in declared:
            assert opt.cli in text, opt


def test_a_flag_is_kept_for_the_provider_that_declares_it(tmp_path: Path) -> None:
    task = load_task(None, name="c1", provider="gcp", opt_project="p1", opt_network="lab")
    assert dict(task.cluster.extra) == {"project": "p1", "network": "lab"}
    with pytest.raises(ConfigError) as caught:
        load_task(None, name="c1", provider="gcp", opt_profile="dev")
    assert str(caught.value) == (
        "--profile is an option of aws, not of provider 'gcp'; gcp takes: --project, --network"
    )


def test_a_path_option_is_made_absolute_and_a_host_list_counts_the_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    task = load_task(None, name="c1", provider="ssh", opt_hosts="a@h1,b@h2,c@h3",
                     opt_identity="id_key")  # fmt: skip
    assert task.cluster.num_nodes == 3
    assert task.cluster.extra["identity"] == str(tmp_path / "id_key")
    given = load_task(None, name="c1", provider="ssh", opt_hosts="a@h1,b@h2", num_nodes="1")
    assert given.cluster.num_nodes == 1  # --nodes wins over the count


@pytest.mark.usefixtures("plugin")
def test_a_plugin_provider_takes_its_options_by_key() -> None:
    task = load_task(None, name="c1", provider="mycloud",
                     opt_generic=("endpoint=https://api.example", "fast=true"))  # fmt: skip
    assert dict(task.cluster.extra) == {"endpoint": "https://api.example", "fast": True}
    with pytest.raises(ConfigError, match=r"--option 'region=x': provider 'mycloud' has no "
                                          r"option 'region'; allowed: endpoint, fast"):  # fmt: skip
        load_task(None, name="c1", provider="mycloud", opt_generic=("region=x",))
    wrong = "--project is an option of gcp, not of provider 'mycloud'; mycloud takes: --endpoint"
    with pytest.raises(ConfigError, match=wrong):
        load_task(None, name="c1", provider="mycloud", opt_project="p1")
