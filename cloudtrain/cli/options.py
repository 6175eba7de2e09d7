"""Each provider's own options as flags: built from what the providers declare
(`cloudtrain.provision.provider.Option`), and checked against the provider a task names.

A flag is ``--`` + the option's key (``known_hosts`` → ``--known-hosts``); one flag may be
declared by several providers. ``-o KEY=VALUE`` carries the options of a provider from another
package, whose declarations are not read until it is named.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from cloudtrain.provision.provider import Option


def listed() -> list[str]:
    """The built-in providers a user may choose (not those for tests)."""
    from cloudtrain.provision import registry

    return [p.name for p in registry.builtin() if not p.for_tests]


def _declared() -> dict[str, list[tuple[str, Option]]]:
    """Every built-in provider's options by flag: [(provider, option)] (one flag may be
    declared by several providers)."""
    from cloudtrain.provision import registry

    flags: dict[str, list[tuple[str, Option]]] = {}
    for pname, declared in registry.builtin_options().items():
        for opt in declared:
            flags.setdefault(opt.cli, []).append((pname, opt))
    return flags


def _dest(flag: str) -> str:
    return "opt_" + flag.lstrip("-").replace("-", "_")


_KINDS: dict[str, Any] = {
    "path": click.Path(dir_okay=False, path_type=Path),
    "hours": click.FloatRange(min=0, min_open=True),
    "usd": click.FloatRange(min=0, max=999_999),
}


def provider_options(account_only: bool = False) -> list[Any]:
    """One flag per declared option (only those naming an account, for `down`), and
    ``--option KEY=VALUE`` for what a plugin provider declares."""
    made = []
    for flag, owners in _declared().items():
        opt = owners[0][1]
        if account_only and not opt.account:
            continue
        text = " ".join(dict.fromkeys(o.help for _, o in owners))  # one shared Option: once
        if opt.kind == "flag":
            made.append(click.option(flag, _dest(flag), is_flag=True, default=None, help=text))
        else:
            made.append(click.option(flag, _dest(flag), type=_KINDS.get(opt.kind), help=text))
    made.append(
        click.option(
            "--option",
            "-o",
            "opt_generic",
            multiple=True,
            metavar="KEY=VALUE",
            help="A provider's own option by its key (for providers from other packages).",
        )
    )
    return made


def with_account_options(fn: Any) -> Any:
    for option in reversed(provider_options(account_only=True)):
        fn = option(fn)
    return fn


def given_options(provider: str, flags: Mapping[str, Any]) -> dict[str, tuple[Option, Any]]:
    """The provider options given as flags, as typed, checked against what `provider`
    declares: a flag of another provider is refused, naming whose it is and what `provider`
    takes."""
    from cloudtrain.errors import ConfigError
    from cloudtrain.provision import registry

    declared = {o.key: o for o in registry.options(provider)}
    given: dict[str, tuple[Option, Any]] = {}
    for flag, owners in _declared().items():
        value = flags.get(_dest(flag))
        if value is None:
            continue
        opt = next((o for p, o in owners if p == provider), None)
        if opt is None:
            whose = ", ".join(p for p, _ in owners)
            takes = ", ".join(o.cli for o in declared.values()) or "none"
            raise ConfigError(
                f"{flag} is an option of {whose}, not of provider {provider!r}; "
                f"{provider} takes: {takes}"
            )
        given[opt.key] = (opt, value)
    for item in flags.get("opt_generic") or ():
        key, sep, value = str(item).partition("=")
        if not sep or key not in declared:
            allowed = ", ".join(declared) or "none"
            raise ConfigError(
                f"--option {item!r}: provider {provider!r} has no option {key!r}; "
                f"allowed: {allowed} (write KEY=VALUE)"
            )
        opt = declared[key]
        given[key] = (opt, value.lower() in ("1", "true", "yes") if opt.kind == "flag" else value)
    return given


def provider_settings(provider: str, flags: Mapping[str, Any]) -> dict[str, Any]:
    """`given_options` as the provider reads them: files made absolute, empty values left out."""
    settings: dict[str, Any] = {}
    for key, (opt, value) in given_options(provider, flags).items():
        if opt.kind == "path":
            value = str(Path(value).expanduser().resolve())
        if value not in ("", False):
            settings[key] = value
    return settings


def loose_settings(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The provider options given as flags, by key, where no one provider is named (``down
    --all`` looks in every provider that has a record)."""
    return {
        owners[0][1].key: flags[_dest(flag)]
        for flag, owners in _declared().items()
        if flags.get(_dest(flag)) is not None
    }


# -- names on the command line --------------------------------------------------------------------


def cluster_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a cluster name given to any command is checked the one way `up` checks
    it, before it reaches a path, a lock, a filter or a record."""
    from cloudtrain.spec import validate_name

    return None if value is None else validate_name(value, "cluster")


def job_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback: a job id, checked before it is looked up."""
    from cloudtrain.spec import validate_job_id

    return validate_job_id(value)


# -- moments on the command line ------------------------------------------------------------------

#: A duration back from now: ``30d``, ``12h``, ``90m``.
_AGO = re.compile(r"([0-9]{1,6})([dhm])")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60}
SINCE_HELP = "30d, 12h, 90m (back from now), or an ISO date or time (2026-11-01, 2026-11-01T09:30)"


def parse_since(text: str, now: float, flag: str = "--since") -> float:
    """The moment `text` names: ``30d``, ``12h`` or ``90m`` before `now`, or an ISO date (its
    midnight) or date and time, in local time unless it gives its offset. `ConfigError`
    naming `flag`, the value and what is allowed, for anything else or a moment after
    `now`."""
    import datetime

    from cloudtrain.errors import ConfigError

    value = text.strip()
    ago = _AGO.fullmatch(value)
    if ago:
        return now - int(ago.group(1)) * _UNIT_S[ago.group(2)]
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give {SINCE_HELP}") from None
    at = moment.timestamp()  # a naive one is local time
    if at > now:
        raise ConfigError(f"{flag} {text!r} is in the future; give {SINCE_HELP}")
    return at
