"""An in-memory provider for tests: a fake cloud with tags, zones and injectable failures.

It behaves like a real cloud where the contract says it must — gang creation, capacity errors
that move to the next zone, quota errors that stop, resume by counting tagged instances — and
records every request in `FakeCloud.requests`, so tests assert on what a cloud would have been
asked. Commands on its nodes go to `FakeExecutor`s driven by the handler in the options.

Options (`ProviderContext.options`): ``cloud`` (a `FakeCloud`; default: one per home folder)
and ``handler`` (a `cloudtrain.executors.fake.Handler`; default: the home folder's entry in
`_HANDLERS`, else `ready_node`, whose bootstrap reports ready).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cloudtrain.boot import bootstrap
from cloudtrain.errors import CapacityError, ConfigError, QuotaError
from cloudtrain.executors.base import RunResult
from cloudtrain.executors.fake import Call, FakeExecutor, Handler, succeed
from cloudtrain.model import (
    TAG_CLUSTER,
    TAG_CLUSTER_ID,
    TAG_NODE,
    TAG_OWNER,
    Capability,
    NodeInfo,
    Offer,
    OnEvent,
    Plan,
)
from cloudtrain.provision.engine import Engine
from cloudtrain.provision.provider import ProviderContext, default_owner
from cloudtrain.spec import ClusterSpec

REGION = "fake-1"
ZONES = ("fake-1a", "fake-1b", "fake-1c")


@dataclass
class FakeInstance:
    instance_id: str
    zone: str
    instance_type: str
    tags: dict[str, str]
    private_ip: str
    state: str = "running"


@dataclass
class FakeCloud:
    """The fake cloud's whole state; tests read and poke it directly."""

    instances: dict[str, FakeInstance] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: zones that answer every create with a capacity error
    exhausted_zones: set[str] = field(default_factory=set)
    #: when set, every create fails with this quota error code
    quota_error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def live(self, cluster: str | None = None) -> list[FakeInstance]:
        return [
            i
            for i in self.instances.values()
            if i.state != "terminated" and (cluster is None or i.tags[TAG_CLUSTER] == cluster)
        ]

    def create(
        self,
        cluster: str,
        indices: list[int],
        zone: str,
        itype: str,
        owner: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        """All of `indices` or none (gang semantics), like one RunInstances call."""
        with self.lock:
            self.requests.append(
                {"action": "create", "cluster": cluster, "indices": indices, "zone": zone}
            )
            if self.quota_error:
                raise QuotaError("fake", self.quota_error, "instance quota exceeded")
            if zone in self.exhausted_zones:
                raise CapacityError("fake", "InsufficientCapacity", f"no capacity in {zone}")
            for index in indices:
                n = next(self._ids)
                iid = f"fi-{n:06d}"
                self.instances[iid] = FakeInstance(
                    iid,
                    zone,
                    itype,
                    {
                        TAG_CLUSTER: cluster,
                        TAG_NODE: str(index),
                        TAG_OWNER: owner or default_owner(),
                        **({TAG_CLUSTER_ID: cluster_id} if cluster_id else {}),
                    },
                    f"10.0.0.{n % 250 + 2}",
                )

    def terminate(
        self,
        cluster: str,
        owner: str | None = None,
        cluster_id: str | None = None,
        indices: Collection[int] | None = None,
    ) -> None:
        """Terminate the cluster's instances of `owner` (only the nodes `indices`, if given)."""
        with self.lock:
            self.requests.append({"action": "terminate", "cluster": cluster})
            for inst in self.live(cluster):
                wanted = indices is None or int(inst.tags[TAG_NODE]) in indices
                if wanted and mine(inst, owner or default_owner(), cluster_id):
                    inst.state = "terminated"


def mine(inst: FakeInstance, owner: str, cluster_id: str | None) -> bool:
    """Made by `owner`, and of the incarnation `cluster_id` when one is given."""
    return inst.tags[TAG_OWNER] == owner and (
        cluster_id is None or inst.tags.get(TAG_CLUSTER_ID) == cluster_id
    )


_CLOUDS: dict[Path, FakeCloud] = {}
#: Per home folder, the handler its nodes answer with (tests set it; default: `ready_node`).
_HANDLERS: dict[Path, Handler] = {}

READY = json.dumps({"phase": "verify", "state": "ready", "phases": []})


def ready_node(call: Call) -> RunResult:
    """A node whose bootstrap is done; every other command succeeds silently."""
    if call.argv[:1] == ("cat",) and call.argv[-1].endswith("/bootstrap/status.json"):
        return RunResult(call.argv, 0, READY, "")
    return succeed(call)


class FakeProvider(Engine):
    """A provider over a `FakeCloud`, on the same provisioning engine as the clouds: the
    contract suite tests the real `apply` loop through it."""

    name: ClassVar[str] = "fake"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.GPU, Capability.SPOT, Capability.MULTI_NODE, Capability.REGIONS,
         Capability.IMAGE}
    )  # fmt: skip

    def __init__(self, context: ProviderContext) -> None:
        cloud = context.options.get("cloud")
        self.cloud: FakeCloud = (
            cloud if cloud is not None else _CLOUDS.setdefault(context.home, FakeCloud())
        )
        self.handler: Handler = (
            context.options.get("handler") or _HANDLERS.get(context.home) or ready_node
        )
        self.executors: dict[str, FakeExecutor] = {}
        self.home = context.home
        self.owner = str(context.options.get("owner") or default_owner())

    def plan(self, spec: ClusterSpec) -> Plan:
        res = spec.resources
        if res.zone is not None and res.zone not in ZONES:
            raise ConfigError(
                f"resources.zone {res.zone!r} is not a fake zone; allowed: {', '.join(ZONES)}"
            )
        zones = (res.zone,) if res.zone else ZONES
        itype = f"fake-{res.accelerator.lower()}x{res.count}" if res.accelerator else "fake-cpu"
        price = 1.0 * max(res.count, 1) * (0.3 if res.spot else 1.0)
        offer = Offer("fake", REGION, zones, itype, price, res.spot, res.accelerator, res.count)
        request = {"action": "create", "cluster": spec.name, "count": spec.num_nodes}
        return Plan(spec=spec, offers=(offer,), requests=(request,))

    # -- the engine's hooks: the fake cloud has no per-region resources ---------------------

    def holders(self, cluster: str) -> set[tuple[str, str]]:
        return {
            (i.tags[TAG_OWNER], i.tags.get(TAG_CLUSTER_ID, "")) for i in self.cloud.live(cluster)
        }

    def prepare(
        self, spec: ClusterSpec, offer: Offer, keys: bootstrap.NodeKeys, on_event: OnEvent
    ) -> None:
        return None

    def create(
        self,
        spec: ClusterSpec,
        offer: Offer,
        zone: str | None,
        indices: Sequence[int],
        keys: bootstrap.NodeKeys,
        prepared: Any,
    ) -> None:
        self.cloud.create(
            spec.name, list(indices), str(zone), offer.instance_type, self.owner, spec.cluster_id
        )

    def clean(self, spec: ClusterSpec, offer: Offer) -> None:
        return None

    def wait(self, spec: ClusterSpec, region: str, on_event: OnEvent) -> list[NodeInfo]:
        return self.describe(spec.name, spec.cluster_id)

    def region_of(self, node: NodeInfo) -> str:
        return REGION

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        nodes = [
            NodeInfo(
                cluster=cluster,
                index=int(inst.tags[TAG_NODE]),
                node_id=inst.instance_id,
                private_ip=inst.private_ip,
                public_ip=None,
                state=inst.state,
                zone=inst.zone,
                instance_type=inst.instance_type,
                root=f"/fake/{inst.instance_id}",
            )
            for inst in self.cloud.live(cluster)
            if mine(inst, self.owner, cluster_id)
        ]
        return sorted(nodes, key=lambda n: n.index)

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        self.cloud.terminate(cluster, self.owner, cluster_id)

    def remove_nodes(self, cluster: str, cluster_id: str | None, indices: Collection[int]) -> None:
        self.cloud.terminate(cluster, self.owner, cluster_id, indices)

    def clusters(self) -> list[str]:
        return sorted(
            {i.tags[TAG_CLUSTER] for i in self.cloud.live() if i.tags[TAG_OWNER] == self.owner}
        )

    def executor(self, node: NodeInfo) -> FakeExecutor:
        return self.executors.setdefault(node.node_id, FakeExecutor(self.handler))
