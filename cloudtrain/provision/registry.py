"""Providers by name: the built-in ones and any registered by other packages.

A third-party package adds a provider with an entry point::

    [project.entry-points."cloudtrain.providers"]
    mycloud = "mycloud_cloudtrain.provider:MyCloudProvider"

The class is built with a `ProviderContext`. Built-in providers are looked up without reading
entry points, so `cloudtrain` starts fast; clouds that are planned but not built yet are known
by name so that a user gets a clear answer instead of "unknown provider".
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from cloudtrain.errors import ConfigError

if TYPE_CHECKING:
    from cloudtrain.model import Capability
    from cloudtrain.provision.provider import Option, Provider, ProviderContext

GROUP = "cloudtrain.providers"

BUILTIN: dict[str, str] = {
    "local": "cloudtrain.providers.local.provider:LocalProvider",
    "fake": "cloudtrain.providers.fake.provider:FakeProvider",
    "aws": "cloudtrain.providers.aws.provider:AwsProvider",
    "ssh": "cloudtrain.providers.ssh.provider:SshProvider",
    "gcp": "cloudtrain.providers.gcp.provider:GcpProvider",
    "azure": "cloudtrain.providers.azure.provider:AzureProvider",
}

#: The clouds: their prices are in the catalog, and whether their credentials are present is
#: known offline (`cloudtrain.provision.credentials`); the optimizer chooses among them.
CLOUDS: tuple[str, ...] = ("aws", "azure", "gcp")

#: Where a cluster goes when its task names no provider: this machine.
DEFAULT = "local"

#: Built in for the tests only: known, but not offered in the CLI's help.
FOR_TESTS: tuple[str, ...] = ("fake",)

#: Cloud providers this version knows of and can plan (the catalog has them) but cannot create.
PLANNED: tuple[str, ...] = ()


@cache
def _plugins() -> dict[str, str]:
    from importlib.metadata import entry_points  # ~25 ms: only when a name is not built in

    return {ep.name: ep.value for ep in entry_points(group=GROUP) if ep.name not in BUILTIN}


class _Names(Sequence[str]):
    """Provider names, sorted: the built-in ones, the planned ones if `planned`, and plugins.
    Asking whether it holds a built-in (or planned) name reads no entry points (importing
    `importlib.metadata` and scanning every installed distribution cost ≈60 ms of each
    command's start); listing the names, or asking for another one, does."""

    def __init__(self, planned: bool) -> None:
        self._planned = PLANNED if planned else ()

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):  # a YAML list or number: no name, and unhashable
            return False
        return name in BUILTIN or name in self._planned or name in _plugins()

    def __getitem__(self, index: Any) -> Any:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def _names(self) -> tuple[str, ...]:
        return tuple(sorted({*BUILTIN, *self._planned, *_plugins()}))


def known() -> Sequence[str]:
    """Every provider name a spec may use: built-in, planned and plugins (read only when a
    name is not built in, or when they are listed)."""
    return _Names(planned=True)


def available() -> Sequence[str]:
    """The providers that can create clusters in this installation (plugins read as in
    `known`)."""
    return _Names(planned=False)


def provider_class(name: str) -> type[Provider]:
    """The class of the provider called `name` (its SDKs are imported only when it is built).
    Raises `ConfigError` if it is unknown or not built."""
    target = BUILTIN.get(name) or _plugins().get(name)
    if target is None:
        if name in PLANNED:
            raise ConfigError(
                f"provider {name!r} is planned but not implemented in this version of "
                f"cloudtrain; available now: {', '.join(available())} "
                f"(`cloudtrain up --provider {name} --dry-run` shows the plan and its price)"
            )
        raise ConfigError(f"provider {name!r} is not known; known: {', '.join(known())}")
    module_name, _, attr = target.partition(":")
    return cast("type[Provider]", getattr(importlib.import_module(module_name), attr))


def create(name: str, context: ProviderContext) -> Provider:
    """Build the provider called `name`. Raises `ConfigError` if it is unknown or not built."""
    return provider_class(name)(context)  # type: ignore[call-arg]


def options(name: str) -> tuple[Option, ...]:
    """What provider `name` takes beyond the spec. A built-in provider's are read from its
    package (``OPTIONS``), so the CLI builds its flags without importing any cloud's code."""
    if name in BUILTIN:
        package = BUILTIN[name].partition(":")[0].rpartition(".")[0]
        return cast("tuple[Option, ...]", importlib.import_module(package).OPTIONS)
    return provider_class(name).options


def offering(capability: Capability) -> list[str]:
    """The built-in providers (not those for tests) that have `capability`, for a message
    that says where to go instead."""
    return [n for n in BUILTIN
            if n not in FOR_TESTS and capability in provider_class(n).capabilities]  # fmt: skip


def builtin_options() -> dict[str, tuple[Option, ...]]:
    """Every built-in provider's options, by provider (for the CLI's flags)."""
    return {name: options(name) for name in BUILTIN}


def account_keys(provider: str | None = None) -> set[str]:
    """The option keys that name an account (of `provider`, or of any built-in one)."""
    names = [provider] if provider else list(BUILTIN)
    return {o.key for n in names for o in options(n) if o.account}


def account(extra: Mapping[str, Any], provider: str | None = None) -> dict[str, Any]:
    """The account a cluster was made in, from its recorded options."""
    keys = account_keys(provider)
    return {k: v for k, v in extra.items() if k in keys and v}
