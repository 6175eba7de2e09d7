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

**Owner and incarnation.** Every resource carries the owner tag and, since the random cluster
ids, the id of its incarnation (`ClusterSpec.cluster_id`, `model.TAG_CLUSTER_ID`). `apply`
refuses a name that another owner holds, or that this owner holds under another id (a cluster
made from another machine, or whose record was dropped: its keys are not here), before any
write. `describe`, `terminate` and `leftovers` take the id of a recorded cluster and touch
only that incarnation; without one (``down NAME --provider P`` with no record, ``down --all``)
they act on every incarnation of the name this owner has. Providers whose resources are the
user's own machine (local, ssh) have one incarnation per name and ignore the id.

A provider also declares what it takes beyond the spec (`options`: an account, a network, a
host list ...) and what it can give (`capabilities`); the CLI builds its flags from the first
and the core consults the second, so no provider's name is written outside its own package.

SDK errors are mapped to `cloudtrain.errors` at this boundary (`CapacityError`, `QuotaError`,
`AuthError`). Providers are registered by name in the ``cloudtrain.providers`` entry-point group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from cloudtrain.errors import ConfigError
from cloudtrain.model import Capability, Event, NodeInfo, OnEvent, Plan, ignore_event

#: How an option's value is read: free text, a file (made absolute), a switch, a duration.
OptionKind = Literal["text", "path", "flag", "hours", "usd"]

if TYPE_CHECKING:
    from cloudtrain.boot.bootstrap import NodeKeys, NodeShape
    from cloudtrain.executors.base import Executor
    from cloudtrain.spec import ClusterSpec


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Option:
    """A setting a provider takes beyond the spec: a flag of `up` (``--known-hosts`` for
    `key` ``known_hosts``), recorded with the cluster and handed back in `ProviderContext`."""

    key: str
    help: str
    kind: OptionKind = "text"
    #: names the account the cluster lives in: `down`, `status --refresh` take it too
    account: bool = False
    #: the flag when it is not ``--`` + `key` with '-' for '_'
    flag: str | None = None
    #: how many nodes a value names (a host list), for a spec that does not say
    nodes: Callable[[str], int] | None = None

    @property
    def cli(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")


@dataclass(frozen=True)
class ProviderContext:
    """What a provider is built with: cloudtrain's home folder and the provider-only options."""

    home: Path
    options: Mapping[str, Any] = field(default_factory=_empty)


#: What a node costs per hour where no catalog knows (machines of the user's: ssh, local).
NODE_PRICE = Option(
    "node_price",
    "machines no price list knows: what one node costs per hour in USD (for the cost so far "
    "and --max-cost).",
    kind="usd",
)


def node_price(options: Mapping[str, Any]) -> float:
    """The `NODE_PRICE` option's value (0 when not given); `ConfigError` for a bad one."""
    value = options.get("node_price")
    if value is None or value == "":
        return 0.0
    try:
        price = float(str(value))
    except ValueError:
        price = math.nan
    if not 0 <= price < 1e6:  # NaN and infinity fail too
        raise ConfigError(
            f"--node-price {value!r}: give US dollars per node-hour, from 0 to less than 1000000"
        )
    return price


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

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        """The cluster's live nodes from the provider's own tags, by index; [] when none.
        With `cluster_id`, only those of that incarnation (see the module docstring)."""
        ...

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        """Remove every node and per-cluster resource (of the incarnation `cluster_id`, when
        given); blocks until gone. Idempotent."""
        ...

    def clusters(self) -> list[str]:
        """Names of the clusters this owner has on the provider, from its tags (for
        ``down --all`` and reconciliation); sorted. A cluster whose nodes are gone but whose
        other resources remain is one of them."""
        ...

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        """What of this owner's `cluster` (of `cluster_id`, when given) besides its nodes
        exists (a security group, firewall rules, a resource group ...), in words; [] when
        nothing. `terminate` removes them; `down` uses this to act on a cluster whose nodes
        are all gone."""
        ...

    def executor(self, node: NodeInfo) -> Executor:
        """An executor that runs commands on `node`."""
        ...


class BootsFromUserData(Protocol):
    """A provider with `Capability.USER_DATA`: what its nodes boot with."""

    @staticmethod
    def user_data(shape: NodeShape, keys: NodeKeys) -> dict[str, bytes]:
        """The bootstrap by the field of the create request that carries it (raw bytes,
        before any encoding the request wraps them in)."""
        ...


@runtime_checkable
class RemovesNodes(Protocol):
    """A provider that can remove some nodes of a cluster and keep the rest (what a cancelled
    recovery does with the nodes it made)."""

    def remove_nodes(self, cluster: str, cluster_id: str | None, indices: Collection[int]) -> None:
        """Remove the nodes `indices` of the cluster (everything that runs on them too);
        blocks until gone. Idempotent: an index with no node is nothing to do."""
        ...


# -- helpers for implementations ----------------------------------------------------------------


def option_seconds(
    options: Mapping[str, Any], key: str, default: float, *, most: float = 65535
) -> float:
    """The option `key`'s seconds (`default` when not given): more than 0, at most `most`;
    `ConfigError` naming the flag otherwise."""
    value = options.get(key)
    if value is None or value == "":
        return default
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= most:  # NaN fails too
        flag = "--" + key.replace("_", "-")
        raise ConfigError(f"{flag} {value!r}: give seconds, more than 0 and at most {most:g}")
    return seconds


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
