"""The GCP provider: Compute Engine instances per cluster, found again by their labels.

Prerequisites: ``pip install 'cloudtrain[gcp]'``; credentials that ``google.auth.default()``
finds (``gcloud auth application-default login`` or ``GOOGLE_APPLICATION_CREDENTIALS``); a
project (``--project``, ``CLOUDSDK_CORE_PROJECT``/``GOOGLE_CLOUD_PROJECT``, or the
credentials' own); the Compute Engine API enabled and GPU quota (``GPUS_ALL_REGIONS`` and the
per-region GPU quota) for the shape.

`apply` makes, in the first zone of the plan that has capacity: two firewall rules (SSH from the
user's CIDR only; everything between the cluster's instances, by network tag), for multi-node
A100 (A2) clusters a compact placement policy (and gVNIC on the instances), and then all N
instances in **one** ``instances.bulkInsert`` (``count = minCount = N``: all or nothing).
Instances carry the labels ``cloudtrain-cluster``, ``cloudtrain-owner`` and (for a cluster of
this version) ``cloudtrain-cluster-id``; the node index is in the name (see `_instances`). The
owner label is the owner written losslessly (`res.owner_label`); a cluster labelled by an older
version (``alice-lab`` for ``alice@lab``, ``alice.lab`` or ``Alice@Lab`` alike) is still this
owner's when its cluster id is the one recorded here; one with no id, or not recorded here, is
reached with ``--owner <that label>`` (an old label cannot say which of those owners made it). The
firewall rules and the policy, named by the cluster alone, record the same in their description
and are deleted only when no other owner, and no other incarnation of the name, holds it. Boot
disks are deleted with their instance; spot nodes are ``SPOT`` and deleted when preempted;
``max_hours`` sets ``maxRunDuration`` so a forgotten cluster deletes itself. OS Login is off
for the node and the cluster's public key is in the instance metadata for the ``cloudtrain``
user; no service account is attached to the nodes.
Capacity errors (``ZONE_RESOURCE_POOL_EXHAUSTED``, ``UNSUPPORTED_OPERATION``), whether in the
call's answer or in its finished operation, move to the next zone; quota and auth errors stop
at once; a failed attempt leaves nothing behind.

Supports: GPU (V100 on N1, A100 and A100-80GB on A2), spot, multi-node, compact placement.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from cloudtrain import access
from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent
from cloudtrain.providers.gcp import _resources as res
from cloudtrain.providers.gcp._client import Clients, import_compute, last
from cloudtrain.providers.gcp._instances import (
    DEFAULT_IMAGE,
    Shape,
    bulk_insert_body,
    dry_run,
    fast_network,
    max_run_seconds,
    node_info,
    user_data,
)
from cloudtrain.provision.engine import CLOUD_CAPABILITIES, Engine
from cloudtrain.provision.provider import ProviderContext, default_owner, wait_for_nodes
from cloudtrain.spec import ClusterSpec

log = logging.getLogger(__name__)


#: A GCE resource name (RFC 1035): what a network's name may be, so that it is one path
#: segment of the API's URLs and nothing else.
NETWORK_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")


def network_name(value: object) -> str:
    """The ``network`` option, checked: `ConfigError` naming what a GCE name allows."""
    if not isinstance(value, str) or not NETWORK_RE.fullmatch(value):
        raise ConfigError(
            f"--network {value!r} is not a GCE network name (1 to 63 lowercase letters, digits "
            "and '-', starting with a letter, not ending with '-')"
        )
    return value


class GcpProvider(Engine):
    """Compute Engine instance groups. Options: ``project``, ``owner``, ``network`` (default
    ``default``), ``max_hours``, ``clients`` (a `Clients`, for tests), ``wait_timeout_s``,
    ``poll_s``."""

    name: ClassVar[str] = "gcp"
    capabilities: ClassVar[frozenset[Capability]] = CLOUD_CAPABILITIES | {Capability.AUTOSTOP}
    #: what a node boots with, by the request's field (`cloudtrain bootstrap render`)
    user_data = staticmethod(user_data)

    def __init__(self, context: ProviderContext) -> None:
        opts = context.options
        self.home = context.home
        self.settings = opts
        self.clients: Clients = opts.get("clients") or Clients(project=opts.get("project"))
        self.owner = str(opts.get("owner") or default_owner())
        self.network = network_name(opts.get("network") or "default")
        self.wait_timeout_s = float(opts.get("wait_timeout_s", 900))
        self.poll_s = float(opts.get("poll_s", 2.0))

    # -- plan ---------------------------------------------------------------------------

    def refine(self, spec: ClusterSpec, offers: Sequence[Offer]) -> list[Offer]:
        """The zones whose accelerator types offer the GPU (one read-only call per GPU type)."""
        self._max_run_s(spec)  # a bad max_hours is refused before any call
        offered: dict[str, dict[str, int]] = {}
        refined: list[Offer] = []
        for offer in offers:
            shape = Shape.of(offer)
            if shape.accelerator_type not in offered:
                offered[shape.accelerator_type] = res.accelerator_zones(
                    self.clients, shape.accelerator_type
                )
            most = offered[shape.accelerator_type]
            zones = tuple(z for z in offer.zones if most.get(z, 0) >= offer.accelerator_count)
            if not zones:
                log.info("%s: no zone offers %s", offer.region, shape.accelerator_type)
                continue
            extra = self.placeholder_extra(spec, offer)
            refined.append(dataclasses.replace(offer, zones=zones, extra=extra))
        if not refined:
            where = "; ".join(f"{o.region}: {', '.join(o.zones)}" for o in offers)
            raise ConfigError(
                f"gcp offers {Shape.of(offers[0]).accelerator_type} × "
                f"{offers[0].accelerator_count} in no catalog zone ({where}) right now "
                "(acceleratorTypes.aggregatedList); try another --zone, --region or GPU"
            )
        return refined

    def requests(self, spec: ClusterSpec, offer: Offer) -> list[dict[str, Any]]:
        max_run_s = self._max_run_s(spec)
        return dry_run(spec, offer, owner=self.owner, network=self.network, max_run_s=max_run_s)

    def placeholder_extra(self, spec: ClusterSpec, offer: Offer) -> dict[str, Any]:
        """Everything of a GCP offer comes from the catalog and the spec: only the zones are
        the cloud's to narrow."""
        shape = Shape.of(offer)
        return {
            "image": spec.resources.image or DEFAULT_IMAGE,
            "machine_type": shape.machine_type,
            "accelerator_type": shape.accelerator_type,
        }

    def _max_run_s(self, spec: ClusterSpec) -> int | None:
        """The nodes' ``maxRunDuration``: until the cluster's lifetime or budget ends (`up`
        resolved it), else its ``max_hours`` (older records kept it as an option)."""
        if spec.limits.ends_at is not None:
            return max(30, math.ceil(spec.limits.ends_at - time.time()))
        return max_run_seconds(spec.limits.max_hours or spec.extra.get("max_hours")
                               or self.settings.get("max_hours"))  # fmt: skip

    # -- the engine's hooks (the algorithm is `Engine.apply`) -----------------------------------

    @property
    def owner_key(self) -> str:
        """The owner as labels and descriptions write it (`res.owner_label`)."""
        return res.owner_label(self.owner)

    def holders(self, cluster: str) -> set[tuple[str, str]]:
        """(owner label, cluster id or "") of the name's instances (by label), firewall rules
        and placement policies (by description), whoever made them."""
        labelled = res.live_instances(self.clients, res.LABEL_CLUSTER, cluster)
        described = [h for h in res.firewall_holders(self.clients) if h.cluster == cluster]
        described += [p.holder for p in res.policies(self.clients, cluster) if p.holder]
        return {_holder(i) for i in labelled} | {(h.owner, h.cluster_id) for h in described}

    def _is_mine(self, holder: tuple[str, str], cluster_id: str | None) -> bool:
        """Made by this owner, and of the incarnation `cluster_id` when one is given. A
        resource labelled before owner labels were lossless carries `res.legacy_owner_label`,
        which another owner may share (``alice@lab`` and ``alice.lab`` both wrote
        ``alice-lab``): it is this owner's only with the cluster id this home recorded (random
        per incarnation), never by the label alone."""
        owner, found_id = holder
        if owner == self.owner_key:
            return cluster_id is None or found_id == cluster_id
        legacy = owner == res.legacy_owner_label(self.owner)
        return legacy and bool(cluster_id) and found_id == cluster_id

    def _refuse_held(self, spec: ClusterSpec, held: set[tuple[str, str]]) -> None:
        """The engine's refusal, with this incarnation's resources of an older label (found
        by their cluster id: `_is_mine`) counted as this owner's."""
        mine = {
            (self.owner_key, cid) if self._is_mine((owner, cid), spec.cluster_id) else (owner, cid)
            for owner, cid in held
        }
        super()._refuse_held(spec, mine)

    def _only_mine(self, cluster: str, cluster_id: str | None) -> bool:
        """Whether every holder of the name is this owner (of `cluster_id`, when given): only
        then are the rules and policy, named by the cluster alone, this one's to delete."""
        return all(self._is_mine(h, cluster_id) for h in self.holders(cluster))

    def prepare(
        self, spec: ClusterSpec, offer: Offer, keys: bootstrap.NodeKeys, on_event: OnEvent
    ) -> Any:
        """The cluster's firewall rules (SSH from the caller's CIDR follows it) and, for
        multi-node A2, the compact placement policy of the region; the policy's name."""
        cluster, timeout = spec.name, self.wait_timeout_s
        bodies = res.firewall_bodies(
            cluster, self.owner, str(spec.ssh_cidr), self.network, spec.cluster_id
        )
        for change in res.ensure_firewalls(self.clients, bodies, timeout) or []:
            on_event(Event("resource", change))
        if not fast_network(spec, offer):
            return None
        policy = res.policy_body(cluster, self.owner, spec.cluster_id)
        res.ensure_policy(self.clients, offer.region, policy, timeout)
        return res.resource_name(cluster)

    def create(
        self,
        spec: ClusterSpec,
        offer: Offer,
        zone: str | None,
        indices: Sequence[int],
        keys: bootstrap.NodeKeys,
        prepared: Any,
    ) -> None:
        body = bulk_insert_body(
            spec, offer, list(indices), owner=self.owner, keys=keys,
            image=str(offer.extra["image"]), network=self.network,
            max_run_s=self._max_run_s(spec), policy=prepared,
        )  # fmt: skip
        self._bulk_insert(spec, str(zone), body)

    def clean(self, spec: ClusterSpec, offer: Offer) -> None:
        """Remove the firewall rules and placement policy when no instance of this incarnation
        exists (a half-made cluster keeps them for `up`) and no one else holds the name."""
        name, cid = spec.name, spec.cluster_id
        if not self._instances(name, cid) and self._only_mine(name, cid):
            res.delete_all(self.clients, name, timeout_s=60)

    def wait(self, spec: ClusterSpec, region: str, on_event: OnEvent) -> list[NodeInfo]:
        """Block until every node runs with both addresses; one paged list per poll."""
        return wait_for_nodes(
            "gcp", spec.name, spec.num_nodes, lambda: self.describe(spec.name, spec.cluster_id),
            home=self.home, timeout_s=self.wait_timeout_s, poll_s=self.poll_s,
            on_event=on_event,
            ready=lambda n: n.state == "running" and bool(n.private_ip and n.public_ip),
        )  # fmt: skip

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        """The cluster's firewall rules and placement policies, when `terminate` would delete
        them: never while another owner or another incarnation holds the name."""
        if not self._only_mine(cluster, cluster_id):
            return []
        rules = [h for h in res.firewall_holders(self.clients) if h.cluster == cluster]
        return [f"firewall rules of cluster {cluster}" for _ in rules[:1]] + [
            f"placement policy {p.name} in {p.region}" for p in res.policies(self.clients, cluster)
        ]

    def _bulk_insert(self, spec: ClusterSpec, zone: str, body: dict[str, Any]) -> None:
        """One all-or-nothing bulkInsert, waited on; on any error, delete whatever of it GCE
        left in the zone (it should leave nothing: ``minCount``) before raising."""
        compute = import_compute()
        resource = compute.BulkInsertInstanceResource.from_json(json.dumps(body))
        try:
            op = self.clients.mutate(
                "instances.bulkInsert",
                self.clients.instances().bulk_insert_unary,
                zone,
                project=self.clients.project,
                zone=zone,
                bulk_insert_instance_resource_resource=resource,
            )
            self.clients.wait(op, zone, self.wait_timeout_s)
        except ProviderError:
            names = set(body["perInstanceProperties"])
            made = self._instances(spec.name, spec.cluster_id)
            self._delete([i for i in made if i.name in names and last(i.zone) == zone])
            raise

    # -- describe / terminate -------------------------------------------------------------

    def _instances(self, cluster: str, cluster_id: str | None = None) -> list[Any]:
        """This owner's instances of `cluster` (of the incarnation `cluster_id`, when given)."""
        found = res.live_instances(self.clients, res.LABEL_CLUSTER, cluster)
        return [i for i in found if self._is_mine(_holder(i), cluster_id)]

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        nodes = [node_info(cluster, i) for i in self._instances(cluster, cluster_id)]
        return sorted((n for n in nodes if n is not None), key=lambda n: n.index)

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        """Delete the instances found by label (their boot disks go with them), wait until they
        are gone, then the firewall rules and placement policy unless someone else holds the
        name (another owner, or another incarnation when `cluster_id` is given). Idempotent."""
        self._delete_and_wait(cluster, cluster_id)
        if self._only_mine(cluster, cluster_id):  # the rules' names are every incarnation's
            res.delete_all(self.clients, cluster, timeout_s=self.wait_timeout_s)
        access.forget_key(self.home, cluster)

    def remove_nodes(self, cluster: str, cluster_id: str | None, indices: Collection[int]) -> None:
        """Delete the instances of the nodes `indices` (their boot disks go with them) and wait
        until they are gone; the rules, the policy and the other nodes stay (`RemovesNodes`)."""
        self._delete_and_wait(cluster, cluster_id, set(indices))

    def _delete_and_wait(
        self, cluster: str, cluster_id: str | None, indices: Collection[int] | None = None
    ) -> None:
        """Delete the cluster's instances (those of the nodes `indices`, if given) and wait
        until none of them is listed."""

        def chosen() -> list[Any]:
            found = self._instances(cluster, cluster_id)
            if indices is None:
                return found
            return [i for i in found if res.index_of(cluster, i.name) in indices]

        self._delete(chosen())
        deadline = time.monotonic() + self.wait_timeout_s
        while chosen():
            if time.monotonic() > deadline:
                raise ProviderError(
                    "gcp",
                    "WaitTimeout",
                    f"instances of {cluster!r} still not deleted after "
                    f"{self.wait_timeout_s:.0f} s; run `cloudtrain down {cluster}` again",
                )
            time.sleep(self.poll_s)

    def _delete(self, instances: Sequence[Any]) -> None:
        """Delete `instances` (all calls first, then the waits); one already gone is fine."""
        ops = []
        for inst in instances:
            zone = last(inst.zone)
            try:
                ops.append(
                    (
                        zone,
                        self.clients.mutate(
                            "instances.delete",
                            self.clients.instances().delete_unary,
                            zone,
                            project=self.clients.project,
                            zone=zone,
                            instance=inst.name,
                        ),
                    )
                )
            except ProviderError as exc:
                if exc.code not in ("NOT_FOUND", "HTTP_404", "RESOURCE_NOT_READY"):
                    raise  # not ready: a delete is already under way; the caller waits
        for zone, op in ops:
            self.clients.wait(op, zone, self.wait_timeout_s)

    def clusters(self) -> list[str]:
        """Clusters of this owner: any instance labelled with the owner, or a firewall rule
        whose description names it (a crash before the instances leaves only those)."""
        mine = res.owner_label(self.owner)
        names = {
            i.labels.get(res.LABEL_CLUSTER, "")
            for i in res.live_instances(self.clients, res.LABEL_OWNER, mine)
        }
        names |= {h.cluster for h in res.firewall_holders(self.clients) if h.owner == mine}
        return sorted(names - {""})

    def api_endpoint(self, node: NodeInfo) -> str | None:
        return self.clients.endpoint


def _holder(inst: Any) -> tuple[str, str]:
    """(owner label, cluster id or "") of an instance, from its labels."""
    found = inst.labels
    return str(found.get(res.LABEL_OWNER, "")), str(found.get(res.LABEL_CLUSTER_ID, ""))
