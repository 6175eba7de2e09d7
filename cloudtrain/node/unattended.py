"""A node whose agent is not running: what the next command at home has done there.

On ssh and local nodes the agent runs detached under a supervisor (`agent.ensure`), which
starts it again when it dies; on a cloud node systemd does. When the agent and its supervisor
are both gone, nothing on the node enforces its autostop policy: the ``autostop`` command that
each `cloudtrain status` runs on the node (`tend`) then does what the agent would have::

    policy due, by the last beat's idle clock (and the node's jobs since) or its deadline
        → the node stops now, the agent's way (`agent._stop_node`): ``stopped``, why
    not due, and the agent runs detached
        → the agent starts again (`agent.heal`), which enforces it from then on: ``restarted``
    else (a cloud node: its unit starts the agent; a node with no policy)
        → the view as it is

Stdlib only. A cloud node's deadline is also the cloud's to enforce with no command at all:
GCE's ``maxRunDuration``, a scheduled ``shutdown`` in an EC2 node's user-data.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cloudtrain.node import agent, procs


def tend(root: Path) -> dict[str, Any]:
    """The node's agent as `agent.view` sees it; with no resident agent, the node stopped
    (``stopped``: why; ``stop_failed`` when a cloud's stop failed) or its agent started
    again (``restarted``: why). Not idempotent by design: it acts once per call."""
    seen = agent.view(root)
    if seen["resident"]:
        return seen
    policy = agent.read_policy(root) or {}
    due = agent.stops_in(policy, _idle_since(root, policy, seen), time.time())
    if due is None or due[0] > 0:
        return {**seen, **_healed(root)}
    with procs.held_if_free(agent.agent_dir(root) / "lock") as free:  # no agent starts meanwhile
        if not free:  # an agent lives, late with its beat: it acts itself
            return seen
        why = f"{due[1]} while its agent was not running"
        done = agent._stop_node(root, why, seen.get("halt"), seen.get("endpoint"), seen.get("arm"))
    return {**seen, "stopped": why, "stop_failed": not done}


def _healed(root: Path) -> dict[str, Any]:
    """What `agent.heal` says of restarting a detached agent (nothing when it did not)."""
    healed = agent.heal(root)
    return {k: healed[k] for k in ("restarted", "launched") if k in healed}


def _idle_since(root: Path, policy: dict[str, Any], seen: dict[str, Any]) -> float | None:
    """Since when the node has been idle by its last beat, on this node's clock: None while a
    job (or, when they count, a user's SSH session) runs or when the last beat had one; a job
    that ended after the beat starts the clock again when it ended."""
    if agent.running_jobs(root):
        return None
    if policy.get("sessions") and procs.ssh_sessions(procs.own_sshd()):
        return None
    since = seen.get("idle_since")
    return None if since is None else max(float(since), _last_job_end(root))


def _last_job_end(root: Path) -> float:
    """When the node's last job ended (its exit code written), 0 when none did."""
    ends = [0.0]
    for code in (root / "jobs").glob("*/exit_code"):
        try:
            ends.append(code.stat().st_mtime)
        except OSError:
            continue
    return max(ends)
