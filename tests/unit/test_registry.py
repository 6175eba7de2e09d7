"""Providers by name: built-in, planned, and added by other packages through entry points."""

from __future__ import annotations

import sys
import types
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.plan.prices import PriceListError, Reading
from cloudtrain.providers.fake.provider import FakeProvider
from cloudtrain.provision import credentials, registry
from cloudtrain.provision.credentials import Presence
from cloudtrain.provision.plugin import Plugin
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import SpecError, validate_provider

PROVIDERS = Path(registry.__file__).parents[1] / "providers"


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party provider, registered the way a package would (an entry point)."""
    point = EntryPoint("mycloud", "cloudtrain.providers.fake.provider:FakeProvider",
                       registry.GROUP)  # fmt: skip
    monkeypatch.setattr(registry, "_plugins", lambda: {point.name: point.value})


def test_builtin_and_planned_names(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"local", "fake", "aws", "gcp", "azure", "ssh"} <= set(registry.available())
    monkeypatch.setattr(registry, "PLANNED", ("lambda",))
    assert "lambda" in registry.known()
    with pytest.raises(ConfigError, match="provider 'lambda' is planned but not implemented"):
        registry.create("lambda", ProviderContext(home=Path("/nonexistent")))
    with pytest.raises(ConfigError, match="provider 'nimbus' is not known; known: aws"):
        registry.create("nimbus", ProviderContext(home=Path("/nonexistent")))
    with pytest.raises(SpecError, match="did you mean 'local'"):
        validate_provider("locl", registry.known())


@pytest.mark.usefixtures("plugin")
def test_a_plugin_provider_is_known_and_built(tmp_path: Path) -> None:
    assert "mycloud" in registry.known()
    assert validate_provider("mycloud", registry.known()) == "mycloud"
    provider = registry.create("mycloud", ProviderContext(home=tmp_path))
    assert isinstance(provider, FakeProvider)


def test_a_plugin_object_is_what_an_entry_point_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The contract of a third-party package: its entry point names a `Plugin`; the core reads
    its options, its credentials check and its class from it, and nothing else."""
    mine = Plugin(
        "mycloud",
        lambda: FakeProvider,
        credentials=lambda o: Presence("mycloud", True, "here"),
        prices=lambda rows: Reading({}),
    )
    monkeypatch.setitem(sys.modules, "mycloud_plugin", types.SimpleNamespace(PLUGIN=mine))
    monkeypatch.setattr(registry, "_plugins", lambda: {"mycloud": "mycloud_plugin:PLUGIN"})
    assert registry.plugin("mycloud") is mine
    assert "mycloud" in registry.clouds(), "priced, its credentials known offline: a cloud"
    assert "mycloud" not in registry.checked(), "no quota reader: not checked"
    assert credentials.present("mycloud").source == "here"
    assert isinstance(registry.create("mycloud", ProviderContext(home=tmp_path)), FakeProvider)
    monkeypatch.setattr(registry, "_plugins", lambda: {"mycloud": "mycloud_plugin:NOTHING"})
    with pytest.raises(ConfigError, match="provider 'mycloud': its package gives no `Plugin`"):
        registry.plugin("mycloud")
    monkeypatch.setattr(registry, "_plugins", lambda: {"mycloud": "no_such_package_here:PLUGIN"})
    with pytest.raises(ConfigError, match="provider 'mycloud': no_such_package_here cannot be imp"):
        registry.plugin("mycloud")


def test_the_built_in_providers_are_the_folders_each_with_its_plugin() -> None:
    """A built-in provider is a folder of cloudtrain/providers: no list to edit in the core."""
    folders = {p.name for p in (PROVIDERS).iterdir() if (p / "__init__.py").is_file()}
    assert {p.name for p in registry.builtin()} == folders
    assert registry.default() == "local"
    assert registry.clouds() == ["aws", "azure", "gcp"]
    assert registry.checked() == ["aws", "azure", "gcp", "kubernetes"]
    # slurm: not offered until sites without a shared home are served (issue 30)
    assert [p.name for p in registry.builtin() if p.for_tests] == ["fake"]
    for plugin in registry.builtin():
        assert plugin.provider().name == plugin.name


def test_a_built_in_name_is_known_without_reading_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every `up` validates its provider: a built-in one must not cost the entry-point scan."""

    def scan() -> dict[str, str]:
        raise AssertionError("entry points read for a built-in name")

    monkeypatch.setattr(registry, "_plugins", scan)
    assert "aws" in registry.known()
    assert validate_provider("local", registry.known()) == "local"
    monkeypatch.setattr(registry, "_plugins", lambda: {"mycloud": "x:Y"})
    assert "mycloud" in registry.known()
    assert list(registry.known()) == sorted(
        {*registry.builtin_options(), *registry.PLANNED, "mycloud"}
    )


def test_a_value_that_is_no_name_is_not_known() -> None:
    assert [1] not in list[object](registry.known())
    assert None not in registry.available()


@pytest.mark.parametrize("name", ["aws", "azure", "gcp"])
def test_each_clouds_plugin_hands_over_what_the_core_calls(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What a built-in cloud's `laid_out` plugin loads is what `check`, the optimizer and the
    price update call: a `QuotaCheck`, an offline presence, a reader of rows."""
    for variable in ("HOME", "XDG_CONFIG_HOME", "CLOUDSDK_CONFIG"):
        monkeypatch.setenv(variable, str(tmp_path))
    plugin = registry.plugin(name)
    assert plugin.quota is not None
    assert plugin.credentials is not None
    assert plugin.prices is not None
    quota = plugin.quota()
    assert quota.SDK
    assert name == quota.EXTRA
    assert quota.CREDENTIALS_FIX
    assert callable(quota.check)
    presence = plugin.credentials({})
    assert isinstance(presence, Presence)
    assert presence.provider == name
    if name == "gcp":  # its reader needs credentials before it reads anything
        with pytest.raises(PriceListError, match="no credentials"):
            plugin.prices([])
    else:
        assert plugin.prices([]).quotes == {}, "no rows asked: nothing read"


def test_a_checkpoint_bucket_is_opened_by_the_plugin_of_its_scheme() -> None:
    from cloudtrain.spec import BucketURL

    url = BucketURL("ckpts", "team/run")
    store = registry.store(url)
    assert type(store).__module__ == "cloudtrain.providers.aws._store"
    assert "boto3" not in repr(vars(store)), "no SDK client made before a call needs it"
    assert registry.bucket_url("s3://ckpts/team/run/") == url
    with pytest.raises(ConfigError, match=r"^checkpoint 'zz://ckpts/team/run': no provider keeps "
                       r"checkpoints at zz://; write .*s3://BUCKET/PREFIX"):  # fmt: skip
        registry.bucket_url("zz://ckpts/team/run")
