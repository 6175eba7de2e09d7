"""The library's verbs, used by the CLI and by anyone scripting cloudtrain: plan, up, down.

Each takes an open `State` and cloudtrain's home folder; progress goes to an `on_event`
callback, never to the terminal. A cluster's lifecycle is `cloudtrain.lifecycle`'s and its jobs
are `cloudtrain.jobs`'; the verbs here are those of the lifecycle with the jobs' part filled in
(`up` readies the new nodes for the jobs to come, `down` stops a cluster's jobs before its
nodes go), so that neither layer calls back up.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cloudtrain.lifecycle import (
    abandoned,
    agent_beats,
    autostop,
    forget,
    hand_limits,
    plan,
    provider,
    provider_for,
)
from cloudtrain.lifecycle import down as _down
from cloudtrain.lifecycle import up as _up
from cloudtrain.model import NodeInfo, OnEvent, ignore_event
from cloudtrain.spec import ClusterSpec
from cloudtrain.state import State

__all__ = [
    "abandoned",
    "agent_beats",
    "autostop",
    "down",
    "forget",
    "hand_limits",
    "plan",
    "provider",
    "provider_for",
    "up",
]


def up(
    state: State, home: Path, spec: ClusterSpec, on_event: OnEvent = ignore_event, **options: Any
) -> list[NodeInfo]:
    """`cloudtrain.lifecycle.up` (`options`: its keywords), then, once the nodes are
    bootstrapped, each readied for the jobs to come (`Coordinator.prewarm_cluster`: a warm
    server that imports torch while the caller goes on, so that the first job starts as fast
    as the next). ``CLOUDTRAIN_WARM=0`` in the caller's environment readies none."""
    nodes = _up(state, home, spec, on_event, **options)
    bootstrapped = options.get("bootstrap_timeout_s", 1800) is not None
    if bootstrapped and nodes:
        from cloudtrain.jobs.coordinator import Coordinator  # the jobs' modules only now

        coord = Coordinator(state, options.get("prov") or provider_for(spec, home), home=home)
        try:
            coord.prewarm_cluster(spec.name, nodes)
        finally:
            coord.close()
    return nodes


def down(
    state: State,
    home: Path,
    name: str,
    *,
    provider_name: str | None = None,
    options: Mapping[str, Any] | None = None,
    on_event: OnEvent = ignore_event,
) -> bool:
    """Tear the cluster down: stop its jobs, keep their logs, delete every node and resource
    the provider finds by tag, forget the cluster. Blocks until gone. Idempotent: returns
    False when there was nothing to do. Without a state record, `provider_name` (default
    local) is asked for nodes tagged with `name`."""
    from cloudtrain.jobs.teardown import stop_jobs  # the jobs' modules only when one goes down

    return _down(state, home, name, stop_jobs=stop_jobs, provider_name=provider_name,
                 options=options, on_event=on_event)  # fmt: skip
