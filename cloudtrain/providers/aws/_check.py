"""``cloudtrain check`` for AWS: are the credentials valid, and what P-instance quota is left?

Calls, all read-only (``cloudtrain.check`` says what it makes of them):

    sts GetCallerIdentity                   validity; the account and the caller's ARN
    service-quotas GetServiceQuota, per     "Running On-Demand P instances" (L-417A185B) and
    catalog region                          "All P Spot Instance Requests" (L-7212CCBC); both
                                            count vCPUs of every P instance type
    ec2 DescribeInstances, per region       what is used: the vCPUs of the pending and running
                                            P instances (spot ones against the spot quota)
    ec2 DescribeInstanceTypes, if needed    vCPUs of a running P type that the catalog lacks

A quota or usage that cannot be read (e.g. no ``servicequotas:GetServiceQuota`` permission) is
a finding; only the identity call decides whether the credentials are valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cloudtrain.check import Finding, Quota, Report, unread
from cloudtrain.errors import CloudtrainError
from cloudtrain.providers.aws._client import Clients, aws_errors, paginate

if TYPE_CHECKING:
    from cloudtrain.plan.catalog import InstanceType

SDK: tuple[str, ...] = ("boto3", "botocore")
EXTRA = "aws"
CREDENTIALS_FIX = (
    "check them with `aws sts get-caller-identity`; set others with aws configure, "
    "AWS_PROFILE or --profile"
)
#: quota code → (name, spot): the EC2 quotas of P instances, in vCPUs
QUOTAS = {
    "L-417A185B": ("Running On-Demand P instances", False),
    "L-7212CCBC": ("All P Spot Instance Requests", True),
}
HOW = "request an increase in the Service Quotas console (EC2, {code}) or `aws service-quotas "
HOW += "request-service-quota-increase --service-code ec2 --quota-code {code} --region {region}`"
GET_QUOTA = "servicequotas:GetServiceQuota"
#: where STS is asked when no region is configured
STS_REGION = "us-east-1"


def check(options: Mapping[str, Any], rows: Sequence[InstanceType]) -> Report:
    """The caller's identity, and the P quotas of every region of `rows`. Raises the mapped
    error of the identity call (`AuthError` for refused credentials)."""
    clients = Clients(profile=options.get("profile") or None)
    region = clients.session().region_name or STS_REGION
    with aws_errors(region):
        me = clients.get("sts", region).get_caller_identity()
    identity = f"account {me.get('Account', '?')} ({me.get('Arn', '?')})"
    quotas: list[Quota] = []
    findings: list[Finding] = []
    vcpus = {r.instance_type: r.vcpus for r in rows}
    for where in sorted({r.region for r in rows}):
        needs = tuple(sorted({(r.instance_type, r.vcpus) for r in rows if r.region == where}))
        try:
            used = _used(clients, where, vcpus)
        except CloudtrainError as exc:
            used = None
            what = f"the vCPUs of the P instances running in {where} (the usage)"
            findings.append(unread(what, exc, "ec2:DescribeInstances"))
        for code, (name, spot) in QUOTAS.items():
            try:
                with aws_errors(where):
                    answer = clients.get("service-quotas", where).get_service_quota(
                        ServiceCode="ec2", QuotaCode=code
                    )
            except CloudtrainError as exc:
                findings.append(unread(f"{name} ({code}) in {where}", exc, GET_QUOTA))
                continue
            value = (answer.get("Quota") or {}).get("Value")
            if value is None:
                findings.append(Finding(f"{name} ({code}) in {where}: the answer has no value"))
                continue
            quotas.append(
                Quota(
                    where,
                    f"{name} ({code})",
                    float(value),
                    None if used is None else float(used[spot]),
                    "vCPUs",
                    spot,
                    needs,
                    HOW.format(code=code, region=where),
                )
            )
    return Report(identity, tuple(quotas), tuple(findings))


def _used(clients: Clients, region: str, vcpus: Mapping[str, int]) -> dict[bool, int]:
    """vCPUs of the pending and running P instances of `region`: on-demand (False) and spot
    (True). EC2's filters take ``p*`` but not every EC2 look-alike does: the type is matched
    here."""
    ec2 = clients.ec2(region)
    found: list[tuple[str, int | None, bool]] = []
    with aws_errors(region):
        pages = paginate(
            ec2,
            "describe_instances",
            "Reservations",
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
        )
        for reservation in pages:
            for inst in reservation.get("Instances", []):
                kind = str(inst.get("InstanceType", ""))
                if not kind.startswith("p"):
                    continue
                cpu = inst.get("CpuOptions") or {}
                count = (
                    int(cpu["CoreCount"]) * int(cpu.get("ThreadsPerCore", 1))
                    if "CoreCount" in cpu
                    else None
                )
                found.append((kind, count, inst.get("InstanceLifecycle") == "spot"))
        unknown = sorted({k for k, n, _ in found if n is None and k not in vcpus})
        known = dict(vcpus)
        if unknown:
            types = ec2.describe_instance_types(InstanceTypes=unknown)["InstanceTypes"]
            known.update({t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in types})
    used = {False: 0, True: 0}
    for kind, count, spot in found:
        used[spot] += count if count is not None else known.get(kind, 0)
    return used
