"""What a backend gives cloudtrain: one `Plugin`, the whole of a provider's contract with the core.

A provider is one package. Its ``__init__`` defines ``PLUGIN``, a `Plugin` that names the provider
and holds everything that differs per backend: the class that makes and removes its nodes, the
options it takes beyond the spec, and, for a cloud, the offline credentials check, `cloudtrain
check`'s quota reader and the price-list reader, and where its object storage keeps a job's
checkpoints. The core (`cloudtrain.provision.registry`)
reads nothing else of the package, and never a provider's name::

    # mycloud_cloudtrain/__init__.py
    def _provider() -> type[Provider]:
        from mycloud_cloudtrain.provider import MyCloudProvider  # its SDK: only when used
        return MyCloudProvider

    PLUGIN = Plugin("mycloud", _provider, options=OPTIONS)

A package laid out as the built-in ones are (``provider.py``; for a cloud ``_credentials.py``,
``_check.py``, ``_prices.py``; ``_store.py`` for a checkpoint store) says so in one line:
``PLUGIN = laid_out(__name__, "MyCloudProvider", OPTIONS, cloud=True, store="mc")``; the
provider is then named as the package's last part (``mycloud`` for ``mycloud_cloudtrain.
mycloud``), which is the name its entry point must have.

The loaders are functions, not imports, so that reading every plugin costs no SDK import (the
CLI builds its flags from ``options`` on every start); each is typed, so mypy checks what a
package hands over. A built-in provider is a folder of ``cloudtrain/providers/``; another
package's is an entry point of the group ``cloudtrain.providers`` naming its ``PLUGIN``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from cloudtrain.check import Report
    from cloudtrain.plan.catalog import InstanceType
    from cloudtrain.plan.prices import Reading
    from cloudtrain.provision.credentials import Presence
    from cloudtrain.provision.provider import Option, Provider
    from cloudtrain.provision.store import ObjectStore, Store
    from cloudtrain.spec import BucketURL


class QuotaCheck(Protocol):
    """A cloud's part of `cloudtrain check` (`cloudtrain.check`): the modules its SDK needs,
    the extra that installs them, what to do about bad credentials, and the read-only calls."""

    SDK: tuple[str, ...]
    EXTRA: str
    CREDENTIALS_FIX: str

    def check(self, options: Mapping[str, Any], rows: Sequence[InstanceType]) -> Report: ...


#: The price-list reader of a cloud (`cloudtrain.plan.prices`): the rows still sold → a reading.
PriceReader = Callable[[Sequence["InstanceType"]], "Reading"]


@dataclass(frozen=True)
class Plugin:
    """One provider as the core sees it.

    - `name`: what ``--provider`` takes, and what the catalog calls its rows;
    - `provider`: the `Provider` class (its SDK imported only when this is called);
    - `options`: what ``up --provider NAME`` takes beyond the spec;
    - `credentials`: whether its credentials are present, offline (`Presence`);
    - `quota`: its `QuotaCheck` for `cloudtrain check` (which checks every provider that has
      one and `credentials`);
    - `prices`: its price-list reader for ``cloudtrain catalog update``; a provider with one
      is a *cloud*: its machines are the catalog's, and the optimizer chooses among the clouds;
    - `store`: its object storage, where a task's ``checkpoint:`` bucket of that scheme is
      kept (`cloudtrain.provision.store`);
    - `default`: where a task that names no provider goes (one provider: this machine);
    - `for_tests`: known, but not offered in the CLI's help.
    """

    name: str
    provider: Callable[[], type[Provider]]
    options: tuple[Option, ...] = ()
    credentials: Callable[[Mapping[str, Any]], Presence] | None = None
    quota: Callable[[], QuotaCheck] | None = None
    prices: PriceReader | None = None
    default: bool = False
    for_tests: bool = False
    store: Store | None = None

    @property
    def cloud(self) -> bool:
        """Whether it is a cloud: its machines and prices are the catalog's."""
        return self.prices is not None and self.credentials is not None

    @property
    def checked(self) -> bool:
        """Whether `cloudtrain check` checks it: its credentials and its quotas are read."""
        return self.quota is not None and self.credentials is not None


def _attribute(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def laid_out(
    package: str,
    provider: str,
    options: tuple[Option, ...] = (),
    *,
    cloud: bool = False,
    checked: bool = False,
    default: bool = False,
    for_tests: bool = False,
    store: str | None = None,
    store_form: str = "BUCKET/PREFIX",
) -> Plugin:
    """The plugin of `package` (its ``__name__``), laid out as the built-in providers are:
    the class `provider` in ``provider.py``; for a `cloud`, ``_credentials.present(options)``,
    the ``_check`` module (a `QuotaCheck`) and ``_prices.read(rows)``; for one `checked` but
    with no prices in the catalog (a cluster the team runs), the first two; for a `store` (its URL
    scheme; `store_form`, its URLs after ``SCHEME://``), ``_store.open_store(url)`` and
    ``_store.refused(url)``. Each is imported when
    first used; `tests/unit/test_registry.py` loads every built-in one's."""
    from cloudtrain.provision.store import Store

    name = package.rpartition(".")[2]

    def open_store(url: BucketURL) -> ObjectStore:
        return cast("ObjectStore", _attribute(f"{package}._store", "open_store")(url))

    def refused(url: BucketURL) -> str | None:
        return cast("str | None", _attribute(f"{package}._store", "refused")(url))

    def load_provider() -> type[Provider]:
        return cast("type[Provider]", _attribute(f"{package}.provider", provider))

    def presence(given: Mapping[str, Any]) -> Presence:
        return cast("Presence", _attribute(f"{package}._credentials", "present")(dict(given)))

    def quota() -> QuotaCheck:
        return cast("QuotaCheck", importlib.import_module(f"{package}._check"))

    def read(rows: Sequence[InstanceType]) -> Reading:
        return cast("Reading", _attribute(f"{package}._prices", "read")(rows))

    return Plugin(
        name,
        load_provider,
        options,
        presence if cloud or checked else None,
        quota if cloud or checked else None,
        read if cloud else None,
        default,
        for_tests,
        Store(store, open_store, refused, store_form) if store else None,
    )
