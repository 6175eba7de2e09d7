"""What a managed job's recovery records of the bill (`cloudtrain.spans`): a node found gone
stops billing when it is found gone, not when its replacement is recorded minutes later."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloudtrain import api
from cloudtrain.boot import bootstrap
from cloudtrain.jobs import managed
from cloudtrain.jobs.coordinator import Coordinator
from cloudtrain.model import Offer
from cloudtrain.providers.fake.provider import FakeCloud, FakeProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SlowProvider(FakeProvider):
    """A fake cloud whose create takes until `done_at` on the state's clock (a replacement
    that takes many minutes to come)."""

    def __init__(self, context: ProviderContext, clock: Clock) -> None:
        super().__init__(context)
        self.clock = clock
        self.done_at: float | None = None
        self.spans_while_making: list[tuple[int, str, float | None, str | None]] = []
        self.state: State | None = None

    def create(
        self,
        spec: ClusterSpec,
        offer: Offer,
        zone: str | None,
        indices: Sequence[int],
        keys: bootstrap.NodeKeys,
        prepared: Any,
    ) -> None:
        if self.state is not None:  # what `cloudtrain cost` sees while the replacement comes
            self.spans_while_making = [
                (s.index, s.node_id, s.ended_at, s.end_reason) for s in self.state.spans()
            ]
        if self.done_at is not None:
            self.clock.now = self.done_at
        super().create(spec, offer, zone, indices, keys, prepared)


def test_a_lost_nodes_span_ends_when_it_was_found_gone_not_at_its_replacement(
    tmp_path: Path,
) -> None:
    clock = Clock(1000.0)
    cloud = FakeCloud()
    provider = SlowProvider(ProviderContext(home=tmp_path, options={"cloud": cloud}), clock)
    with State.open(tmp_path, clock=clock) as state:
        spec = ClusterSpec("c1", "fake", 2, Resources(accelerator="A100", count=8))
        api.up(state, tmp_path, spec, bootstrap_timeout_s=None, prov=provider)
        lost = state.nodes("c1")[1]
        job = state.new_job("c1", "t", num_nodes=2, nproc_per_node=8, command=["t.py"])
        next(i for i in cloud.live("c1") if i.instance_id == lost.node_id).state = "terminated"

        clock.now = 2000.0  # the watcher finds it gone
        provider.state, provider.done_at = state, 2600.0  # its replacement comes 10 min later
        watcher = managed.Watcher(
            state,
            tmp_path,
            lambda cluster: Coordinator(state, provider, home=tmp_path),
            provider=lambda s: provider,
            bootstrap_timeout_s=None,
        )
        assert watcher.complete_cluster(job) == [1]

        assert (1, lost.node_id, 2000.0, "gone") in provider.spans_while_making, (
            "while the replacement is made, the lost node no longer bills"
        )
        by_node = {s.node_id: s for s in state.spans("c1")}
        assert (by_node[lost.node_id].ended_at, by_node[lost.node_id].end_reason) == (
            2000.0,
            "gone",
        )
        kept = state.nodes("c1")[0]
        assert by_node[kept.node_id].ended_at is None, "the node that stayed bills on"
        (new,) = [s for s in state.spans("c1") if s.index == 1 and s.ended_at is None]
        assert new.node_id != lost.node_id
        assert [n.index for n in state.nodes("c1")] == [0, 1]
