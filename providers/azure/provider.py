"""The Azure provider: one resource group per cluster, its VMs found again by their tags.

`apply` makes, in the first region of the plan that can give the size: the resource group
``cloudtrain-<cluster>`` (tagged with cluster and owner), an NSG (SSH from the user's CIDR only,
everything within the subnet), a VNet/subnet, a proximity placement group for multi-node
clusters, then the N VMs (all started, then all awaited: ARM has no one-call gang create outside
scale sets). When any VM of an attempt fails — ``AllocationFailed`` in its operation, or
``SkuNotAvailable`` on its PUT — every VM of the attempt is deleted (a ``Failed`` VM too) and the
next zone, then region, is tried, each attempt reported; quota and auth errors stop at once. A
region that gave nothing has its resource group deleted, so a failed `up` leaves nothing.

Everything is created inside the tagged group, so a crash at any point leaves nothing that
`terminate` (delete the groups found by tag) cannot remove.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from cloudtrain import access, bootstrap, planner
from cloudtrain.catalog import Catalog
from cloudtrain.errors import AuthError, CapacityError, ConfigError, ProviderError, QuotaError
from cloudtrain.executors.ssh import SshExecutor
from cloudtrain.provider import (
    Capability,
    Event,
    NodeInfo,
    Offer,
    OnEvent,
    Plan,
    ProviderContext,
    default_owner,
    ignore_event,
    wait_for_nodes,
)
from cloudtrain.providers.azure import _instances as inst
from cloudtrain.providers.azure import _resources as res
from cloudtrain.providers.azure._client import Clients, azure_errors
from cloudtrain.spec import ClusterSpec

log = logging.getLogger(__name__)
NODE_USER = bootstrap.NODE_USER
#: Seconds between polls of long-running operations (default: ARM's Retry-After, else 30).
POLL_ENV = "CLOUDTRAIN_AZURE_POLL_S"


class AzureProvider:
    """Resource groups of VMs. Options: ``subscription`` (else ``AZURE_SUBSCRIPTION_ID``),
    ``owner``, ``clients`` (a `Clients`, for tests), ``catalog`` (a `Catalog`, for tests),
    ``wait_timeout_s``, ``poll_s`` (also the LRO polling interval; default
    ``$CLOUDTRAIN_AZURE_POLL_S``, else the SDK's: ARM's ``Retry-After``, else 30 s)."""

    name: ClassVar[str] = "azure"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.GPU, Capability.SPOT, Capability.MULTI_NODE, Capability.PLACEMENT_GROUP}
    )

    def __init__(self, context: ProviderContext) -> None:
        opts = context.options
        self.home = context.home
        poll = opts.get("poll_s", os.environ.get(POLL_ENV) or None)
        self.poll_s = float(poll) if poll is not None else 5.0
        self.clients: Clients = opts.get("clients") or Clients(
            opts.get("subscription"), poll_s=float(poll) if poll is not None else None
        )
        self.owner = str(opts.get("owner") or default_owner())
        self.catalog: Catalog | None = opts.get("catalog")
        self.wait_timeout_s = float(opts.get("wait_timeout_s", 1800))

    # -- plan ---------------------------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        """Catalog offers, narrowed to the zones where ``resource_skus`` says this subscription
        may create the size. Read-only; bad input (a retired size, no subscription) is refused
        before any call."""
        offers = planner.offers(spec, self.catalog)
        cidr, _ = access.ssh_cidr(spec.ssh_cidr)
        spec = dataclasses.replace(spec, ssh_cidr=cidr)
        _ = self.clients.subscription  # ConfigError before any call
        refined: list[Offer] = []
        reasons: list[str] = []
        for offer in offers:
            with azure_errors(offer.region):
                skus = [
                    s.as_dict()
                    for s in self.clients.compute().resource_skus.list(
                        filter=f"location eq '{offer.region}'"
                    )
                ]
            zones, why = inst.sku_zones(skus, offer.instance_type, offer.region, offer.zones)
            if zones is None:
                log.info("%s", why)
                reasons.append(why)
                continue
            extra = {
                "image": inst.image(offer.instance_type, spec.resources.image),
                "resource_group": res.group_name(spec.name),
                "accelerated_networking": inst.accelerated_networking(skus, offer.instance_type),
            }
            refined.append(dataclasses.replace(offer, zones=tuple(zones), extra=extra))
        if not refined:
            raise ConfigError(
                f"azure cannot give {offers[0].instance_type} to this subscription now: "
                f"{'; '.join(reasons)} (resource_skus); try another --region or GPU"
            )
        return Plan(
            spec=spec,
            offers=tuple(refined),
            requests=inst.plan_requests(spec, refined[0], self.owner),
        )

    # -- apply ----------------------------------------------------------------------------

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        """Create or complete the cluster (Failed VMs are deleted and made again); blocks until
        every node runs. Raises `CapacityError` when no zone of any offer had room (nothing is
        left behind), `QuotaError`/`AuthError` at once, `ConfigError` for more VMs than asked."""
        spec = plan.spec
        if spec.ssh_cidr in access.WORLD:
            on_event(
                Event("warning", f"SSH is open to the whole internet ({spec.ssh_cidr}), as asked")
            )
        nodes = self.describe(spec.name)
        broken = [n for n in nodes if n.state == "failed"]
        if broken:  # a Failed VM (allocation failed before a crash) is deleted, then remade
            on_event(Event("resource", f"deleting {len(broken)} failed VM(s)"))
            self._delete_vms([(str(n.extra["resource_group"]), n.node_id) for n in broken])
            nodes = [n for n in nodes if n.state != "failed"]
        if len(nodes) > spec.num_nodes:
            raise ConfigError(
                f"cluster {spec.name!r} has {len(nodes)} VMs, more than the "
                f"{spec.num_nodes} asked for; `cloudtrain down {spec.name}` first"
            )
        missing = sorted(set(range(spec.num_nodes)) - {n.index for n in nodes})
        if not missing:
            return self._wait(spec.name, spec.num_nodes, on_event)
        offers = list(plan.offers)
        if nodes:  # complete the cluster where it is: same region, same zone
            region, zone = str(nodes[0].extra["region"]), nodes[0].zone
            offers = [
                dataclasses.replace(o, zones=(zone,) if zone else ())
                for o in offers
                if o.region == region
            ]
            if not offers:
                raise ConfigError(f"cluster {spec.name!r} runs in {region}, not in the plan")
        keys = bootstrap.NodeKeys.for_cluster(self.home, spec.name)
        attempts: list[str] = []
        for offer in offers:
            made = self._try_region(spec, offer, missing, keys, attempts, on_event)
            if made is not None:
                return made
        raise CapacityError(
            "azure",
            "NoCapacity",
            f"no zone had {len(missing)} × {offers[0].instance_type}: {'; '.join(attempts)}; "
            "nothing of the cluster was left behind",
        )

    def _try_region(
        self,
        spec: ClusterSpec,
        offer: Offer,
        missing: list[int],
        keys: bootstrap.NodeKeys,
        attempts: list[str],
        on_event: OnEvent,
    ) -> list[NodeInfo] | None:
        """Create the missing nodes in one of the offer's zones; None when every zone lacked
        capacity (and then the region's resource group is gone, unless it holds live nodes)."""
        region, cluster = offer.region, spec.name
        try:
            with azure_errors(region):
                where = res.group_location(self.clients, cluster)
                if where is not None and where != region:  # left by an earlier failed `up`
                    self._clean_group(cluster)
                on_event(Event("resource", f"{region}: resource group {res.group_name(cluster)}"))
                ids = res.ensure_network(
                    self.clients,
                    cluster,
                    self.owner,
                    region,
                    str(spec.ssh_cidr),
                    ppg=spec.num_nodes > 1,
                )
            custom = inst.custom_data(offer, keys)
            for zone in offer.zones or (None,):
                place = f"{region}/{zone}" if zone else region
                on_event(
                    Event("attempt", f"{place}: creating {len(missing)} × {offer.instance_type}")
                )
                bodies = {
                    inst.vm_name(cluster, i): inst.vm_body(
                        spec,
                        offer,
                        zone,
                        i,
                        owner=self.owner,
                        ids=ids,
                        custom=custom,
                        public_key=keys.user_public,
                    )
                    for i in missing
                }
                try:
                    self._create(res.group_name(cluster), bodies, place)
                except CapacityError as exc:
                    attempts.append(f"{place}: {exc.code}")
                    on_event(Event("capacity", f"{place}: {exc.code}; trying the next zone"))
                    continue
                return self._wait(cluster, spec.num_nodes, on_event)
        except (QuotaError, AuthError, ConfigError, ProviderError):
            self._clean_region(cluster)
            raise
        self._clean_region(cluster)
        return None

    def _create(self, group: str, bodies: dict[str, dict[str, Any]], place: str) -> None:
        """Start every VM, then await every one; on any error delete them all (gang) and
        raise the worst error (quota/auth before capacity)."""
        from azure.mgmt.compute.models import VirtualMachine

        vms = self.clients.compute().virtual_machines
        pollers: list[tuple[str, Any]] = []
        errors: list[ProviderError] = []
        for name, body in bodies.items():
            try:
                with azure_errors(place):
                    poller = vms.begin_create_or_update(group, name, VirtualMachine(body))
                pollers.append((name, poller))
            except ProviderError as exc:
                errors.append(exc)
                break
        for name, poller in pollers:
            try:
                with azure_errors(place):
                    self._finish(poller, f"VM {name}")
            except ProviderError as exc:
                errors.append(exc)
        if errors:
            self._delete_vms([(group, name) for name, _ in pollers])
            raise next((e for e in errors if not isinstance(e, CapacityError)), errors[0])

    def _finish(self, poller: Any, what: str) -> None:
        poller.result(timeout=self.wait_timeout_s)
        if not poller.done():  # result() returns None on timeout instead of raising
            raise ProviderError(
                "azure", "WaitTimeout", f"{what} not done after {self.wait_timeout_s:.0f} s"
            )

    def _delete_vms(self, vms: Sequence[tuple[str, str]]) -> None:
        """Delete VMs (their disk, NIC and IP go with them: deleteOption Delete); blocks."""
        compute = self.clients.compute()
        with azure_errors():
            pollers = [compute.virtual_machines.begin_delete(g, n) for g, n in vms]
            for (_, name), poller in zip(vms, pollers, strict=True):
                self._finish(poller, f"deleting VM {name}")

    def _clean_region(self, cluster: str) -> None:
        """After a failed attempt: delete the cluster's group unless it holds live VMs (a
        half-made cluster keeps them for the next `up`)."""
        try:
            if not [n for n in self.describe(cluster) if n.state != "failed"]:
                self._clean_group(cluster)
        except ProviderError as exc:
            log.warning("could not clean up cluster %s: %s", cluster, exc)

    def _clean_group(self, cluster: str) -> None:
        with azure_errors():
            res.delete_group(self.clients, res.group_name(cluster), self.wait_timeout_s)

    def _wait(self, cluster: str, count: int, on_event: OnEvent) -> list[NodeInfo]:
        """Block until `count` VMs run with addresses; then pin the host key for them."""
        return wait_for_nodes(
            "azure", cluster, count, lambda: self.describe(cluster),
            home=self.home, timeout_s=self.wait_timeout_s, poll_s=self.poll_s,
            on_event=on_event,
        )  # fmt: skip

    # -- describe / terminate -------------------------------------------------------------

    def describe(self, cluster: str) -> list[NodeInfo]:
        """The cluster's VMs, by tag, across every resource group of the subscription; their
        addresses from one NIC and one public-IP listing per group."""
        with azure_errors():
            compute, network = self.clients.compute(), self.clients.network()
            vms = [vm.as_dict() for vm in compute.virtual_machines.list_all()]
            vms = [vm for vm in vms if (vm.get("tags") or {}).get(res.CLUSTER) == cluster]
            groups = sorted({res.group_of(vm["id"]) for vm in vms})
            nics = {
                n.id.lower(): n.as_dict()
                for g in groups
                for n in network.network_interfaces.list(g)
                if n.id
            }
            ips = {
                p.id.lower(): p.as_dict()
                for g in groups
                for p in network.public_ip_addresses.list(g)
                if p.id
            }
        nodes = [inst.node_info(cluster, vm, nics, ips) for vm in vms]
        return sorted(nodes, key=lambda n: n.index)

    def terminate(self, cluster: str) -> None:
        """Delete every resource group tagged with the cluster, and with it everything it
        holds; then any VM tagged with the cluster elsewhere (never a group cloudtrain did not
        tag). Blocks until ARM reports them gone. Idempotent."""
        with azure_errors():
            names = {g["name"] for g in res.cluster_groups(self.clients, res.CLUSTER, cluster)}
            for name in sorted(names):
                res.delete_group(self.clients, name, self.wait_timeout_s)
        stray = [(str(n.extra["resource_group"]), n.node_id) for n in self.describe(cluster)]
        if stray:
            self._delete_vms(stray)
        access.forget_key(self.home, cluster)

    def clusters(self) -> list[str]:
        """Clusters of this owner, from the tags of their resource groups."""
        with azure_errors():
            groups = res.cluster_groups(self.clients, res.OWNER, self.owner)
        return sorted({str((g.get("tags") or {}).get(res.CLUSTER, "")) for g in groups} - {""})

    def executor(self, node: NodeInfo) -> SshExecutor:
        """SSH as ``cloudtrain`` to the node's public address (its private one when it has
        none), with the cluster's key and its pinned host key."""
        address = node.public_ip or node.private_ip
        if not address:
            raise ProviderError("azure", "NoAddress", f"node {node.index} has no address yet")
        return SshExecutor(
            address, user=NODE_USER, options=access.ssh_options(self.home, node.cluster)
        )
