"""``cloudtrain check`` for GCP: are the credentials valid, and what GPU quota is left?

Calls, all read-only (``cloudtrain.check`` says what it makes of them):

    projects.get            validity; the project-wide quota ``GPUS_ALL_REGIONS`` (every GPU,
                            preemptible ones included, in every region)
    regions.get, per        the region's quota of each GPU of interest: ``NVIDIA_A100_GPUS``
    catalog region          (on-demand) and ``PREEMPTIBLE_NVIDIA_A100_GPUS`` (spot/preemptible)

Compute Engine answers limit and usage for each, in GPUs. A region's quota that cannot be read
is a finding; only ``projects.get`` decides whether the credentials are valid. (A project
without a preemptible quota of its own has preemptible GPUs counted against the on-demand one;
the check reports the quotas as Compute Engine lists them.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cloudtrain.check import GLOBAL, Finding, Quota, Report, unread
from cloudtrain.errors import CloudtrainError
from cloudtrain.providers.gcp._client import Clients, gcp_errors

if TYPE_CHECKING:
    from cloudtrain.plan.catalog import InstanceType

SDK: tuple[str, ...] = ("google.auth", "google.cloud.compute_v1")
EXTRA = "gcp"
CREDENTIALS_FIX = (
    "gcloud auth application-default login, or GOOGLE_APPLICATION_CREDENTIALS=key.json of an "
    "account that may use Compute Engine in the project (--project to name another)"
)
HOW = "https://console.cloud.google.com/iam-admin/quotas?project={project} (filter: {metric})"
PROJECT_WIDE = "GPUS_ALL_REGIONS"
#: the catalog's accelerator → its regional quota metric (preemptible: with PREEMPTIBLE_)
METRICS = {
    "V100": "NVIDIA_V100_GPUS",
    "A100": "NVIDIA_A100_GPUS",
    "A100-80GB": "NVIDIA_A100_80GB_GPUS",
}


def check(options: Mapping[str, Any], rows: Sequence[InstanceType]) -> Report:
    """The project, its GPUS_ALL_REGIONS quota and the regional GPU quotas of every region of
    `rows`. Raises the mapped error of ``projects.get`` (`AuthError` for refused credentials)."""
    clients = Clients(project=options.get("project") or None)
    project = clients.project
    with gcp_errors(f"project {project}"):
        found = clients.projects().get(project=project, timeout=clients.call_timeout_s)
    credentials = clients.credentials()
    account = getattr(credentials, "service_account_email", None)
    identity = f"project {project}" + (f" ({account})" if isinstance(account, str) else "")
    quotas: list[Quota] = []
    findings: list[Finding] = []
    all_needs = _needs(rows)
    for q in found.quotas:
        if q.metric == PROJECT_WIDE and all_needs:
            quotas.append(
                Quota(
                    GLOBAL,
                    PROJECT_WIDE,
                    q.limit,
                    q.usage,
                    "GPUs",
                    None,
                    all_needs,
                    HOW.format(project=project, metric=PROJECT_WIDE),
                )
            )
    for region in sorted({r.region for r in rows}):
        here = [r for r in rows if r.region == region]
        try:
            with gcp_errors(region):
                answer = clients.regions().get(
                    project=project, region=region, timeout=clients.call_timeout_s
                )
        except CloudtrainError as exc:
            findings.append(unread(f"the GPU quotas of {region}", exc, "compute.regions.get"))
            continue
        listed = {q.metric: q for q in answer.quotas}
        for accelerator in sorted({r.accelerator for r in here}):
            metric = METRICS.get(accelerator)
            needs = _needs(r for r in here if r.accelerator == accelerator)
            if metric is None:
                continue
            for spot, name in ((False, metric), (True, f"PREEMPTIBLE_{metric}")):
                if name in listed:
                    q = listed[name]
                    how = HOW.format(project=project, metric=name)
                    quotas.append(Quota(region, name, q.limit, q.usage, "GPUs", spot, needs, how))
                elif not spot:
                    findings.append(
                        Finding(
                            f"{region} lists no {name} quota: {accelerator} may not be offered "
                            "there to this project"
                        )
                    )
    return Report(identity, tuple(quotas), tuple(findings))


def _needs(rows: Iterable[InstanceType]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted({(r.instance_type, r.accelerator_count) for r in rows}))
