"""The provisioning engine: the one `apply` every cloud runs, over a few small hooks.

Every cloud provider (aws, gcp, azure, and `fake` for tests) subclasses `Engine` and implements
only what differs between clouds; the algorithm, and the promises that must hold on every cloud,
live here once::

    apply(plan)
      │ warn when SSH is open wider than a /8
      │ holders(cluster)                      a name held by another owner, or by this owner
      │                                       under another cluster id: refuse, nothing made
      │ describe(cluster, id)                 this incarnation's nodes, from the cloud's tags;
      │                                       not asked when nobody holds the name (a node
      │                                       carries it: a new cluster has none)
      │ repair(nodes)                         e.g. Azure deletes VMs whose allocation failed
      │ more nodes than asked                 refuse (a silent second bill is worse than an error)
      │ offers pinned to the existing nodes' region and zone (a half-made cluster is completed
      │ where it is)
      │ nothing missing ───────────────────►  prepare (rules follow the spec), wait(spec, region)
      └ for each offer (a region), in the plan's order:
          prepare(spec, offer, keys)          per-region resources (security group, key ...)
          for each zone: create(missing)      one gang attempt: all missing nodes or none
              CapacityError → next zone; any other error stops the loop
          finally, unless a zone succeeded: clean(spec, offer)
                                              per-region resources go when no node of the
                                              cluster lives there, whatever was raised
          success ─────────────────────────►  wait(spec, region)
      no offer had room → CapacityError naming every attempt

Hooks that mutate the cloud are idempotent, so a crash after any call is finished by the next
`apply` and cleaned by `terminate`. `clean` never raises: it logs, so the error that stopped
the attempt is the one the user sees.
"""

from __future__ import annotations

import abc
import dataclasses
import ipaddress
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cloudtrain import access
from cloudtrain.boot import bootstrap
from cloudtrain.errors import CapacityError, ConfigError, ProviderError
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent, Plan, ignore_event
from cloudtrain.plan import planner
from cloudtrain.spec import ClusterSpec

if TYPE_CHECKING:
    from cloudtrain.executors.base import Executor

log = logging.getLogger(__name__)

#: What an offline dry run shows for the caller's address it could not find.
CALLER_PLACEHOLDER = "<your public address>/32"
#: SSH open to more addresses than this prefix allows gets a warning.
WIDEST_QUIET_PREFIX = 8


#: What a cloud on the engine gives (a provider adds or takes away what differs).
CLOUD_CAPABILITIES = frozenset(
    {Capability.GPU, Capability.SPOT, Capability.MULTI_NODE, Capability.PLACEMENT_GROUP,
     Capability.REGIONS, Capability.IMAGE, Capability.USER_DATA}
)  # fmt: skip


def wide_cidr(cidr: str | None) -> bool:
    """True when `cidr` admits more than a /8 (IPv4) or a /32 (IPv6)."""
    if not cidr:
        return False
    net = ipaddress.ip_network(cidr, strict=False)
    widest = WIDEST_QUIET_PREFIX if net.version == 4 else 32
    return net.prefixlen < widest


class Engine(abc.ABC):
    """`apply` once for every cloud; subclasses implement the hooks below."""

    name: ClassVar[str]
    home: Path
    owner: str

    @property
    def owner_key(self) -> str:
        """The owner as the cloud's tags write it (`holders` reports it so)."""
        return self.owner

    # -- hooks ------------------------------------------------------------------------------

    @abc.abstractmethod
    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        """This owner's live nodes of `cluster` (of the incarnation `cluster_id`, when given),
        from the cloud's tags, by index."""

    @abc.abstractmethod
    def holders(self, cluster: str) -> set[tuple[str, str]]:
        """Who holds the name `cluster` in the account: (owner as tagged, cluster id or ""
        when untagged) of every live resource that carries it, whoever made it. Never empty
        while a node of the name lives (a resource no node can outlive will do): `apply`
        asks `describe` only when this is not empty."""

    @abc.abstractmethod
    def prepare(
        self, spec: ClusterSpec, offer: Offer, keys: bootstrap.NodeKeys, on_event: OnEvent
    ) -> Any:
        """Make (or find) the per-region resources of `offer`'s region; what `create` needs.
        Idempotent; a rule that no longer matches the spec (the caller's address moved) is
        changed, and the change reported."""

    @abc.abstractmethod
    def create(
        self,
        spec: ClusterSpec,
        offer: Offer,
        zone: str | None,
        indices: Sequence[int],
        keys: bootstrap.NodeKeys,
        prepared: Any,
    ) -> None:
        """One gang attempt: all of `indices` in `zone`, or none of them (what an attempt left
        half-made is deleted before this raises). Raises `CapacityError` when the zone has
        no room: the engine tries the next."""

    @abc.abstractmethod
    def clean(self, spec: ClusterSpec, offer: Offer) -> None:
        """After a failed attempt: delete the region's per-cluster resources when no node of
        the cluster lives there. May raise; the engine logs it."""

    @abc.abstractmethod
    def wait(self, spec: ClusterSpec, region: str, on_event: OnEvent) -> list[NodeInfo]:
        """Block until every node of the cluster runs with its addresses; pin its host key."""

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        """What of the cluster (of `cluster_id`, when given) besides its nodes exists (security
        groups, firewall rules, resource groups ...), in words: `down` removes a cluster that
        has only these."""
        return []

    def requests(self, spec: ClusterSpec, offer: Offer) -> Sequence[Mapping[str, Any]]:
        """The exact requests the first attempt at `offer` sends, with named placeholders for
        what only the cloud resolves (for ``--dry-run``)."""
        return ()

    def placeholder_extra(self, spec: ClusterSpec, offer: Offer) -> dict[str, Any]:
        """`offer.extra` as far as it can be known without asking the cloud."""
        return {}

    def catalog_offers(self, spec: ClusterSpec) -> Sequence[Offer]:
        """The catalog's offers for `spec`, cheapest first (no cloud call)."""
        return planner.offers(spec)

    def refine(self, spec: ClusterSpec, offers: Sequence[Offer]) -> list[Offer]:
        """`offers` as the cloud gives them now (read-only calls): each with the zones that
        have the type and what else the cloud resolves (`Offer.extra`); `ConfigError`, naming
        what was asked, when none is left. Input the cloud would refuse is refused before
        the first call. Default: the catalog's offers as they are."""
        return list(offers)

    def api_endpoint(self, node: NodeInfo) -> str | None:
        """The cloud API's URL for `node`'s region (a local one means a test stand-in, whose
        node addresses are invented: SSH then reaches loopback only)."""
        return None

    # -- what every cloud does alike ----------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        """The catalog's offers (`catalog_offers`) as the cloud gives them now (`refine`), with
        the first attempt's requests; the SSH rule's address resolved before any call (none
        found: refused)."""
        offers = self.catalog_offers(spec)
        cidr, _ = access.ssh_cidr(spec.ssh_cidr)
        spec = dataclasses.replace(spec, ssh_cidr=cidr)
        refined = self.refine(spec, offers)
        return Plan(spec=spec, offers=tuple(refined), requests=self.requests(spec, refined[0]))

    def executor(self, node: NodeInfo) -> Executor:
        """SSH as the nodes' user (`bootstrap.NODE_USER`) with the cluster's key and its pinned
        host keys: to the node's public address; with none, through the node it names as its
        jump host to its private one (a node without a public address of its own), or to its
        private one."""
        from cloudtrain.executors.ssh import SshExecutor

        options = access.ssh_options(self.home, node.cluster)
        address = node.public_ip
        if not address and node.jump and node.private_ip:
            options += access.jump_options(options, node.jump, bootstrap.NODE_USER)
            address = node.private_ip
        address = address or node.private_ip
        if not address:
            raise ProviderError(self.name, "NoAddress", f"node {node.index} has no address yet")
        local = access.local_endpoint(self.api_endpoint(node))
        return SshExecutor(address, user=bootstrap.NODE_USER, options=options, loopback_only=local)

    def plan_offline(self, spec: ClusterSpec, why: str) -> Plan:
        """The plan from the catalog alone, for a dry run that cannot ask the cloud (no
        credentials, no network): the price, the offers in order, and the requests with named
        placeholders; `Plan.unresolved` says what was not asked and why. Never for `apply`."""
        offers = self.catalog_offers(spec)
        unresolved = [f"{self.name}: the zones that offer the type and the image ({why})"]
        if spec.ssh_cidr is None:
            cidr = access.caller_cidr()
            if cidr is None:
                cidr = CALLER_PLACEHOLDER
                unresolved.append(
                    "your public address, which SSH is opened to (--ssh-cidr sets it)"
                )
            spec = dataclasses.replace(spec, ssh_cidr=cidr)
        placed = [dataclasses.replace(o, extra=self.placeholder_extra(spec, o)) for o in offers]
        return Plan(
            spec=spec,
            offers=tuple(placed),
            requests=self.requests(spec, placed[0]),
            unresolved=tuple(unresolved),
        )

    def region_of(self, node: NodeInfo) -> str:
        """The region a node runs in."""
        if node.region is None:
            raise ProviderError(self.name, "NoRegion", f"node {node.index} has no region")
        return node.region

    def repair(self, spec: ClusterSpec, nodes: list[NodeInfo], on_event: OnEvent) -> list[NodeInfo]:
        """Remove nodes that can never run (a cloud's failed allocations); the rest."""
        return nodes

    # -- the algorithm ----------------------------------------------------------------------

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        """Create or complete the cluster; blocks until every node runs. Idempotent on the
        cluster name. Raises `ConfigError` for a name another owner holds or more nodes than
        asked (before any write), `CapacityError` when no zone of any offer had room (nothing
        left behind), `QuotaError`/`AuthError` at once."""
        spec = plan.spec
        if spec.ssh_cidr in access.WORLD:
            on_event(
                Event("warning", f"SSH is open to the whole internet ({spec.ssh_cidr}), as asked")
            )
        elif wide_cidr(spec.ssh_cidr):
            on_event(
                Event(
                    "warning",
                    f"SSH is open to {spec.ssh_cidr}, wider than a "
                    f"/{WIDEST_QUIET_PREFIX}, as asked",
                )
            )
        held = self.holders(spec.name)
        self._refuse_held(spec, held)
        # a node carries the name, so a name nobody holds has no nodes: a new cluster (the
        # common `up`) asks nothing more; one that exists pays one more round trip
        found = self.describe(spec.name, spec.cluster_id) if held else []
        keys = bootstrap.NodeKeys.for_cluster(self.home, spec.name)  # nothing made before
        nodes = self.repair(spec, found, on_event)
        if len(nodes) > spec.num_nodes:
            raise ConfigError(
                f"cluster {spec.name!r} has {len(nodes)} nodes, more than the "
                f"{spec.num_nodes} asked for; `cloudtrain down {spec.name}` first"
            )
        missing = sorted(set(range(spec.num_nodes)) - {n.index for n in nodes})
        offers = self._pinned(spec, plan.offers, nodes)
        if not missing:  # complete: its rules still follow the spec (the caller's address)
            self.prepare(spec, offers[0], keys, on_event)
            return self.wait(spec, offers[0].region, on_event)
        attempts: list[str] = []
        for offer in offers:
            if self._attempt(spec, offer, missing, keys, attempts, on_event):
                return self.wait(spec, offer.region, on_event)
        kept = (
            f"its {len(nodes)} running node(s) are kept"
            if nodes
            else ("nothing of the cluster was left behind")
        )
        raise CapacityError(
            self.name,
            "NoCapacity",
            f"no zone had {len(missing)} × {offers[0].instance_type}: {'; '.join(attempts)}; "
            f"{kept}",
        )

    def _refuse_held(self, spec: ClusterSpec, held: set[tuple[str, str]]) -> None:
        """`ConfigError` when the name is `held` by another owner, or by this owner under
        another cluster id (a record of an older version, with no id, takes what it finds)."""
        others = {owner for owner, _ in held if owner != self.owner_key}
        if others:
            raise ConfigError(
                f"cluster name {spec.name!r} is taken on {self.name} by another owner "
                f"({', '.join(sorted(others))}); nothing was created; choose another --name"
            )
        ids = {cid or "none" for owner, cid in held if cid != spec.cluster_id}
        if spec.cluster_id is not None and ids:
            raise ConfigError(
                f"cluster name {spec.name!r} is held on {self.name} by another cluster of "
                f"owner {self.owner} (id {', '.join(sorted(ids))}), made from another machine "
                "or no longer recorded here, so its keys are not here; nothing was created; "
                f"`cloudtrain down {spec.name} --provider {self.name}` removes it, or choose "
                "another --name"
            )

    def _pinned(
        self, spec: ClusterSpec, offers: Sequence[Offer], nodes: list[NodeInfo]
    ) -> list[Offer]:
        """The offers to try: all of them, or, to complete a half-made cluster, those of its
        region narrowed to its zone."""
        if not nodes:
            return list(offers)
        region, zone = self.region_of(nodes[0]), nodes[0].zone
        pinned = [
            dataclasses.replace(o, zones=(zone,) if zone else ())
            for o in offers
            if o.region == region
        ]
        if not pinned:
            raise ConfigError(f"cluster {spec.name!r} runs in {region}, not in the plan")
        return pinned

    def _attempt(
        self,
        spec: ClusterSpec,
        offer: Offer,
        missing: list[int],
        keys: bootstrap.NodeKeys,
        attempts: list[str],
        on_event: OnEvent,
    ) -> bool:
        """Try the offer's zones in turn; True when one of them made every missing node."""
        made = False
        try:
            prepared = self.prepare(spec, offer, keys, on_event)
            for zone in offer.zones or (None,):
                place = f"{offer.region}/{zone}" if zone else offer.region
                on_event(
                    Event("attempt", f"{place}: creating {len(missing)} × {offer.instance_type}")
                )
                try:
                    self.create(spec, offer, zone, missing, keys, prepared)
                except CapacityError as exc:
                    attempts.append(f"{place}: {exc.code}")
                    on_event(Event("capacity", f"{place}: {exc.code}; trying the next zone"))
                    continue
                made = True
                return True
            return False
        finally:
            if not made:
                self._clean(spec, offer)

    def _clean(self, spec: ClusterSpec, offer: Offer) -> None:
        try:
            self.clean(spec, offer)
        except Exception as exc:  # the attempt's own error is the one to report
            log.warning("could not clean %s of cluster %s: %s", offer.region, spec.name, exc)
