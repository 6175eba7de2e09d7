"""Providers by name: built-in, planned, and added by other packages through entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.fake.provider import FakeProvider
from cloudtrain.provision import registry
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import SpecError, validate_provider


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


def test_the_package_declares_its_providers_as_entry_points() -> None:
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)}
    assert names["local"] == registry.BUILTIN["local"]
    assert names["fake"] == registry.BUILTIN["fake"]


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
    assert list(registry.known()) == sorted({*registry.BUILTIN, *registry.PLANNED, "mycloud"})


def test_a_value_that_is_no_name_is_not_known() -> None:
    assert [1] not in registry.known()
    assert None not in registry.available()
