"""The per-cluster resources of one region besides instances: a security group, a key pair,
(for multi-node clusters of types that support it) a cluster placement group, and (for
multi-card types, which get no public IPv4) an Elastic IP for the head.

Each is tagged with the cluster, its owner and its cluster id, and found again by those tags
(never by name alone: a second user of the account must not adopt or delete the first one's;
a record must not act on another incarnation of its name), so `ensure_*` is idempotent and
`delete_all` works with no local state. Names are ``cloudtrain-<cluster>``: a security group's
and a placement group's name is unique in the VPC/region, so two incarnations of one name can
never both make theirs (the loser of a race sees the other's and stops). The key pair's name
carries the cluster id too, so a key pair left by an earlier incarnation is never in the way.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.model import TAG_CLUSTER, TAG_CLUSTER_ID, TAG_OWNER
from cloudtrain.providers.aws._client import paginate
from cloudtrain.providers.aws._errors import code_of

log = logging.getLogger(__name__)

#: Instance families that support cluster placement groups and EFA, with EFA interfaces per node.
EFA_INTERFACES = {"p3dn.24xlarge": 1, "p4d.24xlarge": 4, "p4de.24xlarge": 4}


def multi_card(instance_type: str | None) -> bool:
    """Launched with several network cards, where EC2 gives no public IPv4 (it refuses
    ``AssociatePublicIpAddress`` with more than one interface)."""
    return EFA_INTERFACES.get(instance_type or "", 0) > 1


def resource_name(cluster: str) -> str:
    return f"cloudtrain-{cluster}"


def cluster_filter(cluster: str) -> dict[str, Any]:
    return {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}


@dataclass(frozen=True)
class Scope:
    """Whose resources a call makes or finds: the `cluster`'s, made by `owner` (None: by
    anyone), of the incarnation `cluster_id` (None: of every one; what is made is tagged with
    it when set)."""

    cluster: str
    owner: str | None = None
    cluster_id: str | None = None

    def filters(self) -> list[dict[str, Any]]:
        pairs = [(TAG_OWNER, self.owner), (TAG_CLUSTER_ID, self.cluster_id)]
        return [
            cluster_filter(self.cluster),
            *({"Name": f"tag:{k}", "Values": [v]} for k, v in pairs if v is not None),
        ]

    def tags(self, **extra: str) -> list[dict[str, str]]:
        pairs = {TAG_CLUSTER: self.cluster, TAG_OWNER: str(self.owner),
                 **({TAG_CLUSTER_ID: self.cluster_id} if self.cluster_id else {}),
                 "Name": resource_name(self.cluster), **extra}  # fmt: skip
        return [{"Key": k, "Value": v} for k, v in pairs.items()]

    def tag_spec(self, kind: str, **extra: str) -> dict[str, Any]:
        return {"ResourceType": kind, "Tags": self.tags(**extra)}

    @property
    def key_name(self) -> str:
        """The key pair's name: unique per incarnation."""
        name = resource_name(self.cluster)
        return f"{name}-{self.cluster_id}" if self.cluster_id else name


def default_subnet(ec2: Any, zone: str) -> str:
    subnets = ec2.describe_subnets(
        Filters=[
            {"Name": "availability-zone", "Values": [zone]},
            {"Name": "default-for-az", "Values": ["true"]},
        ]
    )["Subnets"]
    if not subnets:
        raise ProviderError("aws", "NoDefaultSubnet", f"no default subnet in {zone}")
    return str(subnets[0]["SubnetId"])


def _security_group(ec2: Any, scope: Scope) -> dict[str, Any] | None:
    groups = ec2.describe_security_groups(Filters=scope.filters())["SecurityGroups"]
    return dict(groups[0]) if groups else None


def find_security_group(ec2: Any, scope: Scope) -> str | None:
    group = _security_group(ec2, scope)
    return str(group["GroupId"]) if group else None


def ensure_security_group(
    ec2: Any, scope: Scope, cidr: str, *, absent: bool = False
) -> tuple[str, list[str]]:
    """SSH (22/tcp) from `cidr` only; all traffic between members of the group. Idempotent,
    also after a crash between creating the group and adding its rules. The SSH rule follows
    `cidr` when it changed (the caller's address moved): the new one is added before the old
    is revoked. Returns the group id and what changed, in words.

    `absent`: no group of the name was seen here a moment ago (`holders`), so the group is
    created without a look first (two calls on the way to a new cluster's launch, not four);
    a group made meanwhile is then found by the create's ``InvalidGroup.Duplicate``."""
    found = None if absent else _security_group(ec2, scope)
    if found and found.get("IpPermissions"):
        return str(found["GroupId"]), _follow(ec2, found, cidr)
    from botocore.exceptions import ClientError

    group_id = str(found["GroupId"]) if found else _create_group(ec2, scope, cidr)
    try:
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=rules(group_id, cidr))
    except ClientError as exc:  # the other `up` of the cluster added them just now
        if code_of(exc) != "InvalidPermission.Duplicate":
            raise
    return group_id, []


def _create_group(ec2: Any, scope: Scope, cidr: str) -> str:
    """Create the group, in the region's default VPC (no ``VpcId``: EC2 takes the default,
    and says ``VPCIdNotSpecified`` when there is none); when another `up` of the same cluster
    made it a moment ago (its name is unique in the VPC), use that one: both then send the
    same ``ClientToken``. When another incarnation of the name made it, stop: the name is
    taken."""
    from botocore.exceptions import ClientError

    cluster = scope.cluster
    try:
        return str(
            ec2.create_security_group(
                GroupName=resource_name(cluster),
                Description=f"cloudtrain cluster {cluster}: SSH from {cidr}, all within the group",
                TagSpecifications=[scope.tag_spec("security-group")],
            )["GroupId"]
        )
    except ClientError as exc:
        if code_of(exc) == "VPCIdNotSpecified":
            raise ProviderError(
                "aws", "NoDefaultVpc", "this region has no default VPC; create one "
                "(aws ec2 create-default-vpc) or choose another --region",
            ) from None  # fmt: skip
        if code_of(exc) != "InvalidGroup.Duplicate":
            raise
        found = _security_group(ec2, scope)
        if found is None:
            raise ConfigError(
                f"cluster name {cluster!r} was taken on aws just now by another cluster (its "
                f"security group {resource_name(cluster)} exists); choose another --name"
            ) from None
        return str(found["GroupId"])


def _ssh_sources(group: dict[str, Any]) -> list[str]:
    return [
        r.get("CidrIp") or r.get("CidrIpv6")
        for p in group.get("IpPermissions", [])
        if p.get("IpProtocol") == "tcp" and p.get("FromPort") == 22
        for r in [*p.get("IpRanges", []), *p.get("Ipv6Ranges", [])]
    ]


def _follow(ec2: Any, group: dict[str, Any], cidr: str) -> list[str]:
    """Point the group's SSH rule at `cidr` alone."""
    group_id, sources = str(group["GroupId"]), _ssh_sources(group)
    if sources == [cidr]:
        return []
    if cidr not in sources:
        ec2.authorize_security_group_ingress(
            GroupId=group_id, IpPermissions=rules(group_id, cidr)[:1]
        )
    for old in (s for s in sources if s != cidr):
        ec2.revoke_security_group_ingress(GroupId=group_id, IpPermissions=rules(group_id, old)[:1])
    was = ", ".join(s for s in sources if s != cidr) or "none"
    return [f"SSH to security group {group_id} now from {cidr} only (was {was})"]


def rules(group_id: str, cidr: str) -> list[dict[str, Any]]:
    """The group's only ingress rules: SSH from `cidr`, and everything from the group itself."""
    ssh: dict[str, Any] = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22}
    if ":" in cidr:
        ssh["Ipv6Ranges"] = [{"CidrIpv6": cidr, "Description": "SSH from the cloudtrain user"}]
    else:
        ssh["IpRanges"] = [{"CidrIp": cidr, "Description": "SSH from the cloudtrain user"}]
    within = {
        "IpProtocol": "-1",
        "UserIdGroupPairs": [{"GroupId": group_id, "Description": "within the cluster"}],
    }
    return [ssh, within]


def ensure_key_pair(ec2: Any, scope: Scope, public_key: str, *, absent: bool = False) -> str:
    """Import the cluster's public key (made locally; AWS never sees the private half).
    `absent` as for `ensure_security_group`: import without a look first."""
    name = scope.key_name
    if not absent and _key_pairs(ec2, scope):
        return name
    from botocore.exceptions import ClientError

    try:
        ec2.import_key_pair(
            KeyName=name,
            PublicKeyMaterial=public_key.encode(),
            TagSpecifications=[scope.tag_spec("key-pair")],
        )
    except ClientError as exc:  # another `up` of the cluster imported the same key just now
        if code_of(exc) != "InvalidKeyPair.Duplicate" or not _key_pairs(ec2, scope):
            raise
    return name


def find_placement_group(ec2: Any, scope: Scope) -> str | None:
    groups = ec2.describe_placement_groups(Filters=scope.filters())["PlacementGroups"]
    return str(groups[0]["GroupName"]) if groups else None


def ensure_placement_group(ec2: Any, scope: Scope, *, absent: bool = False) -> str:
    """A `cluster` placement group: the nodes share a low-latency network segment. `absent`
    as for `ensure_security_group`: made without a look first."""
    found = None if absent else find_placement_group(ec2, scope)
    if found:
        return found
    from botocore.exceptions import ClientError

    name = resource_name(scope.cluster)
    try:
        ec2.create_placement_group(
            GroupName=name,
            Strategy="cluster",
            TagSpecifications=[scope.tag_spec("placement-group")],
        )
    except ClientError as exc:  # another `up` of the cluster made it just now
        if code_of(exc) != "InvalidPlacementGroup.Duplicate" or not find_placement_group(
            ec2, scope
        ):
            raise
    return name


def ensure_head_address(ec2: Any, scope: Scope, interface_id: str) -> str:
    """The cluster's Elastic IP, on the head's primary interface: how the coordinator reaches
    a cluster of multi-card nodes (the others through the head). Idempotent; returns it."""
    found = _addresses(ec2, scope)
    address = found[0] if found else ec2.allocate_address(
        Domain="vpc", TagSpecifications=[scope.tag_spec("elastic-ip")]
    )  # fmt: skip
    if address.get("NetworkInterfaceId") != interface_id:
        ec2.associate_address(
            AllocationId=address["AllocationId"],
            NetworkInterfaceId=interface_id,
            AllowReassociation=True,
        )
    return str(address["PublicIp"])


def live_instances(ec2: Any, scope: Scope) -> list[dict[str, Any]]:
    """The instances of `scope` in this region that are not terminated (one paginated
    call)."""
    states = ["pending", "running", "stopping", "stopped", "shutting-down"]
    return [
        instance
        for reservation in paginate(
            ec2,
            "describe_instances",
            "Reservations",
            Filters=[*scope.filters(), {"Name": "instance-state-name", "Values": states}],
        )
        for instance in reservation["Instances"]
    ]


def holders(ec2: Any, cluster: str) -> set[tuple[str, str]]:
    """(owner, cluster id or "") of the cluster's security groups in this region (one call).
    Every incarnation has one before anything else of it exists (its instances need it, and
    it cannot be deleted while they exist), so this is who holds the name here."""
    groups = ec2.describe_security_groups(Filters=[cluster_filter(cluster)])["SecurityGroups"]
    return {(_tag(g, TAG_OWNER), _tag(g, TAG_CLUSTER_ID)) for g in groups}


def _tag(resource: dict[str, Any], key: str) -> str:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), "")


def leftovers(ec2: Any, scope: Scope) -> list[str]:
    """What of the cluster, besides instances, exists in this region (for `down` of a cluster
    whose instances are gone)."""
    return [
        *(f"elastic IP {a['PublicIp']}" for a in _addresses(ec2, scope)),
        *(f"placement group {n}" for n in [find_placement_group(ec2, scope)] if n),
        *(f"security group {g}" for g in [find_security_group(ec2, scope)] if g),
        *(f"key pair {k}" for k in _key_pairs(ec2, scope)),
    ]


def _addresses(ec2: Any, scope: Scope) -> list[dict[str, Any]]:
    return list(ec2.describe_addresses(Filters=scope.filters())["Addresses"])


def _key_pairs(ec2: Any, scope: Scope) -> list[str]:
    return sorted(k["KeyName"] for k in ec2.describe_key_pairs(Filters=scope.filters())["KeyPairs"])


def delete_all(ec2: Any, scope: Scope, *, timeout_s: float = 600, poll_s: float = 2) -> list[str]:
    """Release the Elastic IP and delete the placement group, security group and key pair of
    `scope` in this region, once no instance of it is left (a group in use cannot be deleted).
    Idempotent; returns what was deleted."""
    deleted: list[str] = []
    for address in _addresses(ec2, scope):
        if address.get("AssociationId"):  # EC2 drops it with the instance; be sure
            _ignore_gone(partial(ec2.disassociate_address, AssociationId=address["AssociationId"]))
        release = partial(ec2.release_address, AllocationId=address["AllocationId"])
        _retry_in_use(release, timeout_s, poll_s)
        deleted.append(f"elastic IP {address['PublicIp']}")
    name = find_placement_group(ec2, scope)
    if name:
        _retry_in_use(lambda: ec2.delete_placement_group(GroupName=name), timeout_s, poll_s)
        deleted.append(f"placement group {name}")
    group_id = find_security_group(ec2, scope)
    if group_id:
        _retry_in_use(lambda: ec2.delete_security_group(GroupId=group_id), timeout_s, poll_s)
        deleted.append(f"security group {group_id}")
    for key_name in _key_pairs(ec2, scope):
        ec2.delete_key_pair(KeyName=key_name)
        deleted.append(f"key pair {key_name}")
    return deleted


def _ignore_gone(call: Any) -> None:
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError as exc:
        if not code_of(exc).endswith("NotFound"):
            raise


def _retry_in_use(call: Any, timeout_s: float, poll_s: float) -> None:
    """Run `call`, retrying while AWS says the resource is still in use (instances that are
    terminated release their groups a little later)."""
    from botocore.exceptions import ClientError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except ClientError as exc:
            code = code_of(exc)
            if code.endswith(("NotFound", "Unknown")):
                return
            if code not in ("DependencyViolation", "InvalidPlacementGroup.InUse", "InUse"):
                raise
            if time.monotonic() > deadline:
                raise
            log.info("still in use (%s); retrying in %.0f s", code, poll_s)
            time.sleep(poll_s)
