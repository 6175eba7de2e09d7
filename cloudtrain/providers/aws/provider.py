"""The AWS provider: an EC2 instance group per cluster, found again by its tags.

`apply` makes, in the first region of the plan that has capacity: a security group (SSH from
the user's CIDR only, everything within the group), a key pair imported from the cluster's
locally made ed25519 key, a cluster placement group for multi-node clusters of p3dn/p4d/p4de
(with their EFA interfaces), and then all N instances in **one** ``RunInstances`` call
(``MinCount = MaxCount = N``: all or nothing; a ``ClientToken`` so a retried call cannot
double-create; IMDSv2 required; encrypted gp3 root volume; shutdown terminates). Capacity errors
move to the next zone, then region, each attempt reported; quota and auth errors stop at once.
Every resource is tagged at creation (never in a second call), so a crash at any point leaves
nothing that `terminate` cannot find by tag.

Fixed costs are kept off the path: botocore's parsed API models are kept on disk (`_models`:
a client costs half as much); the plan's read-only answers (the zones that offer a type, the
image) are cached on disk for a day per region and caller (`_cache`), and read for every
region at once when they are not; `holders` asks every region at once, and where it saw no
group of the name the per-region resources are created without a look first; they are made at
once (a thread each, all finished before an error is raised, so `clean` finds whatever one of
them made), the nodes' UserData rendered meanwhile. A new cluster's `up` makes 8 calls: 3
`holders`, the group and its rules, the key pair, ``RunInstances`` and one describe.

A node's index comes from its batch tag (see `_instances`), or from a ``cloudtrain:node`` tag
when one is present.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

from cloudtrain import access
from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.model import (
    TAG_CLUSTER,
    TAG_NODE,
    TAG_OWNER,
    Capability,
    Event,
    NodeInfo,
    Offer,
    OnEvent,
)
from cloudtrain.plan import catalog
from cloudtrain.providers.aws import _resources as res
from cloudtrain.providers.aws._cache import PlanCache, str_list
from cloudtrain.providers.aws._client import Clients, aws_errors, concurrently, paginate
from cloudtrain.providers.aws._instances import (
    TAG_NODES,
    boot_data,
    compact,
    expand,
    run_request,
    user_data,
)
from cloudtrain.provision.engine import CLOUD_CAPABILITIES, Engine
from cloudtrain.provision.provider import ProviderContext, default_owner, wait_for_nodes
from cloudtrain.spec import ClusterSpec

if TYPE_CHECKING:
    pass

T = TypeVar("T")
log = logging.getLogger(__name__)

DLAMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
)
DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04)*"
# Ubuntu 24.04, not 22.04: its Python 3.12 can install cloudtrain (Python >= 3.11) on the node.
NODE_USER = bootstrap.NODE_USER


def _tag(resource: dict[str, Any], key: str) -> str:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), "")


def _index(inst: dict[str, Any]) -> int:
    """The node an instance is: its own tag, or its place in a gang create's range."""
    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
    if TAG_NODE in tags:
        return int(tags[TAG_NODE])
    return expand(tags.get(TAG_NODES, "0"))[int(inst.get("AmiLaunchIndex", 0))]


def client_token(incarnation: str, owner: str, zone: str, indices: Sequence[int]) -> str:
    """The ``ClientToken`` of one attempt (at most 64 characters), from the cluster id (the
    security group's id for a cluster of an older version: it too is made again after a
    `down`), the owner, the zone and the indices: the same attempt always sends the same
    token, so EC2 makes its instances once, even when two machines send it; a cluster made
    again after `down` gets new ones."""
    digest = hashlib.sha256(f"{incarnation}\0{owner}\0{zone}\0{compact(indices)}".encode())
    return f"cloudtrain-{digest.hexdigest()[:40]}"


def in_region(region: str, call: Callable[[], T]) -> Callable[[], T]:
    """`call`, its errors mapped as `aws_errors(region)` maps them (in whatever thread)."""

    def mapped() -> T:
        with aws_errors(region):
            return call()

    return mapped


class Prepared(NamedTuple):
    """What `prepare` made or found in a region, for `create`."""

    security_group: str
    placement_group: str | None
    #: the nodes' UserData, rendered while the resources were being made
    boot: bytes


class AwsProvider(Engine):
    """EC2 instance groups. Options: ``profile``, ``owner``, ``regions`` (where `describe` and
    `terminate` look; default: every catalog region of aws), ``clients`` (a `Clients`, for
    tests), ``wait_timeout_s``, ``poll_s``."""

    name: ClassVar[str] = "aws"
    capabilities: ClassVar[frozenset[Capability]] = CLOUD_CAPABILITIES | {Capability.AUTOSTOP}
    #: what a node boots with, by the request's field (`cloudtrain bootstrap render`)
    user_data = staticmethod(user_data)

    def __init__(self, context: ProviderContext) -> None:
        opts = context.options
        self.home = context.home
        self.clients: Clients = opts.get("clients") or Clients(
            profile=opts.get("profile"), models=self.home / "cache" / "botocore"
        )
        self.owner = str(opts.get("owner") or default_owner())
        self._regions: tuple[str, ...] | None = (
            tuple(opts["regions"]) if opts.get("regions") else None
        )
        self.wait_timeout_s = float(opts.get("wait_timeout_s", 900))
        self.poll_s = float(opts.get("poll_s", 2.0))
        #: (cluster, region) where `holders` saw no group of the name: `prepare` makes its
        #: resources there without looking first (a hint, never a safety: a create that meets
        #: one made meanwhile finds it by the duplicate error)
        self._unheld: set[tuple[str, str]] = set()

    # -- plan ---------------------------------------------------------------------------

    def regions(self) -> tuple[str, ...]:
        """Where this provider looks for a cluster's resources."""
        if self._regions:
            return self._regions
        found = {r.region for r in catalog.load().rows if r.provider == "aws"}
        env = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return tuple(sorted(found | ({env} if env else set())))

    def refine(self, spec: ClusterSpec, offers: Sequence[Offer]) -> list[Offer]:
        """EC2's answer, region by region at once: the zones that offer the type, the image of
        each region."""
        regions = {o.region: [x for x in offers if x.region == o.region] for o in offers}
        reads = [in_region(r, partial(self._refine, spec, of)) for r, of in regions.items()]
        found = dict(zip(regions, concurrently(reads), strict=True))
        refined = [o for o in (found[o.region].get(id(o)) for o in offers) if o is not None]
        if not refined:
            where = ", ".join(o.region for o in offers)
            raise ConfigError(
                f"aws offers {offers[0].instance_type} in no zone of {where} right now "
                "(describe_instance_type_offerings); try another --region or GPU"
            )
        return refined

    def requests(self, spec: ClusterSpec, offer: Offer) -> list[dict[str, Any]]:
        """The RunInstances request of the first attempt, what the cloud resolves as named
        placeholders, the user-data elided."""
        request = run_request(
            spec, offer, offer.zones[0], list(range(spec.num_nodes)),
            scope=self._scope(spec.name, spec.cluster_id),
            sg=f"<security group cloudtrain-{spec.name}>", subnet="<default subnet>",
            token="<client token>", placement_group="<placement group>",
            keys=bootstrap.NodeKeys.placeholders(), boot=b"",
        )  # fmt: skip
        # not rendered here (`prepare` renders it while the cluster's resources are made)
        request["UserData"] = (
            f"<the nodes' cloud-init; `cloudtrain bootstrap render --provider aws --gpus "
            f"{spec.resources.gpus}` shows it>"
        )
        return [{"RunInstances": request}]

    def placeholder_extra(self, spec: ClusterSpec, offer: Offer) -> dict[str, Any]:
        image = spec.resources.image or (
            f"<the Deep Learning Base AMI of {offer.region} (SSM {DLAMI_PARAMETER})>"
        )
        return {"image": image, "root_device": "<the image's root device>"}

    def _cache(self, region: str) -> PlanCache:
        """The plan's cached answers in `region`, for this caller (`_cache`)."""
        return PlanCache(self.home / "cache" / "aws", self.clients.caller(region), region)

    def _refine(self, spec: ClusterSpec, offers: list[Offer]) -> dict[int, Offer]:
        """The offers of one region (by `id`) that a zone of it offers, with those zones and
        the region's image; the answers cached a day (`_cache`)."""
        region = offers[0].region
        cache = self._cache(region)
        refined: dict[int, Offer] = {}
        for offer in offers:
            zones = self._zones(cache, offer.instance_type)
            if spec.resources.zone:
                zones = [z for z in zones if z == spec.resources.zone]
            if not zones:
                log.info("%s: no zone offers %s", region, offer.instance_type)
                continue
            image, root = self._image(cache, spec.resources.image)
            extra = {"image": image, "root_device": root}
            refined[id(offer)] = dataclasses.replace(offer, zones=tuple(zones), extra=extra)
        return refined

    def _zones(self, cache: PlanCache, instance_type: str) -> list[str]:
        key = f"zones {instance_type}"
        zones = str_list(cache.get(key))
        if zones is None:
            found = self.clients.ec2(cache.region).describe_instance_type_offerings(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [instance_type]}],
            )["InstanceTypeOfferings"]
            zones = sorted({o["Location"] for o in found})
            cache.put(key, zones)
        return zones

    def _image(self, cache: PlanCache, image: str | None) -> tuple[str, str]:
        """(image id, root device): `image` when given, else the Deep Learning Base AMI."""
        key = f"image {image or 'dlami'}"
        found = str_list(cache.get(key))
        if found is None or len(found) != 2:
            found = list(self._read_image(cache.region, image))
            cache.put(key, found)
        return found[0], found[1]

    def _read_image(self, region: str, image: str | None) -> tuple[str, str]:
        ec2 = self.clients.ec2(region)
        if image is None:
            from botocore.exceptions import ClientError

            try:
                ssm = self.clients.get("ssm", region)
                image = ssm.get_parameter(Name=DLAMI_PARAMETER)["Parameter"]["Value"]
            except ClientError:
                found = ec2.describe_images(
                    Owners=["amazon"], Filters=[{"Name": "name", "Values": [DLAMI_NAME]}]
                )["Images"]
                if not found:
                    raise ConfigError(
                        f"no Deep Learning Base AMI found in {region} (SSM {DLAMI_PARAMETER} "
                        "or an image named like it); pass --image ami-..."
                    ) from None
                image = max(found, key=lambda i: i.get("CreationDate", ""))["ImageId"]
        images = ec2.describe_images(ImageIds=[image])["Images"]
        if not images:
            raise ConfigError(f"--image {image!r} does not exist in {region}")
        return str(image), str(images[0].get("RootDeviceName") or "/dev/sda1")

    # -- the engine's hooks (the algorithm is `Engine.apply`) -----------------------------------

    def _scope(self, cluster: str, cluster_id: str | None) -> res.Scope:
        return res.Scope(cluster, self.owner, cluster_id)

    def holders(self, cluster: str) -> set[tuple[str, str]]:
        found = concurrently(
            [in_region(r, partial(self._holders, r, cluster)) for r in self.regions()]
        )
        return set().union(*found)

    def _holders(self, region: str, cluster: str) -> set[tuple[str, str]]:
        found = res.holders(self.clients.ec2(region), cluster)
        if found:
            self._unheld.discard((cluster, region))
        else:
            self._unheld.add((cluster, region))
        return found

    def prepare(
        self, spec: ClusterSpec, offer: Offer, keys: bootstrap.NodeKeys, on_event: OnEvent
    ) -> Any:
        """The security group (its SSH rule follows the caller), the key pair, and for
        multi-node EFA types the placement group, in the offer's region: made at once, each
        idempotent; when one fails, the others are finished before the error is raised (the
        engine's `clean` then removes them). The nodes' UserData is rendered meanwhile."""
        scope, ec2 = self._scope(spec.name, spec.cluster_id), self.clients.ec2(offer.region)
        group = spec.num_nodes > 1 and offer.instance_type in res.EFA_INTERFACES
        absent = (spec.name, offer.region) in self._unheld
        made: list[Callable[[], Any]] = [
            partial(res.ensure_security_group, ec2, scope, str(spec.ssh_cidr), absent=absent),
            partial(res.ensure_key_pair, ec2, scope, keys.user_public, absent=absent),
        ]
        if group:
            made.append(partial(res.ensure_placement_group, ec2, scope, absent=absent))
        calls: list[Callable[[], Any]] = [partial(boot_data, spec, offer, keys)]
        calls += [in_region(offer.region, m) for m in made]
        boot, (group_id, changes), _, *placement = concurrently(calls)
        for change in changes:
            on_event(Event("resource", change))
        return Prepared(group_id, placement[0] if placement else None, boot)

    def create(
        self,
        spec: ClusterSpec,
        offer: Offer,
        zone: str | None,
        indices: Sequence[int],
        keys: bootstrap.NodeKeys,
        prepared: Any,
    ) -> None:
        """One ``RunInstances`` of every missing node (``MinCount = MaxCount``). Its
        ``ClientToken`` is derived from the cluster id, the owner, the zone and the indices,
        so a retried or repeated call (two `up`s at once, even from two machines) cannot
        create a second set."""
        sg, group, boot = prepared
        zone = str(zone)
        ec2 = self.clients.ec2(offer.region)
        try:
            with aws_errors(zone):
                subnet = "" if offer.instance_type not in res.EFA_INTERFACES else (
                    res.default_subnet(ec2, zone))  # fmt: skip
                request = run_request(
                    spec, offer, zone, indices, scope=self._scope(spec.name, spec.cluster_id),
                    sg=sg, subnet=subnet, placement_group=group, keys=keys, boot=boot,
                    token=client_token(spec.cluster_id or sg, self.owner, zone, indices),
                )  # fmt: skip
                ec2.run_instances(**request)
        except ProviderError as exc:
            if exc.code.startswith("InvalidAMIID"):  # a cached image may be gone: read anew
                with contextlib.suppress(Exception):  # the error to report is `exc`
                    self._cache(offer.region).forget()
            raise

    def clean(self, spec: ClusterSpec, offer: Offer) -> None:
        ec2, scope = self.clients.ec2(offer.region), self._scope(spec.name, spec.cluster_id)
        with aws_errors(offer.region):
            if not res.live_instances(ec2, scope):
                res.delete_all(ec2, scope, timeout_s=60, poll_s=self.poll_s)

    def wait(self, spec: ClusterSpec, region: str, on_event: OnEvent) -> list[NodeInfo]:
        return self._wait(self._scope(spec.name, spec.cluster_id), region, spec.num_nodes,
                          on_event)  # fmt: skip

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        scope, found = self._scope(cluster, cluster_id), []
        for region in self.regions():
            with aws_errors(region):
                found += [f"{region}: {r}" for r in res.leftovers(self.clients.ec2(region), scope)]
        return found

    def _wait(self, scope: res.Scope, region: str, count: int, on_event: OnEvent) -> list[NodeInfo]:
        """Block until `count` nodes run with addresses; one paginated describe per poll."""

        def settle(nodes: list[NodeInfo]) -> bool:
            if nodes[0].public_ip or not res.multi_card(nodes[0].instance_type):
                return False
            self._address_head(scope, region, nodes[0], on_event)
            return True

        return wait_for_nodes(
            "aws", scope.cluster, count, lambda: self._describe_region(scope, region),
            home=self.home, timeout_s=self.wait_timeout_s, poll_s=self.poll_s,
            on_event=on_event, settle=settle,
        )  # fmt: skip

    def _address_head(
        self, scope: res.Scope, region: str, head: NodeInfo, on_event: OnEvent
    ) -> None:
        """Multi-card nodes get no public IPv4: give the head an Elastic IP (the others are
        reached through it, see `executor`)."""
        if head.index != 0 or not head.extra.get("interface"):
            raise ProviderError(
                "aws", "NoHead", f"cluster {scope.cluster!r} has no node 0 to address"
            )
        with aws_errors(region):
            address = res.ensure_head_address(
                self.clients.ec2(region), scope, str(head.extra["interface"])
            )
        on_event(Event("node", f"Elastic IP {address} for the head", node=0))

    # -- describe / terminate -------------------------------------------------------------

    def _describe_region(self, scope: res.Scope, region: str) -> list[NodeInfo]:
        with aws_errors(region):
            instances = res.live_instances(self.clients.ec2(region), scope)
        nodes = sorted(
            (self._node(scope.cluster, region, i) for i in instances), key=lambda n: n.index
        )
        head = nodes[0].public_ip if nodes and nodes[0].index == 0 else None
        if head:  # nodes without a public address are reached through the head
            nodes = [n if n.public_ip else dataclasses.replace(n, jump=head) for n in nodes]
        return nodes

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        scope = self._scope(cluster, cluster_id)
        found = concurrently([partial(self._describe_region, scope, r) for r in self.regions()])
        return sorted((n for nodes in found for n in nodes), key=lambda n: n.index)

    def _node(self, cluster: str, region: str, inst: dict[str, Any]) -> NodeInfo:
        index = _index(inst)
        state = str(inst["State"]["Name"])
        primary = [
            n["NetworkInterfaceId"]
            for n in inst.get("NetworkInterfaces", [])
            if n.get("Attachment", {}).get("DeviceIndex") == 0
            and n["Attachment"].get("NetworkCardIndex", 0) == 0
        ]
        return NodeInfo(
            cluster=cluster,
            index=index,
            node_id=str(inst["InstanceId"]),
            private_ip=inst.get("PrivateIpAddress"),
            public_ip=inst.get("PublicIpAddress"),
            state="stopping" if state == "shutting-down" else state,
            zone=inst.get("Placement", {}).get("AvailabilityZone"),
            instance_type=inst.get("InstanceType"),
            root=f"/home/{NODE_USER}/.cloudtrain",
            python=f"/home/{NODE_USER}/.cloudtrain/venv/bin/python",
            user=NODE_USER,
            region=region,
            extra=MappingProxyType(
                {
                    "spot": inst.get("InstanceLifecycle") == "spot",
                    "interface": primary[0] if primary else None,
                }
            ),
        )

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        """Terminate the instances found by tag in every region, wait until they are gone, then
        delete the placement group, security group and key pair. Idempotent."""
        scope = self._scope(cluster, cluster_id)
        for region in self.regions():
            ec2 = self.clients.ec2(region)
            with aws_errors(region):
                ids = [i["InstanceId"] for i in res.live_instances(ec2, scope)]
                for start in range(0, len(ids), 1000):
                    ec2.terminate_instances(InstanceIds=ids[start : start + 1000])
                self._wait_gone(ec2, scope, region)
                res.delete_all(ec2, scope, timeout_s=self.wait_timeout_s, poll_s=self.poll_s)
        access.forget_key(self.home, cluster)

    def remove_nodes(self, cluster: str, cluster_id: str | None, indices: Collection[int]) -> None:
        """Terminate the instances of the nodes `indices` (found by tag in every region) and
        wait until they are gone; the cluster's groups, key and other nodes stay
        (`RemovesNodes`). Their volumes and interfaces go with them (DeleteOnTermination)."""
        scope = self._scope(cluster, cluster_id)
        wanted = set(indices)
        for region in self.regions():
            ec2 = self.clients.ec2(region)
            with aws_errors(region):
                ids = {
                    i["InstanceId"] for i in res.live_instances(ec2, scope) if _index(i) in wanted
                }
                if ids:
                    ec2.terminate_instances(InstanceIds=sorted(ids))
                    self._wait_gone(ec2, scope, region, ids)

    def _wait_gone(
        self, ec2: Any, scope: res.Scope, region: str, ids: Collection[str] | None = None
    ) -> None:
        """Until no instance of `scope` (of `ids`, if given) is left in `region`."""
        deadline = time.monotonic() + self.wait_timeout_s
        while [i for i in res.live_instances(ec2, scope) if ids is None or i["InstanceId"] in ids]:
            if time.monotonic() > deadline:
                raise ProviderError(
                    "aws", "WaitTimeout",
                    f"instances of {scope.cluster!r} in {region} still not terminated after "
                    f"{self.wait_timeout_s:.0f} s; run `cloudtrain down {scope.cluster}` again",
                )  # fmt: skip
            time.sleep(self.poll_s)

    def clusters(self) -> list[str]:
        """Clusters of this owner: any instance or security group tagged with the owner."""
        names: set[str] = set()
        owner = {"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]}
        for region in self.regions():
            ec2 = self.clients.ec2(region)
            with aws_errors(region):
                groups = ec2.describe_security_groups(Filters=[owner])["SecurityGroups"]
                names |= {_tag(g, TAG_CLUSTER) for g in groups}
                for reservation in paginate(ec2, "describe_instances", "Reservations",
                                            Filters=[owner]):  # fmt: skip
                    names |= {
                        _tag(i, TAG_CLUSTER)
                        for i in reservation["Instances"]
                        if i["State"]["Name"] != "terminated"
                    }
        return sorted(names - {""})

    def api_endpoint(self, node: NodeInfo) -> str | None:
        # (a multi-card node has no public address: the engine's executor reaches it through
        # the head, its `jump`)
        endpoint: str = self.clients.ec2(node.region or self.regions()[0]).meta.endpoint_url
        return endpoint
