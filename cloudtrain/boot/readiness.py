"""Reading the bootstrap's progress on nodes: the one code path that says a node is ready.

Every node's bootstrap writes ``<node root>/bootstrap/status.json`` (see `templates/bootstrap.sh`):
``{"phase", "state": "running|waiting|ready|failed", "phases": [{"name", "state", "started",
"finished", "exit_code", "log"}]}``. `wait_ready` reads it through each node's executor until all
are ready, reporting each phase as it changes, and raises `BootstrapError` naming the node, the
phase and the last lines of that phase's log when one fails.

At its ``cloudtrain`` phase a node's bootstrap waits for cloudtrain's wheel: its status is then
``"state": "waiting", "waiting_for": "wheel", "wheel": "<where to put it>"``, and the
`Handoff` copies the wheel there (atomically: the executors' copies are renamed into place),
which the bootstrap, still running, installs before it goes on.

Once a phase is over (done or skipped) on every node, one ``phase`` event says so, with the
slowest node's time: what the cluster's event log keeps of a bootstrap.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import BootstrapError, ConfigError, NodeLostError
from cloudtrain.executors.base import Executor, fan_out
from cloudtrain.model import Event, NodeInfo, OnEvent, ignore_event

#: What to do for a node whose bootstrap waits for the coordinator's cloudtrain wheel: the
#: node, its executor, and where on the node the wheel goes (from its status).
Handoff = Callable[[NodeInfo, Executor, str], None]


def status_path(node: NodeInfo) -> str:
    return f"{node.root}/bootstrap/status.json"


def read_status(executor: Executor, node: NodeInfo) -> dict[str, Any] | None:
    """The node's bootstrap status, or None before the script wrote any."""
    done = executor.run(["cat", status_path(node)], timeout=60)
    if done.returncode != 0 or not done.stdout.strip():
        return None
    try:
        return dict(json.loads(done.stdout))
    except ValueError:
        return None  # caught between a write and its rename: read again


def _failure(executor: Executor, node: NodeInfo, status: dict[str, Any]) -> BootstrapError:
    phases: list[dict[str, Any]] = list(status.get("phases", []))
    phase: dict[str, Any] = next((p for p in phases if p.get("state") == "failed"), {})
    name = str(phase.get("name") or status.get("phase") or "?")
    tail = ""
    if phase.get("log"):
        tail = executor.run(["tail", "-n", "20", str(phase["log"])], timeout=60).stdout
    code = phase.get("exit_code")
    return BootstrapError(
        str(node.index),
        name,
        f"exit code {code}; last lines of {phase.get('log', 'its log')}:\n{tail.rstrip()}",
    )


def hand_over_wheel(wheel: Callable[[], Path]) -> Handoff:
    """A `Handoff` that copies the wheel `wheel()` gives (this cloudtrain: made only when a
    node needs it) to where a waiting node's status says; the bootstrap waiting there takes it
    and goes on."""

    def handoff(node: NodeInfo, executor: Executor, target: str) -> None:
        built = wheel()
        executor.put(built, target or f"{node.root}/dist/{built.name}")

    return handoff


#: A phase's states that mean it is over and went well.
PASSED = ("done", "skipped")


def _passed(status: Mapping[str, Any]) -> dict[str, tuple[str, float | None]]:
    """The phases `status` says are over and went well: each one's state and its seconds."""
    found: dict[str, tuple[str, float | None]] = {}
    for phase in status.get("phases") or []:
        if isinstance(phase, dict) and phase.get("state") in PASSED:
            try:
                took: float | None = (
                    datetime.datetime.fromisoformat(str(phase["finished"]))
                    - datetime.datetime.fromisoformat(str(phase["started"]))
                ).total_seconds()
            except (KeyError, TypeError, ValueError):
                took = None
            found[str(phase.get("name"))] = (str(phase["state"]), took)
    return found


def phase_line(name: str, results: Mapping[int, tuple[str, float | None]]) -> str:
    """``bootstrap phase torch done on 2 node(s), the slowest in 41 s (node 1)`` from each
    node's (state, seconds) of phase `name`."""
    done = {i: took for i, (state, took) in results.items() if state == "done"}
    if not done:
        return f"bootstrap phase {name} skipped on {len(results)} node(s) (nothing to do)"
    skipped = f" (skipped on {len(results) - len(done)})" if len(done) < len(results) else ""
    timed = {i: took for i, took in done.items() if took is not None}
    slowest = max(timed, key=lambda i: (timed[i], -i), default=None)
    head = f"bootstrap phase {name} done on {len(results)} node(s){skipped}"
    if slowest is None:
        return head
    return f"{head}, the slowest in {timed[slowest]:.0f} s (node {slowest})"


def _all_passed(
    passed: Mapping[int, Mapping[str, tuple[str, float | None]]], count: int, told: set[str]
) -> list[str]:
    """The lines of the phases over on all `count` nodes and not `told` yet (added to it)."""
    if len(passed) < count:
        return []
    lines = []
    for name in dict.fromkeys(n for phases in passed.values() for n in phases):
        if name not in told and all(name in phases for phases in passed.values()):
            told.add(name)
            lines.append(phase_line(name, {i: phases[name] for i, phases in passed.items()}))
    return lines


def _waits_for_wheel(status: dict[str, Any]) -> bool:
    return status.get("state") == "waiting" and status.get("waiting_for") == "wheel"


def wait_ready(
    nodes: Sequence[NodeInfo],
    executors: Sequence[Executor],
    *,
    on_event: OnEvent = ignore_event,
    timeout_s: float = 1800,
    poll_s: float = 0.5,
    handoff: Handoff | None = None,
    lost: Callable[[], Collection[int]] | None = None,
    lost_every_s: float = 5.0,
) -> None:
    """Block until every node's bootstrap is ready. A node waiting for the cloudtrain wheel
    gets it through `handoff` (once). Raises `BootstrapError` for the first node whose
    bootstrap failed, that waits for the wheel with no `handoff` or again after it, or when
    `timeout_s` passes (naming the slowest phase). `lost`, asked every `lost_every_s`: the
    indices of the nodes the provider no longer runs; one of `nodes` among them is
    `NodeLostError` at once (what `lost` raises ends the wait too)."""
    seen: dict[int, str] = {}
    handed: dict[int, dict[str, Any]] = {}  # node → its status when the wheel was handed over
    passed: dict[int, dict[str, tuple[str, float | None]]] = {}  # node → its phases over
    told: set[str] = set()  # the phases said to be over on every node
    deadline = time.monotonic() + timeout_s
    next_lost = time.monotonic() + lost_every_s
    pairs = list(zip(nodes, executors, strict=True))
    while True:
        if lost is not None and time.monotonic() >= next_lost:
            gone = sorted(set(lost()) & {n.index for n in nodes})
            if gone:
                raise NodeLostError(str(gone[0]), seen.get(gone[0], "not started").split(":")[0])
            next_lost = time.monotonic() + lost_every_s
        statuses = fan_out(lambda pair: read_status(pair[1], pair[0]), pairs)
        for (node, executor), status in zip(pairs, statuses, strict=True):
            if status is None or status == handed.get(node.index):
                continue  # not started, or it has not seen the wheel yet
            where = f"{status.get('phase')}: {status.get('state')}"
            if seen.get(node.index) != where:
                seen[node.index] = where
                on_event(Event("bootstrap", where, node=node.index))
            if _waits_for_wheel(status):
                target = str(status.get("wheel") or "")
                if handoff is None or node.index in handed:
                    why = "nothing hands it over" if handoff is None else "after it was copied"
                    waits = f"waits for the cloudtrain wheel at {target} {why}"
                    raise BootstrapError(str(node.index), str(status.get("phase")), waits)
                on_event(Event("bootstrap", "copying the cloudtrain wheel", node=node.index))
                handoff(node, executor, target)
                handed[node.index] = status
                continue
            if status.get("state") == "failed":
                # a node killed as it goes away (its bootstrap TERMed) is lost, not failed
                if lost is not None and node.index in set(lost()):
                    raise NodeLostError(str(node.index), str(status.get("phase") or "?"))
                raise _failure(executor, node, status)
            passed[node.index] = _passed(status)
        for line in _all_passed(passed, len(pairs), told):
            on_event(Event("phase", line))
        if all(s is not None and s.get("state") == "ready" for s in statuses):
            return
        if time.monotonic() > deadline:
            slow = next(
                n
                for n, s in zip(nodes, statuses, strict=True)
                if s is None or s.get("state") != "ready"
            )
            raise BootstrapError(
                str(slow.index),
                seen.get(slow.index, "not started").split(":")[0],
                f"not ready after {timeout_s:.0f} s",
            )
        time.sleep(poll_s)


def watch(
    nodes: Sequence[NodeInfo],
    open_executor: Callable[[NodeInfo], Executor],
    wheel: Callable[[], Path],
    lost: Callable[[], Collection[int]],
    *,
    on_event: OnEvent,
    timeout_s: float,
    lost_every_s: float,
) -> bool:
    """`wait_ready` over each node's executor, opened here and closed after, the wheel handed
    over as `hand_over_wheel` does: how `up` and a recovery's replacements wait. A provider
    that cannot run commands on its nodes yet (`ConfigError` from `open_executor`) is not
    waited for: an event says so, and False."""
    try:
        executors = [open_executor(n) for n in nodes]
    except ConfigError as exc:
        on_event(Event("bootstrap", f"not watched: {exc}"))
        return False
    try:
        wait_ready(
            nodes,
            executors,
            on_event=on_event,
            timeout_s=timeout_s,
            handoff=hand_over_wheel(wheel),
            lost=lost,
            lost_every_s=lost_every_s,
        )
    finally:
        for ex in executors:
            ex.close()
    return True
