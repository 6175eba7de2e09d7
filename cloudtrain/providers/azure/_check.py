"""``cloudtrain check`` for Azure: are the credentials valid, and what vCPU quota is left?

Calls, all read-only (``cloudtrain.check`` says what it makes of them):

    GET resourcegroups (first page)     validity: a token is issued and ARM accepts it for the
                                        subscription
    GET .../Microsoft.Compute/          per catalog location: the usage and limit of each VM
    locations/{loc}/usages              family's vCPUs (``FAMILIES``), of all regular vCPUs
                                        (``cores``) and of all Spot vCPUs (``lowPriorityCores``)

A regular VM must fit both its family's quota and ``cores``; a Spot VM only
``lowPriorityCores``. A location's usage that cannot be read is a finding; only the first call
decides whether the credentials are valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cloudtrain.check import Finding, Quota, Report, unread
from cloudtrain.errors import CloudtrainError
from cloudtrain.providers.azure._client import Clients, azure_errors

if TYPE_CHECKING:
    from cloudtrain.plan.catalog import InstanceType

SDK: tuple[str, ...] = ("azure.identity", "azure.mgmt.compute", "azure.mgmt.resource.resources")
EXTRA = "azure"
CREDENTIALS_FIX = (
    "az login, or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET of a principal with a "
    "role (Reader at least) on the subscription (--subscription or AZURE_SUBSCRIPTION_ID)"
)
HOW = (
    "request more in the portal (Subscriptions > Usage + quotas, {location}) or "
    "`az quota create` for Microsoft.Compute"
)
#: VM size → the usage name of its family's vCPU quota (ARM spells their case unevenly)
FAMILIES = {
    "Standard_NC6s_v3": "standardNCSv3Family",
    "Standard_NC12s_v3": "standardNCSv3Family",
    "Standard_NC24s_v3": "standardNCSv3Family",
    "Standard_ND40rs_v2": "standardNDSv2Family",
    "Standard_ND96asr_v4": "standardNDASv4_A100Family",
    "Standard_NC24ads_A100_v4": "StandardNCADSA100v4Family",
    "Standard_NC48ads_A100_v4": "StandardNCADSA100v4Family",
    "Standard_NC96ads_A100_v4": "StandardNCADSA100v4Family",
    "Standard_ND96amsr_A100_v4": "standardNDAMSv4_A100Family",
}
REGIONAL, SPOT = "cores", "lowPriorityCores"
#: how often a failed request is retried here (azure-core's default is 3, with back-off)
RETRIES = 1


def check(options: Mapping[str, Any], rows: Sequence[InstanceType]) -> Report:
    """The subscription, and the vCPU quotas of every location of `rows`. Raises the mapped
    error of the first call (`AuthError` for refused credentials)."""
    clients = Clients(options.get("subscription") or None, retries=RETRIES)
    subscription = clients.subscription
    with azure_errors(f"subscription {subscription}"):
        next(iter(clients.resources().resource_groups.list()), None)
    quotas: list[Quota] = []
    findings: list[Finding] = []
    for location in sorted({r.region for r in rows}):
        here = [r for r in rows if r.region == location]
        try:
            with azure_errors(location):
                usages = {
                    str(u.name.value).lower(): u
                    for u in clients.compute().usage.list(location)
                    if u.name is not None
                }
        except CloudtrainError as exc:
            what = f"the vCPU quotas of {location}"
            findings.append(unread(what, exc, "Microsoft.Compute/locations/usages/read"))
            continue
        families: dict[str, list[InstanceType]] = {}
        for r in here:
            if r.instance_type in FAMILIES:
                families.setdefault(FAMILIES[r.instance_type], []).append(r)
        wanted = [(REGIONAL, False, here), (SPOT, True, here)]
        wanted += [(family, False, governed) for family, governed in sorted(families.items())]
        for name, spot, governed in wanted:
            usage = usages.get(name.lower())
            if usage is None or usage.limit is None:
                findings.append(
                    Finding(
                        f"{location} lists no {name} quota: the sizes it governs may not be "
                        "offered there to this subscription"
                    )
                )
                continue
            quotas.append(
                Quota(
                    location,
                    str(usage.name.localized_value or name) if usage.name else name,
                    float(usage.limit),
                    None if usage.current_value is None else float(usage.current_value),
                    "vCPUs",
                    spot,
                    _needs(governed),
                    HOW.format(location=location),
                )
            )
    return Report(f"subscription {subscription}", tuple(quotas), tuple(findings))


def _needs(rows: Iterable[InstanceType]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted({(r.instance_type, r.vcpus) for r in rows}))
