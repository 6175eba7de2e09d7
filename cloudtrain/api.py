"""The library's verbs, used by the CLI and by anyone scripting cloudtrain: plan, up, down.

Each takes an open `State` and cloudtrain's home folder; progress goes to an `on_event`
callback, never to the terminal. A cluster's lifecycle is `cloudtrain.lifecycle`'s and its jobs
are `cloudtrain.jobs`'; the verbs here are those of the lifecycle with the jobs' part filled in
(`down` stops a cluster's jobs before its nodes go), so that neither layer calls back up.
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
    up,
)
from cloudtrain.lifecycle import down as _down
from cloudtrain.model import OnEvent, ignore_event
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
