"""``cloudtrain check``: is each cloud usable from here, and for how many of which GPUs?

Per cloud, in this order, stopping at the first "no":

1. **present**: credentials are where the SDK's default chain looks first, offline
   (`cloudtrain.provision.credentials.present`); not present → no call is made.
2. **SDK**: the cloud's SDK is installed (``pip install 'cloudtrain[<cloud>]'`` otherwise).
3. **valid**: one read-only call that any identity may make (AWS STS GetCallerIdentity, GCP
   ``projects.get``, Azure the subscription's resource groups): its answer names the identity.
4. **quotas**: the quotas that govern the GPU machines of interest (the catalog's rows of this
   cloud, or those of ``--gpus``), per catalog region, with their limit and, where the API says
   it, what is used. A quota that cannot be read is a finding, not a failure of the cloud.

Each cloud's calls live in its package, handed over by its plugin
(`cloudtrain.provision.plugin.Plugin.quota`, a `QuotaCheck`) when that cloud is checked, so this
module imports no SDK: the modules the calls need (``SDK``), the extra that installs them
(``EXTRA``), what to do when the cloud refuses the credentials (``CREDENTIALS_FIX``) and
``check(options, rows) -> Report``, which raises a `CloudtrainError` when the validity call fails
and blocks for a few calls.

A cloud is **usable** when its credentials are valid and, where quotas were read, at least one
machine of interest fits in what they leave (`Room`). Every problem found comes with what to do
about it (`Finding`). Nothing here changes anything in any account.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import AuthError, CloudtrainError, ConfigError, ProviderError

if TYPE_CHECKING:
    from cloudtrain.plan.catalog import InstanceType
    from cloudtrain.provision.plugin import QuotaCheck

#: `Quota.region` of a quota that holds in every region (GCP's GPUS_ALL_REGIONS).
GLOBAL = "global"
RETRY_FIX = "retry; if it persists, check the network, any proxy and the endpoint settings"


@dataclass(frozen=True)
class Quota:
    """One quota as the cloud reports it.

    `used` is None when the API does not say (the limit is then all that is known); `spot`
    is True for a quota of spot/preemptible machines only, False for on-demand only, None
    for both; `needs` is what one node of each machine type of interest takes of it (in
    `unit`), which also says which machines it governs; `how` says how to raise it."""

    region: str
    name: str
    limit: float
    used: float | None
    unit: str
    spot: bool | None = None
    needs: tuple[tuple[str, int], ...] = ()
    how: str = ""

    @property
    def left(self) -> float:
        """What is left of the limit (the whole limit when the usage is unknown)."""
        return max(self.limit - (self.used or 0.0), 0.0)

    def governs(self, row: InstanceType, spot: bool) -> bool:
        return (
            self.region in (GLOBAL, row.region)
            and self.spot in (None, spot)
            and row.instance_type in dict(self.needs)
        )


@dataclass(frozen=True)
class Finding:
    """A problem, and what to do about it (empty when there is nothing to do); `blocks`: `up`
    would fail because of it (a verb the credentials may not use), so the cloud is not usable."""

    problem: str
    fix: str = ""
    blocks: bool = False


@dataclass(frozen=True)
class Report:
    """What a provider's ``_check.check`` found: who the credentials are, the quotas read,
    and problems met on the way (a quota it could not read) with what to do about them."""

    identity: str
    quotas: tuple[Quota, ...] = ()
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class Room:
    """How many nodes of one machine of interest the read quotas leave room for, in one
    region, on-demand or spot (None: no quota read governs it)."""

    row: InstanceType
    spot: bool
    nodes: int | None


@dataclass(frozen=True)
class CloudCheck:
    """The answer for one cloud. `valid` is None when it was not asked (no credentials
    present, or its SDK is missing); `offered` is False when the catalog has no machine of
    the GPUs asked for on this cloud."""

    provider: str
    present: bool
    source: str = ""
    valid: bool | None = None
    identity: str = ""
    quotas: tuple[Quota, ...] = ()
    room: tuple[Room, ...] = ()
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    offered: bool = True

    @property
    def usable(self) -> bool:
        """Valid credentials, a machine of interest offered, no finding that blocks `up`, and
        room for at least one node of it where that is known (no quota read, or none
        governing: not known, so not held against the cloud)."""
        if not self.valid or not self.offered or any(f.blocks for f in self.findings):
            return False
        known = [r for r in self.room if r.nodes is not None]
        return not known or any(r.nodes for r in known)

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "usable": self.usable,
            "present": self.present,
            "source": self.source,
            "valid": self.valid,
            "offered": self.offered,
            "identity": self.identity,
            "quotas": [
                {
                    "region": q.region,
                    "name": q.name,
                    "limit": q.limit,
                    "used": q.used,
                    "left": q.left,
                    "unit": q.unit,
                    "spot": q.spot,
                    "instance_types": [t for t, _ in q.needs],
                }
                for q in self.quotas
            ],
            "room": [
                {
                    "instance_type": r.row.instance_type,
                    "gpus": r.row.gpus,
                    "region": r.row.region,
                    "spot": r.spot,
                    "nodes": r.nodes,
                }
                for r in self.room
            ],
            "findings": [
                {"problem": f.problem, "fix": f.fix, "blocks": f.blocks} for f in self.findings
            ],
        }


def unread(what: str, error: CloudtrainError, permission: str) -> Finding:
    """The finding for `what` (a quota, a usage) that could not be read because of `error`:
    worth a retry when the error is, else the `permission` to ask for."""
    text = str(error)
    if isinstance(error, ProviderError):
        text = text.removeprefix(f"{error.provider}: ")
    retry = isinstance(error, ProviderError) and error.retryable
    return Finding(f"{what} not read: {text}", RETRY_FIX if retry else f"allow {permission}")


def check_module(provider: str) -> QuotaCheck:
    """The cloud's part of the check (`Plugin.quota`: imports no SDK by itself); `ConfigError`
    for a provider that is no cloud."""
    from cloudtrain.provision.registry import plugin

    quota = plugin(provider).quota
    if quota is None:
        raise ConfigError(
            f"provider {provider!r} is no cloud: `cloudtrain check` has nothing to read"
        )
    return quota()


def check(
    provider: str,
    rows: Sequence[InstanceType],
    options: Mapping[str, Any] | None = None,
    *,
    wanted: str = "",
) -> CloudCheck:
    """Check one cloud (see the module docstring); `rows`: its machines of interest (none and
    `wanted` set: the catalog offers nothing of `wanted` there). Never raises a
    `CloudtrainError`: what fails becomes a `Finding`. Blocks for a few calls."""
    from cloudtrain.provision.credentials import present

    presence = present(provider, options)
    if not presence.found:
        return CloudCheck(
            provider, False, findings=(Finding("no credentials found", presence.fix),)
        )
    module = check_module(provider)
    missing = [name for name in module.SDK if not _importable(name)]
    if missing:
        return CloudCheck(
            provider,
            True,
            presence.source,
            findings=(
                Finding(
                    f"{', '.join(missing)} not installed",
                    f"pip install 'cloudtrain[{module.EXTRA}]'",
                ),
            ),
        )
    try:
        report: Report = module.check(dict(options or {}), rows)
    except CloudtrainError as exc:
        problem = str(exc).removeprefix(f"{provider}: ")
        return CloudCheck(
            provider, True, presence.source, False, findings=(Finding(problem, _fix(exc, module)),)
        )
    room = tuple(_room(report.quotas, rows))
    findings = list(report.findings)
    offered = bool(rows) or not wanted
    if not offered:
        findings.append(
            Finding(
                f"the catalog has no {wanted} machine on {provider}",
                "`cloudtrain gpus` lists what each cloud offers",
            )
        )
    findings += _short(report.quotas, room)
    return CloudCheck(
        provider,
        True,
        presence.source,
        True,
        report.identity,
        report.quotas,
        room,
        tuple(findings),
        offered,
    )


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _fix(error: CloudtrainError, module: QuotaCheck) -> str:
    if isinstance(error, AuthError):
        return str(module.CREDENTIALS_FIX)
    if isinstance(error, ProviderError) and error.retryable:
        return RETRY_FIX
    if isinstance(error, ConfigError):
        return ""  # its message says what to change
    return str(module.CREDENTIALS_FIX)


def _room(quotas: Sequence[Quota], rows: Sequence[InstanceType]) -> list[Room]:
    """For each machine of interest, on-demand (and spot, where it has a spot price): the
    nodes every quota governing it leaves room for; None when none governs it."""
    found = []
    for row in rows:
        for spot in (False, True):
            if spot and row.spot_usd_per_hour is None:
                continue
            fits = [
                int(q.left // dict(q.needs)[row.instance_type])
                for q in quotas
                if q.governs(row, spot) and dict(q.needs)[row.instance_type] > 0
            ]
            found.append(Room(row, spot, min(fits) if fits else None))
    return found


def _short(quotas: Sequence[Quota], room: Sequence[Room]) -> list[Finding]:
    """A finding per quota that leaves no room for even the smallest machine it governs
    (among those `room` considers: spot only where the catalog has a spot price)."""
    found = []
    for q in quotas:
        smallest = min((n for _, n in q.needs), default=0)
        if not any(q.governs(r.row, r.spot) for r in room):
            continue
        if smallest and q.left < smallest:
            kind = {True: " (spot)", False: " (on-demand)", None: ""}[q.spot]
            where = "every region" if q.region == GLOBAL else q.region
            found.append(
                Finding(
                    f"{q.name}{kind} in {where}: {_number(q.left)} {q.unit} left, the smallest "
                    f"machine of interest needs {smallest}",
                    f"raise it to at least {_number((q.used or 0) + smallest)} {q.unit}: {q.how}"
                    if q.how
                    else f"raise it to at least {_number((q.used or 0) + smallest)} {q.unit}",
                )
            )
    return found


def _number(value: float) -> str:
    return f"{value:g}"
