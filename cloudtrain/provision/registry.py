"""Providers by name: the built-in ones and any registered by other packages.

A provider is one package whose ``PLUGIN`` (`cloudtrain.provision.plugin.Plugin`) is all the
core knows of it. The built-in ones are the folders of ``cloudtrain/providers/``, found by
listing that folder: adding one is adding a folder, and no line here names any. A third-party
package adds one with an entry point naming its plugin::

    [project.entry-points."cloudtrain.providers"]
    mycloud = "mycloud_cloudtrain:PLUGIN"

(a `Provider` class is taken too: a plugin of that class and its ``options``). Asking for a
built-in name lists a folder and imports that one package's ``__init__``, never an SDK, nor the
entry points (reading those scans every installed distribution: ≈60 ms of each command's start),
so `cloudtrain` starts fast. Clouds that are planned but not built yet are known by name so that
a user gets a clear answer instead of "unknown provider".
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import ConfigError
from cloudtrain.provision.plugin import Plugin
from cloudtrain.spec import BucketURL, parse_bucket_url

if TYPE_CHECKING:
    from cloudtrain.model import Capability
    from cloudtrain.provision.provider import Option, Provider, ProviderContext
    from cloudtrain.provision.store import ObjectStore, Store

GROUP = "cloudtrain.providers"
#: The package whose folders are the built-in providers.
BUILTIN_PACKAGE = "cloudtrain.providers"

#: Cloud providers this version knows of and can plan (the catalog has them) but cannot create.
PLANNED: tuple[str, ...] = ()


@cache
def _folders() -> tuple[str, ...]:
    """The built-in providers' names: the folders of `BUILTIN_PACKAGE` (nothing imported)."""
    package = importlib.import_module(BUILTIN_PACKAGE)
    return tuple(sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg))


@cache
def _plugins() -> dict[str, str]:
    from importlib.metadata import entry_points  # ~25 ms: only when a name is not built in

    return {ep.name: ep.value for ep in entry_points(group=GROUP) if ep.name not in _folders()}


def _load(name: str) -> Plugin:
    """The plugin of the provider `name`, built in or an entry point's (`ConfigError`: none)."""
    if name in _folders():
        found: object = getattr(
            importlib.import_module(f"{BUILTIN_PACKAGE}.{name}"), "PLUGIN", None
        )
    elif name in _plugins():
        module_name, _, attr = _plugins()[name].partition(":")
        try:
            found = importlib.import_module(module_name)
        except ImportError as exc:  # its package is broken or half installed
            raise ConfigError(
                f"provider {name!r}: {module_name} cannot be imported: {exc}"
            ) from None
        for part in filter(None, attr.split(".")):
            found = getattr(found, part, None)
    else:
        raise ConfigError(f"provider {name!r} is not known; known: {', '.join(known())}")
    if isinstance(found, type):  # a `Provider` class, the entry point's older form
        cls = found
        found = Plugin(name, lambda: cls, options=tuple(getattr(cls, "options", ())))
    if not isinstance(found, Plugin) or found.name != name:
        raise ConfigError(f"provider {name!r}: its package gives no `Plugin` named {name!r}")
    return found


class _Names(Sequence[str]):
    """Provider names, sorted: the built-in ones, the planned ones if `planned`, and plugins.
    Asking whether it holds a built-in (or planned) name reads no entry points; listing the
    names, or asking for another one, does."""

    def __init__(self, planned: bool) -> None:
        self._planned = PLANNED if planned else ()

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):  # a YAML list or number: no name, and unhashable
            return False
        return name in _folders() or name in self._planned or name in _plugins()

    def __getitem__(self, index: Any) -> Any:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def _names(self) -> tuple[str, ...]:
        return tuple(sorted({*_folders(), *self._planned, *_plugins()}))


def known() -> Sequence[str]:
    """Every provider name a spec may use: built-in, planned and plugins (read only when a
    name is not built in, or when they are listed)."""
    return _Names(planned=True)


def available() -> Sequence[str]:
    """The providers that can create clusters in this installation (plugins read as in
    `known`)."""
    return _Names(planned=False)


def plugin(name: str) -> Plugin:
    """The plugin of the provider called `name`. Raises `ConfigError` if it is unknown or not
    built."""
    if name in PLANNED and name not in _folders():
        raise ConfigError(
            f"provider {name!r} is planned but not implemented in this version of "
            f"cloudtrain; available now: {', '.join(available())} "
            f"(`cloudtrain up --provider {name} --dry-run` shows the plan and its price)"
        )
    return _load(name)


def builtin() -> list[Plugin]:
    """The built-in providers' plugins, those for tests included (no entry point read)."""
    return [_load(name) for name in _folders()]


def every() -> list[Plugin]:
    """Every provider's plugin: built in, then the entry points'."""
    return [*builtin(), *(_load(name) for name in sorted(_plugins()))]


def default() -> str:
    """Where a task that names no provider goes: the built-in provider that says it is the
    default (this machine)."""
    return next(p.name for p in builtin() if p.default)


def clouds() -> list[str]:
    """The clouds, sorted: the providers whose machines and prices are in the catalog and
    whose credentials are known offline (the optimizer chooses among them)."""
    return sorted(p.name for p in every() if p.cloud)


def checked() -> list[str]:
    """What `cloudtrain check` checks, sorted: the clouds, and the clusters a team runs whose
    credentials and quotas can be read (Kubernetes)."""
    return sorted(p.name for p in every() if p.checked)


def stores() -> dict[str, Store]:
    """The checkpoint buckets' schemes the plugins serve, each with its store."""
    return {p.store.scheme: p.store for p in every() if p.store is not None}


def bucket_url(value: object, field: str = "checkpoint") -> BucketURL:
    """The bucket URL `value`, its scheme one a plugin serves and allowed by that store's rule;
    `SpecError` (one line, naming `field` and what is allowed) otherwise."""
    return parse_bucket_url(value, field, stores())


def store(url: BucketURL) -> ObjectStore:
    """The bucket at `url` (from `bucket_url`), opened by the plugin whose `Store` serves its
    scheme; its SDK is not imported yet."""
    return next(p.store for p in every() if p.store and p.store.scheme == url.scheme).open(url)


def provider_class(name: str) -> type[Provider]:
    """The class of the provider called `name` (its SDKs are imported only when it is built).
    Raises `ConfigError` if it is unknown or not built."""
    return plugin(name).provider()


def create(name: str, context: ProviderContext) -> Provider:
    """Build the provider called `name`. Raises `ConfigError` if it is unknown or not built."""
    return provider_class(name)(context)  # type: ignore[call-arg]


def options(name: str) -> tuple[Option, ...]:
    """What provider `name` takes beyond the spec (read from its plugin: no SDK imported, so
    the CLI builds its flags without any cloud's code)."""
    return plugin(name).options


def offering(capability: Capability) -> list[str]:
    """The built-in providers (not those for tests) that have `capability`, for a message
    that says where to go instead."""
    return [p.name for p in builtin()
            if not p.for_tests and capability in p.provider().capabilities]  # fmt: skip


def builtin_options() -> dict[str, tuple[Option, ...]]:
    """Every built-in provider's options, by provider (for the CLI's flags)."""
    return {p.name: p.options for p in builtin()}


def account_keys(provider: str | None = None) -> set[str]:
    """The option keys that name an account (of `provider`, or of any built-in one)."""
    names = [provider] if provider else [p.name for p in builtin()]
    return {o.key for n in names for o in options(n) if o.account}


def account(extra: Mapping[str, Any], provider: str | None = None) -> dict[str, Any]:
    """The account a cluster was made in, from its recorded options."""
    keys = account_keys(provider)
    return {k: v for k, v in extra.items() if k in keys and v}
