"""The Azure provider: one resource group per cluster, its VMs found again by their tags.

`apply` makes, in the first region of the plan that can give the size: the resource group
``cloudtrain-<cluster>`` (tagged with cluster, owner and cluster id, as is everything in it),
an NSG (SSH from the user's CIDR only, everything within the subnet), a VNet/subnet, a proximity
placement group for multi-node clusters, then the N VMs (all started, then all awaited: ARM has
no one-call gang create outside scale sets). When any VM of an attempt fails —
``AllocationFailed`` in its operation, or ``SkuNotAvailable`` on its PUT — every VM of the
attempt is deleted (a ``Failed`` VM too) and the next zone, then region, is tried, each attempt
reported; quota and auth errors stop at once. A region that gave nothing has its resource group
deleted, so a failed `up` leaves nothing.

Everything is created inside the tagged group, so a crash at any point leaves nothing that
`terminate` (delete the groups found by tag) cannot remove. With a cluster id, `describe`,
`terminate` and `leftovers` keep to the resources tagged with it; as the group's name is the
cluster's, a subscription holds one incarnation of a name, and a group that holds a VM of
another (made by hand, or by an older version) is kept: only this incarnation's VMs go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from cloudtrain import access
from cloudtrain.boot import bootstrap
from cloudtrain.errors import CapacityError, ConfigError, ProviderError
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent
from cloudtrain.plan import planner
from cloudtrain.plan.catalog import Catalog
from cloudtrain.providers.azure import _identity
from cloudtrain.providers.azure import _instances as inst
from cloudtrain.providers.azure import _resources as res
from cloudtrain.providers.azure._client import Clients, azure_errors, endpoint
from cloudtrain.provision.engine import CLOUD_CAPABILITIES, Engine
from cloudtrain.provision.provider import ProviderContext, default_owner, wait_for_nodes
from cloudtrain.spec import ClusterSpec

log = logging.getLogger(__name__)
NODE_USER = bootstrap.NODE_USER
#: Seconds between polls of long-running operations (default: ARM's Retry-After, else 30).
POLL_ENV = "CLOUDTRAIN_AZURE_POLL_S"


def _seconds(value: object) -> float | None:
    """``$CLOUDTRAIN_AZURE_POLL_S`` (or the ``poll_s`` option) as seconds; `ConfigError` when
    it is not a number of seconds (>= 0; 0 polls at once)."""
    if value is None:
        return None
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{POLL_ENV} {value!r} is not a number of seconds (>= 0)")
    return seconds


class AzureProvider(Engine):
    """Resource groups of VMs. Options: ``subscription`` (else ``AZURE_SUBSCRIPTION_ID``),
    ``owner``, ``clients`` (a `Clients`, for tests), ``catalog`` (a `Catalog`, for tests),
    ``wait_timeout_s``, ``poll_s`` (also the LRO polling interval; default
    ``$CLOUDTRAIN_AZURE_POLL_S``, else the SDK's: ARM's ``Retry-After``, else 30 s)."""

    name: ClassVar[str] = "azure"
    capabilities: ClassVar[frozenset[Capability]] = CLOUD_CAPABILITIES | {Capability.AUTOSTOP}
    #: what a node boots with, by the request's field (`cloudtrain bootstrap render`)
    user_data = staticmethod(inst.user_data)

    def __init__(self, context: ProviderContext) -> None:
        opts = context.options
        self.home = context.home
        poll = _seconds(opts.get("poll_s", os.environ.get(POLL_ENV) or None))
        self.poll_s = poll if poll is not None else 5.0
        self.clients: Clients = opts.get("clients") or Clients(
            opts.get("subscription"), poll_s=poll
        )
        self.owner = str(opts.get("owner") or default_owner())
        self.catalog: Catalog | None = opts.get("catalog")
        self.wait_timeout_s = float(opts.get("wait_timeout_s", 1800))

    # -- plan ---------------------------------------------------------------------------

    def refine(self, spec: ClusterSpec, offers: Sequence[Offer]) -> list[Offer]:
        """The zones where ``resource_skus`` says this subscription may create the size (no
        subscription: refused before any call)."""
        _ = self.clients.subscription  # ConfigError before any call
        refined: list[Offer] = []
        reasons: list[str] = []
        for offer in offers:
            with azure_errors(offer.region):
                skus = [
                    s.as_dict()
                    for s in self.clients.compute().resource_skus.list(
                        filter=f"location eq {res.odata(offer.region)}"
                    )
                ]
            zones, why = inst.sku_zones(skus, offer.instance_type, offer.region, offer.zones)
            if zones is None:
                log.info("%s", why)
                reasons.append(why)
                continue
            extra = {
                **self.placeholder_extra(spec, offer),
                "accelerated_networking": inst.accelerated_networking(skus, offer.instance_type),
            }
            refined.append(dataclasses.replace(offer, zones=tuple(zones), extra=extra))
        if not refined:
            raise ConfigError(
                f"azure cannot give {offers[0].instance_type} to this subscription now: "
                f"{'; '.join(reasons)} (resource_skus); try another --region or GPU"
            )
        return refined

    def requests(self, spec: ClusterSpec, offer: Offer) -> tuple[dict[str, Any], ...]:
        return inst.plan_requests(spec, offer, self.owner)

    def placeholder_extra(self, spec: ClusterSpec, offer: Offer) -> dict[str, Any]:
        """The image and group come from the spec; whether the size has accelerated
        networking is resource_skus' to say (off until it does)."""
        return {
            "image": inst.image(offer.instance_type, spec.resources.image),
            "resource_group": res.group_name(spec.name),
            "accelerated_networking": False,
        }

    def catalog_offers(self, spec: ClusterSpec) -> Sequence[Offer]:
        return planner.offers(spec, self.catalog)

    # -- the engine's hooks (the algorithm is `Engine.apply`) -----------------------------------

    def holders(self, cluster: str) -> set[tuple[str, str]]:
        """(owner, cluster id) of the cluster's resource group (its name is the cluster's: one
        per subscription) and of every VM tagged with the cluster, whoever made them."""
        with azure_errors():
            groups = res.cluster_groups(self.clients, res.CLUSTER, cluster)
        return {res.holder(r) for r in [*groups, *self._vms(cluster)]}

    def repair(self, spec: ClusterSpec, nodes: list[NodeInfo], on_event: OnEvent) -> list[NodeInfo]:
        """A Failed VM (allocation failed before a crash) is deleted, to be made again."""
        broken = [n for n in nodes if n.state == "failed"]
        if broken:
            on_event(Event("resource", f"deleting {len(broken)} failed VM(s)"))
            self._delete_vms([(str(n.extra["resource_group"]), n.node_id) for n in broken])
        return [n for n in nodes if n.state != "failed"]

    def prepare(
        self, spec: ClusterSpec, offer: Offer, keys: bootstrap.NodeKeys, on_event: OnEvent
    ) -> Any:
        """The resource group in the offer's region (one left elsewhere by an earlier failed
        `up` of this incarnation is deleted first) with its NSG (PUT again: the SSH rule follows
        the caller), VNet and placement group; the ids the VMs refer to, and their custom data."""
        region, cluster = offer.region, spec.name
        labels = res.tags(cluster, self.owner, spec.cluster_id)
        with azure_errors(region):
            where = res.group_location(self.clients, cluster)
            if where is not None and where != region:
                self._delete_groups(cluster, spec.cluster_id)
            on_event(Event("resource", f"{region}: resource group {res.group_name(cluster)}"))
            ids = res.ensure_network(
                self.clients, cluster, labels, region, str(spec.ssh_cidr), ppg=spec.num_nodes > 1
            )
        return ids, inst.custom_data(offer, keys, spec.limits)

    def create(
        self,
        spec: ClusterSpec,
        offer: Offer,
        zone: str | None,
        indices: Sequence[int],
        keys: bootstrap.NodeKeys,
        prepared: Any,
    ) -> None:
        """Azure has no gang API: every VM is started, then all are awaited; any failure
        deletes them all."""
        ids, custom = prepared
        bodies = {
            inst.vm_name(spec.name, i): inst.vm_body(
                spec,
                offer,
                zone,
                i,
                owner=self.owner,
                ids=ids,
                custom=custom,
                public_key=keys.user_public,
            )
            for i in indices
        }
        group = res.group_name(spec.name)
        self._create(group, bodies, f"{offer.region}/{zone}" if zone else offer.region)
        if spec.limits:  # each node may delete itself, and nothing else
            try:
                with azure_errors(offer.region):
                    _identity.grant(self.clients, group, list(bodies), spec.name, spec.cluster_id)
            except ProviderError:  # a node that cannot stop itself is not made: none of them
                with contextlib.suppress(ProviderError), azure_errors():
                    _identity.revoke(self.clients, group)  # the role outlives the group
                self._delete_vms([(group, name) for name in bodies])
                raise

    def clean(self, spec: ClusterSpec, offer: Offer) -> None:
        """Delete this incarnation's group unless it holds live VMs (a half-made cluster keeps
        them for the next `up`)."""
        if not [n for n in self.describe(spec.name, spec.cluster_id) if n.state != "failed"]:
            self._delete_groups(spec.name, spec.cluster_id)

    def wait(self, spec: ClusterSpec, region: str, on_event: OnEvent) -> list[NodeInfo]:
        """Block until every VM runs with addresses; then pin the host key for them."""
        return wait_for_nodes(
            "azure", spec.name, spec.num_nodes, lambda: self.describe(spec.name, spec.cluster_id),
            home=self.home, timeout_s=self.wait_timeout_s, poll_s=self.poll_s,
            on_event=on_event,
        )  # fmt: skip

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        return [f"resource group {g['name']}" for g in self._groups(cluster, cluster_id)]

    def _groups(self, cluster: str, cluster_id: str | None) -> list[dict[str, Any]]:
        """This owner's resource groups tagged with the cluster (and `cluster_id`, if given)."""
        with azure_errors():
            groups = res.cluster_groups(self.clients, res.CLUSTER, cluster)
        return [g for g in groups if res.mine(g, self.owner, cluster_id)]

    def _delete_groups(self, cluster: str, cluster_id: str | None) -> None:
        """Delete this owner's groups of the cluster (of `cluster_id`, if given) and all they
        hold; blocks. Never a group that holds a VM of the name that is not of this owner and
        incarnation: it would go with the group."""
        names = {g["name"].lower(): g["name"] for g in self._groups(cluster, cluster_id)}
        if names:
            for vm in self._vms(cluster):
                if not res.mine(vm, self.owner, cluster_id):
                    names.pop(res.group_of(vm["id"]).lower(), None)
        with azure_errors():
            for name in sorted(names.values()):
                res.delete_group(self.clients, name, self.wait_timeout_s)

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

    # -- describe / terminate -------------------------------------------------------------

    def _vms(self, cluster: str) -> list[dict[str, Any]]:
        """Every VM of the subscription tagged with the cluster, whoever made it."""
        with azure_errors():
            vms = [vm.as_dict() for vm in self.clients.compute().virtual_machines.list_all()]
        return [vm for vm in vms if (vm.get("tags") or {}).get(res.CLUSTER) == cluster]

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        """This owner's VMs of the cluster (of `cluster_id`, if given), by tag, across every
        resource group of the subscription; their addresses from one NIC and one public-IP
        listing per group."""
        vms = [v for v in self._vms(cluster) if res.mine(v, self.owner, cluster_id)]
        with azure_errors():
            network = self.clients.network()
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

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        """Delete this owner's resource groups tagged with the cluster (and `cluster_id`, if
        given), and with each everything it holds; then any VM so tagged elsewhere (never a
        group cloudtrain did not tag, nor one holding a VM of another owner or incarnation).
        Blocks until ARM reports them gone. Idempotent."""
        with azure_errors():
            for group in self._groups(cluster, cluster_id):
                _identity.revoke(self.clients, group["name"])
        self._delete_groups(cluster, cluster_id)
        stray = [
            (str(n.extra["resource_group"]), n.node_id) for n in self.describe(cluster, cluster_id)
        ]
        if stray:
            self._delete_vms(stray)
        access.forget_key(self.home, cluster)

    def remove_nodes(self, cluster: str, cluster_id: str | None, indices: Collection[int]) -> None:
        """Delete the VMs of the nodes `indices` (their disk, NIC and address go with them)
        and their role assignments; the group, its network and the other nodes stay
        (`RemovesNodes`). Blocks until ARM reports them gone."""
        wanted = set(indices)
        vms = [
            v
            for v in self._vms(cluster)
            if res.mine(v, self.owner, cluster_id) and inst.index_of(v) in wanted
        ]
        with azure_errors():
            _identity.unassign(self.clients, [str(v["id"]) for v in vms])
        self._delete_vms([(res.group_of(v["id"]), str(v["name"])) for v in vms])

    def clusters(self) -> list[str]:
        """Clusters of this owner, from the tags of their resource groups."""
        with azure_errors():
            groups = res.cluster_groups(self.clients, res.OWNER, self.owner)
        return sorted({str((g.get("tags") or {}).get(res.CLUSTER, "")) for g in groups} - {""})

    def api_endpoint(self, node: NodeInfo) -> str | None:
        return endpoint()
