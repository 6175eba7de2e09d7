"""The provider contract: the five verbs every cloud implements, and the objects they pass.

A provider is scoped to one account/project and finds its clusters **by the tags it put on them**,
never by local state, so losing the state file leaks nothing. The verbs:

=============  ==========  ===========  ================================================
verb           side effect  blocks       guarantees
=============  ==========  ===========  ================================================
``plan``       none         no           pure; raises `ConfigError` for a shape the
                                         provider cannot give, before any cloud call
``apply``      creates      until nodes  idempotent on the cluster name: completes a
                            are running  half-made cluster, never makes a second one;
                                         all N nodes or none; capacity errors move to
                                         the next offer, quota/auth errors stop at once
``describe``   none         no           the cluster's nodes from the cloud's own tags
``terminate``  deletes      until gone   idempotent; removes the nodes and every
                                         per-cluster resource it made
``clusters``   none         no           names of this owner's clusters, from tags
``leftovers``  none         no           what of a cluster besides its nodes exists
``executor``   none         no           how to run commands on one node
=============  ==========  ===========  ================================================

SDK errors are mapped to `cloudtrain.errors` at this boundary (`CapacityError`, `QuotaError`,
`AuthError`). Providers are registered by name in the ``cloudtrain.providers`` entry-point group.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from cloudtrain.executors.base import Executor
    from cloudtrain.spec import ClusterSpec


#: Tag/label keys put on every resource a provider creates (clouds adapt the separator).
TAG_CLUSTER = "cloudtrain:cluster"
TAG_NODE = "cloudtrain:node"
TAG_OWNER = "cloudtrain:owner"


class Capability(enum.Enum):
    """What a provider supports beyond the five verbs."""

    GPU = "gpu"
    SPOT = "spot"
    MULTI_NODE = "multi-node"
    STOP = "stop"
    PLACEMENT_GROUP = "placement-group"
    ELASTIC = "elastic"


@dataclass(frozen=True)
class Offer:
    """One way to satisfy a spec: where, which machine type, at what price."""

    provider: str
    region: str
    zones: tuple[str, ...]
    instance_type: str
    price_per_node_hour: float
    spot: bool = False
    accelerator: str | None = None
    accelerator_count: int = 0
    #: provider-only facts of this offer (e.g. the image resolved for its region)
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "region": self.region,
            "zones": list(self.zones),
            "instance_type": self.instance_type,
            "price_per_node_hour": self.price_per_node_hour,
            "spot": self.spot,
            "accelerator": self.accelerator,
            "accelerator_count": self.accelerator_count,
            "extra": dict(self.extra),
        }


@dataclass(frozen=True)
class Plan:
    """What `apply` will do. Printable for ``--dry-run``; the price is kept for cost reports.

    `requests` are the exact requests the first offer would send, so a dry run shows what the
    real run sends (the TorchX habit: dry run and run share one object).
    """

    spec: ClusterSpec
    offers: tuple[Offer, ...]
    requests: Sequence[Mapping[str, Any]] = ()
    #: what this plan could not ask the cloud (a dry run without credentials or network):
    #: the requests then hold named placeholders for it; empty for a plan `apply` may use
    unresolved: tuple[str, ...] = ()

    @property
    def offer(self) -> Offer:
        """The offer tried first."""
        return self.offers[0]

    @property
    def price_per_hour(self) -> float:
        """The whole cluster's $/hour at the first offer's price."""
        return self.offers[0].price_per_node_hour * self.spec.num_nodes


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class NodeInfo:
    """One node as the provider observes it.

    The typed fields after `extra` are what the core reads; `extra` holds provider-only facts
    (an interface id, a resource group, spot or not ...).
    """

    cluster: str
    index: int
    node_id: str
    private_ip: str | None
    public_ip: str | None
    state: str  # pending | running | stopping | stopped | terminated | failed | unreachable
    zone: str | None = None
    instance_type: str | None = None
    extra: Mapping[str, Any] = field(default_factory=_empty)
    #: the node's cloudtrain folder, where jobs/, the bootstrap and checkpoints live
    root: str = ""
    #: the interpreter with torch and cloudtrain on the node
    python: str = "python3"
    #: who SSH logs in as (None: the provider's own default)
    user: str | None = None
    #: where the node runs (a cloud region; None where there are none)
    region: str | None = None
    #: the address that reaches this node when it has none of its own (its head)
    jump: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "index": self.index,
            "node_id": self.node_id,
            "private_ip": self.private_ip,
            "public_ip": self.public_ip,
            "state": self.state,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "extra": dict(self.extra),
            "root": self.root,
            "python": self.python,
            "user": self.user,
            "region": self.region,
            "jump": self.jump,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeInfo:
        """The inverse of `to_dict`; also reads records of the versions that kept ``root``,
        ``python``, ``user``, ``region`` and ``jump`` in `extra`."""
        extra = dict(data.get("extra") or {})
        typed = {k: data[k] if k in data else extra.pop(k, None) for k in _TYPED}
        return cls(
            cluster=data["cluster"],
            index=int(data["index"]),
            node_id=data["node_id"],
            private_ip=data.get("private_ip"),
            public_ip=data.get("public_ip"),
            state=data["state"],
            zone=data.get("zone"),
            instance_type=data.get("instance_type"),
            extra=MappingProxyType(extra),
            root=str(typed["root"] or ""),
            python=str(typed["python"] or "python3"),
            user=typed["user"],
            region=typed["region"],
            jump=typed["jump"],
        )


_TYPED = ("root", "python", "user", "region", "jump")


@dataclass(frozen=True)
class Event:
    """Progress reported by a provider while it works (an attempt, a node coming up)."""

    kind: str  # e.g. "attempt", "capacity", "node", "resource", "wait"
    message: str
    node: int | None = None


OnEvent = Callable[[Event], None]


def ignore_event(event: Event) -> None:
    """An `OnEvent` that drops everything."""


@dataclass(frozen=True)
class ProviderContext:
    """What a provider is built with: cloudtrain's home folder and the provider-only options."""

    home: Path
    options: Mapping[str, Any] = field(default_factory=_empty)


class Provider(Protocol):
    """The contract every provider implements; see the module docstring for the guarantees."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]]

    def plan(self, spec: ClusterSpec) -> Plan:
        """Pure. Raises `ConfigError` when this provider cannot give the spec."""
        ...

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        """Create or complete the cluster; blocks until every node runs. Idempotent."""
        ...

    def describe(self, cluster: str) -> list[NodeInfo]:
        """The cluster's live nodes from the provider's own tags, by index; [] when none."""
        ...

    def terminate(self, cluster: str) -> None:
        """Remove every node and per-cluster resource; blocks until gone. Idempotent."""
        ...

    def clusters(self) -> list[str]:
        """Names of the clusters this owner has on the provider, from its tags (for
        ``down --all`` and reconciliation); sorted. A cluster whose nodes are gone but whose
        other resources remain is one of them."""
        ...

    def leftovers(self, cluster: str) -> list[str]:
        """What of this owner's `cluster` besides its nodes exists (a security group,
        firewall rules, a resource group ...), in words; [] when nothing. `terminate` removes
        them; `down` uses this to act on a cluster whose nodes are all gone."""
        ...

    def executor(self, node: NodeInfo) -> Executor:
        """An executor that runs commands on `node`."""
        ...


# -- helpers for implementations ----------------------------------------------------------------


def default_owner() -> str:
    """Who owns what a provider creates (the owner tag; `down --all` and `clusters()` look
    for it): ``$CLOUDTRAIN_OWNER``, else ``user@host``."""
    import getpass
    import os
    import socket

    return os.environ.get("CLOUDTRAIN_OWNER") or f"{getpass.getuser()}@{socket.gethostname()}"


def _running(node: NodeInfo) -> bool:
    return node.state == "running" and bool(node.private_ip)


def wait_for_nodes(
    provider: str,
    cluster: str,
    count: int,
    describe: Callable[[], list[NodeInfo]],
    *,
    home: Path,
    timeout_s: float,
    poll_s: float,
    on_event: OnEvent = ignore_event,
    ready: Callable[[NodeInfo], bool] = _running,
    settle: Callable[[list[NodeInfo]], bool] | None = None,
) -> list[NodeInfo]:
    """`apply`'s last step: poll `describe` (one call per poll, each reported) until `count`
    nodes are `ready`; let `settle` act on them (True: it changed them, poll again); then pin
    the cluster's host key for every address they have. Raises `ProviderError` (WaitTimeout)
    naming how many were ready and how to remove them."""
    import time

    from cloudtrain import access
    from cloudtrain.errors import ProviderError

    deadline = time.monotonic() + timeout_s
    while True:
        nodes = describe()
        up = [n for n in nodes if ready(n)]
        on_event(Event("wait", f"{len(up)}/{count} nodes running"))
        if len(up) >= count and not (settle and settle(nodes)):
            addresses = [a for n in nodes for a in (n.public_ip, n.private_ip) if a]
            access.known_hosts(home, cluster, addresses)
            return nodes
        if time.monotonic() > deadline:
            raise ProviderError(
                provider, "WaitTimeout",
                f"{len(up)} of {count} nodes of {cluster!r} running after {timeout_s:.0f} s; "
                f"`cloudtrain down {cluster}` removes them",
            )  # fmt: skip
        time.sleep(poll_s)
