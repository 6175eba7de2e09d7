"""Shims for what moto 5.2.5 lacks, applied inside the stand-in's process.

These reach into moto's in-process state, so they work only where the stand-in server runs (the
test process). Each says which gap it fills:

- ``extend_gpu_offerings``: moto's ``describe_instance_type_offerings`` has no p3.2xlarge,
  p3.8xlarge or p3.16xlarge anywhere, and only some zones for p3dn/p4d/p4de.
- ``add_p3_instance_types``: moto's ``describe_instance_types`` does not know p3.2xlarge,
  p3.8xlarge or p3.16xlarge (``InvalidInstanceType``).
- ``register_dlami``: moto's ``RegisterImage`` reads only Name and Description; the image is owned
  by the caller's account with no owner alias, so ``describe_images(Owners=["amazon"])`` misses it.
- ``put_dlami_parameter``: moto has no ``/aws/service/deeplearning/...`` public parameters and, like
  AWS, refuses ``PutParameter`` for names under ``/aws``.
- ``instance_state``/``subnet_zone``/``set_instance_placement``: let the middleware ask moto what
  it holds, and write back the placement group moto drops from ``RunInstances``.
- ``index_tag_lookups``: moto finds one resource's tags by scanning every tag of the region (see
  there), so a lookup costs in proportion to all the stand-in holds; EC2 indexes them.

The stand-in serves only dummy credentials, which moto maps to its default account
(``123456789012``); these helpers use that account.
"""

from __future__ import annotations

import copy
from typing import Any

from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.core.utils import utcnow
from moto.ec2.models import ec2_backends
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.models.instance_types import (
    INSTANCE_FAMILIES,
    INSTANCE_TYPE_OFFERINGS,
    INSTANCE_TYPES,
    InstanceType,
    InstanceTypeBackend,
)
from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix
from moto.ssm.models import Parameter, ssm_backends

GPU_TYPES = (
    "p3.2xlarge",
    "p3.8xlarge",
    "p3.16xlarge",
    "p3dn.24xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
)
"""The types ``extend_gpu_offerings`` offers in every zone of ``GPU_ZONES``."""

GPU_ZONES = {
    "us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"),
    "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"),
    "eu-west-1": ("eu-west-1a", "eu-west-1b", "eu-west-1c"),
}
"""Zones offering every ``GPU_TYPES``. us-east-1e offers none of them: a zone without capacity."""

DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04) 20261101"
DLAMI_NAME_PATTERN = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04)*"
DLAMI_OWNER_ID = "898082745236"
"""The account that publishes the Deep Learning AMIs in AWS (alias ``amazon``)."""
DLAMI_SSM_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
)

# name: (vCPUs, memory MiB, V100 GPUs, network performance, max network interfaces)
_P3_SPECS = {
    "p3.2xlarge": (8, 62464, 1, "Up to 10 Gigabit", 4),
    "p3.8xlarge": (32, 249856, 4, "10 Gigabit", 8),
    "p3.16xlarge": (64, 499712, 8, "25 Gigabit", 8),
}


def ec2_backend(region: str) -> Any:
    return ec2_backends[DEFAULT_ACCOUNT_ID][region]


def extend_gpu_offerings() -> None:
    """Offers every ``GPU_TYPES`` in every ``GPU_ZONES`` zone (by zone, zone id and region).

    Idempotent; changes moto's module-level table, so it lasts for the process and survives a
    moto reset. Offerings are only ever added.
    """
    for region, zones in GPU_ZONES.items():
        zone_ids = {z.name: z.zone_id for z in RegionsAndZonesBackend.zones[region]}
        locations = {
            "region": [region],
            "availability-zone": list(zones),
            "availability-zone-id": [zone_ids[z] for z in zones],
        }
        for location_type, places in locations.items():
            offerings = INSTANCE_TYPE_OFFERINGS[location_type].setdefault(region, [])
            have = {(o["InstanceType"], o["Location"]) for o in offerings}
            for instance_type in GPU_TYPES:
                for place in places:
                    if (instance_type, place) not in have:
                        offerings.append(
                            {
                                "InstanceType": instance_type,
                                "Location": place,
                                "LocationType": location_type,
                            }
                        )


def add_p3_instance_types() -> None:
    """Makes ``describe_instance_types`` know p3.2xlarge/8xlarge/16xlarge. Idempotent.

    Each is p3dn.24xlarge's record with the p3 sizes: V100 16 GiB GPUs, no EFA, no local NVMe.
    """
    template = INSTANCE_TYPES["p3dn.24xlarge"]
    for name, (vcpus, memory, gpus, network, interfaces) in _P3_SPECS.items():
        if name in INSTANCE_TYPES:
            continue
        spec = copy.deepcopy(template)
        spec["InstanceType"] = name
        spec["Hypervisor"] = "xen"
        spec["MemoryInfo"] = {"SizeInMiB": memory}
        spec["VCpuInfo"] = {
            "DefaultCores": vcpus // 2,
            "DefaultThreadsPerCore": 2,
            "DefaultVCpus": vcpus,
            "ValidCores": list(range(2, vcpus // 2 + 1, 2)),
            "ValidThreadsPerCore": [1, 2],
        }
        spec["GpuInfo"]["Gpus"][0].update(Count=gpus, LogicalGpuCount=gpus)
        spec["GpuInfo"]["Gpus"][0]["MemoryInfo"] = {"SizeInMiB": 16384}
        spec["GpuInfo"]["TotalGpuMemoryInMiB"] = gpus * 16384
        spec["InstanceStorageSupported"] = False
        spec.pop("InstanceStorageInfo", None)
        net = spec["NetworkInfo"]
        net.pop("EfaInfo", None)
        net.update(EfaSupported=False, NetworkPerformance=network)
        net["MaximumNetworkInterfaces"] = interfaces
        net["NetworkCards"] = [
            {
                "NetworkCardIndex": 0,
                "NetworkPerformance": network,
                "MaximumNetworkInterfaces": interfaces,
                "InterfaceTypes": ["interface"],
            }
        ]
        INSTANCE_TYPES[name] = spec
        InstanceTypeBackend.instance_types.append(InstanceType(name))
    if "p3" not in INSTANCE_FAMILIES:
        INSTANCE_FAMILIES.append("p3")


#: moto's own ``TaggedEC2Resource.get_tags`` (kept to restore it and to test the shim against)
SCANNING_GET_TAGS = TaggedEC2Resource.get_tags


def _indexed_get_tags(self: Any) -> list[dict[str, str]]:
    """What moto's ``get_tags`` returns (the same records, in the same order), read from the
    backend's per-resource table instead of found by a scan of every tag of the region."""
    resource_id = self.id
    if not resource_id:
        return []
    found = self.ec2_backend.tags.get(resource_id)  # `.get`: the table is a defaultdict
    if not found:
        return []
    kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
    return [
        {"resource_id": resource_id, "key": key, "value": value, "resource_type": kind}
        for key, value in found.copy().items()
    ]


def index_tag_lookups(enabled: bool = True) -> None:
    """Makes moto look up one resource's tags in its per-resource table (``enabled``), or as
    moto 5.2.5 does (not ``enabled``). Process-wide and idempotent.

    moto's ``TaggedEC2Resource.get_tags`` calls ``describe_tags(filters={"resource-id": [id]})``,
    which matches a regex against every tag of every resource the region has held (terminated
    instances and deleted volumes keep theirs). Each ``tag:`` filter of a ``DescribeInstances``
    and the answer's ``tagSet`` call it once per instance, so a describe of N tagged instances
    costs O(N x all tags): at 1000 instances with 4 tags each and their tagged volumes, one
    round took 4-9 s on 2 cores and the owner filter (``tag:cloudtrain:owner``) added a third
    round to each of cloudtrain's describes, while the bare peer's ``InstanceIds`` describe
    pays one; moto's ``RunInstances`` answer pays one too. EC2 evaluates tag filters against
    an index. The records are the same either way (``tests/aws/test_moto_gaps.py`` compares
    them); resource ids hold no ``*``, ``?`` or ``[``, the only characters where moto's
    pattern and an exact key differ.
    """
    TaggedEC2Resource.get_tags = _indexed_get_tags if enabled else SCANNING_GET_TAGS  # type: ignore[method-assign]


def instance_state(region: str, instance_id: str) -> str | None:
    """moto's state of an instance (``pending``, ``running``, ``terminated``...), or None."""
    for instance in ec2_backend(region).all_instances():
        if instance.id == instance_id:
            return str(instance.state)
    return None


def subnet_zone(region: str, subnet_id: str) -> str | None:
    """The availability zone of a subnet moto holds, or None."""
    for zone, subnets in ec2_backend(region).subnets.items():
        if subnet_id in subnets:
            return str(zone)
    return None


def set_instance_placement(region: str, instance_ids: list[str], name: str, group_id: str) -> None:
    """Writes the placement group into moto's instances, so DescribeInstances shows it."""
    for instance in ec2_backend(region).all_instances():
        if instance.id in instance_ids:
            instance.placement.group_name = name
            instance.placement.group_id = group_id


def drop_public_ips(region: str, instance_ids: list[str]) -> None:
    """EC2 gives no public IPv4 to an instance launched with several network interfaces (it
    refuses ``AssociatePublicIpAddress`` there); moto gives one anyway. This takes it back."""
    for instance in ec2_backend(region).all_instances():
        if instance.id in instance_ids:
            for nic in instance.nics.values():
                nic.public_ip = None


def register_dlami(ec2: Any, *, name: str = DLAMI_NAME) -> str:
    """Registers a Deep Learning AMI as AWS publishes it; returns its image id.

    After this, ``describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values":
    [DLAMI_NAME_PATTERN]}])`` finds it (owner id ``DLAMI_OWNER_ID``, alias ``amazon``, public,
    x86_64, hvm, ebs). ``ec2`` is a client of the stand-in; the image is made in its region.
    """
    image_id: str = ec2.register_image(
        Name=name,
        Description="Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04)",
        Architecture="x86_64",
        RootDeviceName="/dev/sda1",
        VirtualizationType="hvm",
        EnaSupport=True,
    )["ImageId"]
    image = ec2_backend(ec2.meta.region_name).amis[image_id]
    image.owner_id = DLAMI_OWNER_ID
    image.owner_alias = "amazon"
    image.architecture = "x86_64"
    image.virtualization_type = "hvm"
    image.root_device_type = "ebs"
    image.launch_permissions.append({"Group": "all"})
    return image_id


def put_dlami_parameter(ssm: Any, ami_id: str, *, name: str = DLAMI_SSM_PARAMETER) -> None:
    """Publishes ``ami_id`` as the DLAMI's public SSM parameter in ``ssm``'s region.

    Written into moto's SSM store directly (``PutParameter`` refuses ``/aws/...``), so
    ``GetParameter``, ``GetParameters`` and ``GetParametersByPath`` all see it. Each call adds a
    version, as AWS does when it publishes a newer image.
    """
    versions = ssm_backends[DEFAULT_ACCOUNT_ID][ssm.meta.region_name]._parameters[name]
    versions.append(
        Parameter(  # type: ignore[abstract]  # moto's own PutParameter builds it the same way
            account_id=DEFAULT_ACCOUNT_ID,
            name=name,
            value=ami_id,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=utcnow(),
            version=len(versions) + 1,
            data_type="text",
        )
    )
