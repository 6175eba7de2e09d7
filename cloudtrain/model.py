"""The values the layers pass each other: offers, plans, nodes, events, and the tag keys.

Plain frozen data, no behaviour beyond (de)serialising: the contract
(`cloudtrain.provision.provider`), the engine, the state and the CLI all speak these, and none
of them needs the others to.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cloudtrain.spec import ClusterSpec


#: Tag/label keys put on every resource a provider creates (clouds adapt the separator).
TAG_CLUSTER = "cloudtrain:cluster"
TAG_NODE = "cloudtrain:node"
TAG_OWNER = "cloudtrain:owner"
#: The random id of one incarnation of a cluster name (`new_cluster_id`): what `describe` and
#: `terminate` of a recorded cluster match besides the name and the owner, so a record never
#: acts on a cluster of the same name made from another machine or after it was dropped.
TAG_CLUSTER_ID = "cloudtrain:cluster-id"


def new_cluster_id() -> str:
    """12 random lowercase hex digits: legal in every cloud's tags, labels and names."""
    import secrets

    return secrets.token_hex(6)


class Capability(enum.Enum):
    """What a provider supports beyond the five verbs."""

    GPU = "gpu"
    SPOT = "spot"
    MULTI_NODE = "multi-node"
    STOP = "stop"
    PLACEMENT_GROUP = "placement-group"
    ELASTIC = "elastic"
    #: has regions and zones to choose from (``--region``, ``--zone``)
    REGIONS = "regions"
    #: boots an image the user may choose (``--image``)
    IMAGE = "image"
    #: boots its nodes from cloud-init user-data (``cloudtrain bootstrap render`` shows it)
    USER_DATA = "user-data"
    #: its nodes stop themselves when idle (``--idle-minutes``), with no one on the user's side
    AUTOSTOP = "autostop"


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
    #: the network interface its peers reach it on (GLOO_SOCKET_IFNAME); None: let gloo pick
    ifname: str | None = None
    #: the bootstrap script and its settings on the node, where not cloud-init's places
    bootstrap: tuple[str, str] | None = None
    #: when the provider ends the node by itself (epoch seconds: a Slurm job's time limit);
    #: None: it does not
    ends_at: float | None = None

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
            "ifname": self.ifname,
            "bootstrap": list(self.bootstrap) if self.bootstrap else None,
            "ends_at": self.ends_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeInfo:
        """The inverse of `to_dict`; also reads records of the versions that kept ``root``,
        ``python``, ``user``, ``region``, ``jump``, ``ifname`` and ``bootstrap`` in
        `extra`."""
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
            ifname=typed["ifname"] or None,
            bootstrap=(str(boot[0]), str(boot[1])) if (boot := typed["bootstrap"]) else None,
            ends_at=float(data["ends_at"]) if data.get("ends_at") is not None else None,
        )


_TYPED = ("root", "python", "user", "region", "jump", "ifname", "bootstrap")


@dataclass(frozen=True)
class Event:
    """Progress reported by a provider while it works (an attempt, a node coming up)."""

    kind: str  # e.g. "attempt", "capacity", "node", "resource", "wait"
    message: str
    node: int | None = None


OnEvent = Callable[[Event], None]


def ignore_event(event: Event) -> None:
    """An `OnEvent` that drops everything."""
