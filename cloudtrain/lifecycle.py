"""A cluster's lifecycle, owned here: plan, up (and its completion by a recovery), the limits
handed to its nodes, autostop, down and forget, under the cluster's lock.

Each takes an open `State` and cloudtrain's home folder; progress goes to an `on_event`
callback, never to the terminal. Jobs are the layer above (`cloudtrain.jobs`), which calls this
one; `down` learns how to stop a cluster's jobs from its caller (`StopJobs`), so this layer
imports nothing of it. `cloudtrain.api` gives the verbs with the jobs' part filled in.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import (
    AccountError,
    BootstrapError,
    CapacityError,
    CloudtrainError,
    ConfigError,
    NotFoundError,
    ProviderError,
)
from cloudtrain.model import (
    Capability,
    Event,
    NodeInfo,
    OnEvent,
    Plan,
    ignore_event,
    new_cluster_id,
)
from cloudtrain.provision import registry
from cloudtrain.provision.engine import Engine
from cloudtrain.provision.provider import Provider, ProviderContext
from cloudtrain.records import IN_PROGRESS, ClusterStatus
from cloudtrain.spec import ClusterSpec
from cloudtrain.spec.limits import refuse_spent_budget
from cloudtrain.state import State

log = logging.getLogger(__name__)

#: A node's state when its host does not answer (the ssh provider's hosts).
UNREACHABLE = "unreachable"

#: How `down` stops a cluster's unfinished jobs and keeps their logs before its nodes go
#: (`cloudtrain.jobs.teardown.stop_jobs`): the state, the home, the cluster's provider, its
#: name, and where its events go.
StopJobs = Callable[[State, Path, Provider, str, OnEvent], None]


def provider(name: str, home: Path, options: Mapping[str, Any] | None = None) -> Provider:
    """The provider called `name`, built for this home folder."""
    return registry.create(name, ProviderContext(home=home, options=dict(options or {})))


def provider_for(spec: ClusterSpec, home: Path) -> Provider:
    """The provider a cluster lives on, with its provider-only options (e.g. an AWS profile)."""
    return provider(spec.provider, home, spec.extra)


def plan(
    spec: ClusterSpec, home: Path, *, dry_run: bool = False, prov: Provider | None = None
) -> Plan:
    """What `up` would create, at what price. Pure: nothing written; read-only cloud calls.

    A `dry_run` that cannot ask the cloud (no credentials, no network, no project) plans from
    the catalog alone: named placeholders for what only the cloud resolves, listed in
    `Plan.unresolved`. Clouds this version cannot create yet are planned from the catalog."""
    if spec.provider not in registry.available():
        from cloudtrain.plan import planner

        return Plan(spec=spec, offers=planner.offers(spec))
    refuse_unsupported(spec, registry.provider_class(spec.provider).capabilities)
    prov = prov or provider_for(spec, home)
    if not dry_run or not isinstance(prov, Engine):
        return prov.plan(spec)
    try:
        return prov.plan(spec)
    except (ProviderError, AccountError) as exc:
        log.info("planning %s offline: %s", spec.name, exc)
        return prov.plan_offline(spec, str(exc))


#: What a spec may ask that only some providers give: the flag, the value asked, the capability.
_NEEDS: tuple[tuple[str, Callable[[ClusterSpec], object], Capability], ...] = (
    ("--gpus", lambda s: s.resources.gpus, Capability.GPU),
    ("--spot", lambda s: s.resources.spot or None, Capability.SPOT),
    ("--region", lambda s: s.resources.region, Capability.REGIONS),
    ("--zone", lambda s: s.resources.zone, Capability.REGIONS),
    ("--image", lambda s: s.resources.image, Capability.IMAGE),
    ("--nodes", lambda s: s.num_nodes if s.num_nodes > 1 else None, Capability.MULTI_NODE),
    ("--idle-minutes", lambda s: s.limits.idle_minutes, Capability.AUTOSTOP),
    ("--max-hours", lambda s: s.limits.max_hours, Capability.AUTOSTOP),
    ("--max-cost", lambda s: s.limits.max_cost, Capability.AUTOSTOP),
)


def refuse_unsupported(spec: ClusterSpec, capabilities: frozenset[Capability]) -> None:
    """`ConfigError` for what `spec` asks that its provider's `capabilities` do not give,
    naming the providers that do: before the provider is built, so it costs nothing."""
    for flag, asked, needs in _NEEDS:
        value = asked(spec)
        if value is not None and needs not in capabilities:
            raise ConfigError(
                f"provider {spec.provider!r} takes no {flag} (got {value!r}); drop it, or "
                f"choose a provider that does: {', '.join(registry.offering(needs))}"
            )


def check_existing(state: State, spec: ClusterSpec) -> None:
    """Refuse `up` of an existing name with a different spec (it would be a second cluster)."""
    current = state.cluster(spec.name)
    if current is None:
        return
    changes = current.spec.differences(spec)
    if changes:
        raise ConfigError(
            f"cluster {spec.name!r} exists with a different spec ({'; '.join(changes)}); "
            f"`cloudtrain down {spec.name}` first, or choose another --name"
        )


def up(
    state: State,
    home: Path,
    spec: ClusterSpec,
    on_event: OnEvent = ignore_event,
    *,
    bootstrap_timeout_s: float | None = 1800,
    prov: Provider | None = None,
    complete_only: bool = False,
    zones_last: Collection[str] = (),
    regions: Sequence[str] = (),
    before_unlock: Callable[[], None] | None = None,
) -> list[NodeInfo]:
    """Create the cluster, or complete it if it exists with the same spec, and wait for every
    node's bootstrap (unless `bootstrap_timeout_s` is None: stop after provisioning). Blocks.
    Idempotent. Raises `ConfigError` before any cloud call for bad input, `BootstrapError`
    when a node's bootstrap fails (the cluster is kept for inspection). `prov`: the provider
    to use (default: the spec's, built for this call). With `complete_only`, a cluster that is
    no longer recorded once the lock is held (a `down` went first) is `NotFoundError`, never
    made anew: a recovery must not bring back a cluster its owner just removed. `zones_last`:
    zones tried only after every other zone of an offer (one that just preempted a node).
    `regions`: only the offers of these regions, in this order (the optimizer's choice);
    `CapacityError` when the provider has none of them. `before_unlock` runs under the
    cluster's lock when `up` is over, however it ended (a `launch` finishes the setup it
    began during the bootstrap there: no other command's setup runs beside it)."""
    from cloudtrain import locks

    wait = _waiting(on_event)
    with locks.cluster_lock(home, spec.name, "up", on_wait=wait):
        try:
            if complete_only and state.cluster(spec.name) is None:
                raise NotFoundError(
                    f"cluster {spec.name!r} is gone (torn down); nothing to complete"
                )
            return _up(state, home, spec, on_event, bootstrap_timeout_s, prov, zones_last, regions)
        finally:
            if before_unlock is not None:
                before_unlock()


def _waiting(on_event: OnEvent) -> Callable[[str], None]:
    return lambda message: on_event(Event("wait", message))


def recording(state: State, cluster: str, on_event: OnEvent) -> OnEvent:
    """`on_event`, with what belongs in the cluster's event log kept there too: a create
    attempt that failed in a zone (``capacity``: the place and the cloud's code) and a
    bootstrap phase done on every node (``phase``)."""

    def record(event: Event) -> None:
        if event.kind == "capacity":
            state.add_event(cluster, "capacity", f"create attempt failed in {event.message}")
        elif event.kind == "phase":
            state.add_event(cluster, "bootstrap", event.message)
        on_event(event)

    return record


def _up(
    state: State,
    home: Path,
    spec: ClusterSpec,
    on_event: OnEvent,
    bootstrap_timeout_s: float | None,
    prov: Provider | None = None,
    zones_last: Collection[str] = (),
    regions: Sequence[str] = (),
) -> list[NodeInfo]:
    check_existing(state, spec)
    current = state.cluster(spec.name)
    # a new record is a new incarnation of the name; a recorded one keeps its id, and its
    # limits unless new ones are asked
    spec = dataclasses.replace(
        spec,
        cluster_id=current.spec.cluster_id if current else new_cluster_id(),
        limits=spec.limits or (current.spec.limits if current else spec.limits),
    )
    prov = prov or provider_for(spec, home)  # built once for the command
    the_plan = plan(spec, home, prov=prov)  # validates against the catalog first
    if regions:
        the_plan = in_regions(the_plan, regions)
    the_plan = with_limits(the_plan, current.created_at if current else time.time())
    if zones_last:
        the_plan = dataclasses.replace(
            the_plan,
            offers=tuple(
                dataclasses.replace(o, zones=tuple(sorted(o.zones, key=lambda z: z in zones_last)))
                for o in the_plan.offers
            ),
        )
    state.put_cluster(
        the_plan.spec,  # as resolved: where SSH is open from is recorded, not "the default"
        status=ClusterStatus.PROVISIONING,
        price_per_hour=the_plan.price_per_hour,
        plan={
            "offers": [o.to_dict() for o in the_plan.offers],
            "requests": [dict(r) for r in the_plan.requests],
        },
    )
    state.add_event(spec.name, "up", f"provisioning {spec.num_nodes} node(s) on {spec.provider}")
    on_event = recording(state, spec.name, on_event)
    earlier = state.open_intents(spec.name)  # an `up` or `down` that died half way
    asked = time.time()  # a node made now bills from here (`State.set_nodes`)
    try:
        with state.intent(spec.name, "apply", {"provider": spec.provider}):
            nodes = prov.apply(the_plan, on_event)
    except BaseException as exc:
        # a refusal (bad input: `ConfigError`) comes before anything is made; when the
        # listing is refused too (the same cause), there is no record to keep for this `up`
        refused = isinstance(exc, ConfigError) and current is None
        try:
            left: list[NodeInfo] | None = prov.describe(spec.name, spec.cluster_id)
        except Exception as listing:  # cannot tell what exists: keep the record for `down`
            if not refused:
                log.warning("could not list what the failed up of %s left", spec.name)
            log.debug("listing what the failed up of %s left: %s", spec.name, listing)
            left = [] if refused else None
        if left and current is None and all(n.state == UNREACHABLE for n in left):
            # hosts this `up` could not reach (a refused host key, a host that is down) hold
            # nothing it wrote: it writes only once every host answered
            left = []
        if left:  # a half-made cluster: keep the record so `up` completes it, `down` removes it
            state.set_nodes(spec.name, left, since=asked)
        if left is None:
            state.set_cluster_status(spec.name, ClusterStatus.PARTIAL)
            kept = "its record kept: what it made could not be listed"
        elif left:
            state.set_cluster_status(spec.name, ClusterStatus.PARTIAL)
            kept = f"{len(left)} node(s) kept"
        else:  # all or nothing: nothing was made, so nothing is recorded
            state.delete_cluster(spec.name)
            kept = "nothing was made"
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed: {exc}"
        state.add_event(spec.name, "up", f"up {why}; {kept}")
        raise
    for intent in earlier:
        state.end_intent(intent.id, "finished by a later up")
    state.set_nodes(spec.name, nodes, since=asked)
    state.set_cluster_status(spec.name, ClusterStatus.BOOTSTRAPPING)
    state.add_event(spec.name, "up", f"{len(nodes)} node(s) running")
    if bootstrap_timeout_s is not None:
        try:
            wait_bootstrap(state, home, prov, spec.name, nodes, on_event, bootstrap_timeout_s)
        except KeyboardInterrupt:  # the nodes run on; say so, rather than "bootstrapping"
            state.set_cluster_status(spec.name, ClusterStatus.UNWATCHED)
            state.add_event(spec.name, "bootstrap", "the wait for the bootstrap was interrupted")
            raise
        state.add_event(spec.name, "up", f"cluster {spec.name!r} is up: {len(nodes)} node(s) ready")
    state.set_cluster_status(spec.name, ClusterStatus.UP)
    if the_plan.spec.limits and bootstrap_timeout_s is not None:
        hand_limits(state, home, the_plan.spec)
    return nodes


def abandoned(state: State, home: Path, names: Sequence[str]) -> list[str]:
    """Of the clusters `names`, those whose status says an `up` is under way (`IN_PROGRESS`)
    while no process holds their lock: the `up` was killed (SIGKILL, a closed laptop), so the
    status would never change. Each gets the status that says so (``bootstrapping`` →
    ``unwatched``: its nodes run, ready or not; ``provisioning`` → ``partial``: its open intent
    says what finishes it) and an event. Never waits for a lock; returns the names changed."""
    from cloudtrain import locks
    from cloudtrain.errors import ClusterBusyError

    changed = []
    for name in names:
        record = state.cluster(name)
        if record is None or record.status not in IN_PROGRESS:
            continue
        try:
            with locks.cluster_lock(home, name, "status", wait_s=0):
                record = state.cluster(name)  # as it is now that no `up` can run
                if record is None or record.status not in IN_PROGRESS:
                    continue
                state.set_cluster_status(name, IN_PROGRESS[record.status])
                why = f"the `up` that was {record.status} it is gone (killed before it ended)"
                state.add_event(name, "up", why)
                changed.append(name)
        except ClusterBusyError:  # an `up` (or another command) holds it: it is under way
            continue
    return changed


def in_regions(the_plan: Plan, regions: Sequence[str]) -> Plan:
    """`the_plan` with only the offers of `regions`, in that order; `CapacityError` when
    none is left (the cloud planned otherwise than the catalog: the next cloud is tried)."""
    offers = tuple(o for region in regions for o in the_plan.offers if o.region == region)
    if not offers:
        raise CapacityError(
            the_plan.spec.provider,
            "NoOffer",
            f"no offer of {the_plan.spec.resources.gpus} in {', '.join(regions)}",
        )
    return dataclasses.replace(the_plan, offers=offers)


def with_limits(the_plan: Plan, created_at: float) -> Plan:
    """`the_plan` with its spec's lifetime and budget resolved into one moment (from
    `created_at`, at the plan's price); `ConfigError` for a budget of a cluster whose price is
    not known, or that buys less than a minute of it, and for a lifetime or budget already
    over (an `up` of a cluster that ended: a node made now would stop at once). Nothing is
    made yet."""
    spec = the_plan.spec
    if spec.limits.max_cost is not None and the_plan.price_per_hour <= 0:
        raise ConfigError(
            f"--max-cost {spec.limits.max_cost:g}: a {spec.provider} cluster has no price to "
            "count it with; give what a node costs per hour (--node-price USD)"
        )
    if spec.limits.max_cost is not None:
        each = the_plan.price_per_hour / spec.num_nodes
        refuse_spent_budget(
            spec.limits.max_cost,
            the_plan.price_per_hour,
            f"{spec.num_nodes} node(s) at ${each:.2f}/h",
        )
    limits = spec.limits.resolved(created_at, the_plan.price_per_hour)
    when = limits.ended_at()
    if when is not None:  # a node made now stops at once
        flag, value = (
            ("--max-hours", limits.max_hours)
            if limits.ends_why == "lifetime"
            else ("--max-cost", limits.max_cost)
        )
        raise ConfigError(
            f"{flag} {value:g}: the {limits.ends_why} of cluster {spec.name!r} ended at {when} "
            f"(it counts from its first `up`); no node is made for it again: `cloudtrain down "
            f"{spec.name}`, or give a longer one"
        )
    return dataclasses.replace(the_plan, spec=dataclasses.replace(spec, limits=limits))


def hand_limits(state: State, home: Path, spec: ClusterSpec) -> list[dict[str, Any]]:
    """Give each node of the cluster its limits (the agents act on them with this machine
    off); an event says what they are. Each node's beat."""
    from cloudtrain.boot.bootstrap import agent_policy

    beats = _ask_agents(
        state,
        home,
        spec.name,
        agent_policy(spec.limits, sessions=spec.provider != registry.default()),
    )  # the user's own machine: theirs are not work
    state.add_event(spec.name, "autostop", "the nodes stop themselves: " + spec.limits.text())
    return beats


def wait_bootstrap(
    state: State,
    home: Path,
    prov: Provider,
    cluster: str,
    nodes: list[NodeInfo],
    on_event: OnEvent,
    timeout_s: float,
    lost_every_s: float = 5.0,
) -> None:
    """Wait for every node's bootstrap to report ready (`cloudtrain.boot.readiness`). Providers that
    cannot run commands on their nodes yet are skipped with a note. A node the provider no
    longer lists (it removed itself at its lifetime, its host is gone) ends the wait within
    `lost_every_s` (`NodeLostError`), not at the timeout."""
    from cloudtrain.boot import readiness, wheel

    record = state.cluster(cluster)
    cluster_id = record.spec.cluster_id if record else None

    def lost() -> set[int]:
        try:
            listed = {n.index for n in prov.describe(cluster, cluster_id)}
        except CloudtrainError:  # cannot tell now: asked again at the next check
            return set()
        return {n.index for n in nodes} - listed

    try:
        readiness.watch(
            nodes,
            prov.executor,
            lambda: wheel.build(home),
            lost,
            on_event=on_event,
            timeout_s=timeout_s,
            lost_every_s=lost_every_s,
        )
    except BootstrapError as exc:
        state.set_cluster_status(cluster, ClusterStatus.FAILED)
        state.add_event(cluster, "bootstrap", str(exc))
        raise


def autostop(
    state: State, home: Path, name: str, idle_minutes: float | None
) -> list[dict[str, Any]]:
    """Give every node of cluster `name` a new idle clock: it stops itself (its agent, with no
    one on this side) after `idle_minutes` without a job; None: never when idle (a lifetime or
    a budget stays). Each node's beat. Under the cluster's lock: two at once end with the
    record and the nodes saying the same."""
    from cloudtrain import locks

    with locks.cluster_lock(home, name, "autostop"):
        return _autostop(state, home, name, idle_minutes)


def _autostop(
    state: State, home: Path, name: str, idle_minutes: float | None
) -> list[dict[str, Any]]:
    record = state.cluster(name)
    if record is None:
        raise NotFoundError(f"no cluster named {name!r}; `cloudtrain status` lists them")
    spec = record.spec
    limits = dataclasses.replace(
        spec.limits,
        idle_minutes=idle_minutes,
        down_when_idle=spec.limits.down_when_idle and bool(idle_minutes),
    )
    spec = dataclasses.replace(spec, limits=limits)
    refuse_unsupported(spec, registry.provider_class(spec.provider).capabilities)
    policy = ["--idle-s", repr(idle_minutes * 60)] if idle_minutes is not None else ["--off"]
    beats = _ask_agents(state, home, name, policy)
    state.put_cluster(spec, status=record.status)
    state.add_event(name, "autostop", "the nodes stop themselves: " + spec.limits.text())
    return beats


def agent_beats(state: State, home: Path, name: str) -> list[dict[str, Any]]:
    """Each node's agent as it sees itself: its beat (``resident``, ``jobs``,
    ``idle_since``) and autostop policy (``autostop``, ``stops_at``). One round trip."""
    return _ask_agents(state, home, name, [])


def _ask_agents(state: State, home: Path, name: str, policy: list[str]) -> list[dict[str, Any]]:
    import json

    from cloudtrain.executors.base import fan_out

    record = state.cluster(name)
    if record is None:
        raise NotFoundError(f"no cluster named {name!r}; `cloudtrain status` lists them")
    prov = provider_for(record.spec, home)

    def one(node: NodeInfo) -> dict[str, Any]:
        ex = prov.executor(node)
        try:
            done = ex.run(
                [node.python, "-m", "cloudtrain.node", "autostop", "--root", node.root, *policy],
                timeout=60,
            ).check()
        finally:
            ex.close()
        beat = {"node": node.index, **json.loads(done.stdout)}
        if beat.get("stops_in") is not None:  # on this machine's clock: the node's may be off
            beat["stops_at"] = time.time() + float(beat["stops_in"])
        return beat

    return fan_out(one, state.nodes(name))


def down(
    state: State,
    home: Path,
    name: str,
    *,
    stop_jobs: StopJobs,
    provider_name: str | None = None,
    options: Mapping[str, Any] | None = None,
    on_event: OnEvent = ignore_event,
) -> bool:
    """Tear the cluster down: stop its jobs (`stop_jobs`, which keeps their logs), delete
    every node and resource the provider finds by tag, forget the cluster. Blocks until gone.
    Idempotent: returns False when there was nothing to do. Without a state record,
    `provider_name` (default local) is asked for nodes tagged with `name`."""
    from cloudtrain import locks

    with locks.cluster_lock(home, name, "down", on_wait=_waiting(on_event)):
        return _down(state, home, name, provider_name, options, on_event, stop_jobs)


def forget(state: State, home: Path, name: str, on_event: OnEvent = ignore_event) -> str:
    """Drop the record of cluster `name` when its provider confirms nothing of it is left, or
    cannot reach any of it (an ssh cluster whose hosts refuse us): what `down` cannot remove.
    Returns why it was forgotten. Raises `NotFoundError` for no record, `ConfigError` when the
    provider still finds nodes or resources (`down` removes them)."""
    from cloudtrain import locks

    with locks.cluster_lock(home, name, "down", on_wait=_waiting(on_event)):
        record = state.cluster(name)
        if record is None:
            raise NotFoundError(f"no cluster named {name!r} is recorded here; nothing to forget")
        try:
            prov = provider_for(record.spec, home)
            found = prov.describe(name, record.spec.cluster_id)
            left = [] if found else prov.leftovers(name, record.spec.cluster_id)
        except ProviderError as exc:  # what is left, if anything, is still found by its tags
            why = (
                f"{record.provider} cannot reach it ({exc}); whatever of it remains, "
                f"`cloudtrain down {name} --provider {record.provider}` finds by "
                "tag"
            )
        else:
            live = [n for n in found if n.state != UNREACHABLE]
            if live or left:
                what = f"{len(live)} node(s)" if live else ", ".join(left)
                raise ConfigError(
                    f"cluster {name!r} still has {what} on {record.provider}; "
                    f"`cloudtrain down {name}` removes them"
                )
            why = (
                f"{record.provider} has none of its nodes reachable"
                if found
                else f"{record.provider} has nothing of it"
            )
        for intent in state.open_intents(name):
            state.end_intent(intent.id, "forgotten")
        state.delete_cluster(name)
        state.add_event(name, "down", f"record of {name!r} forgotten: {why}")
        return why


def _down(
    state: State,
    home: Path,
    name: str,
    provider_name: str | None,
    options: Mapping[str, Any] | None,
    on_event: OnEvent,
    stop_jobs: StopJobs,
) -> bool:
    record = state.cluster(name)
    pname = record.provider if record else provider_name or registry.default()
    if pname not in registry.available():
        raise NotFoundError(
            f"no cluster named {name!r} here, and provider {pname!r} is not available"
        )
    # the recorded account, with what the caller said on top (e.g. another owner)
    prov = provider(pname, home, {**(record.spec.extra if record else {}), **(options or {})})
    cid = record.spec.cluster_id if record else None  # no record: every incarnation of the name
    found = prov.describe(name, cid)
    left = [] if found else prov.leftovers(name, cid)  # every instance gone, its resources not
    if record is None and not found and not left:
        return False
    if record is not None and state.nodes(name):
        stop_jobs(state, home, prov, name, on_event)
    if found:
        on_event(Event("terminate", f"terminating {len(found)} node(s) of {name!r} on {pname}"))
    elif left:
        on_event(
            Event(
                "terminate",
                f"no node of {name!r} is left on {pname}; deleting what remains: {', '.join(left)}",
            )
        )
    earlier = state.open_intents(name)
    with state.intent(name, "terminate", {"provider": pname}):
        prov.terminate(name, cid)
    for intent in earlier:
        state.end_intent(intent.id, "cleaned by down")
    if record is not None:
        state.delete_cluster(name)
    state.add_event(name, "down", f"cluster {name!r} terminated")
    return True
