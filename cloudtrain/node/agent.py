"""The resident node agent: one per node, from the end of its bootstrap to its teardown.

Stdlib only. On a cloud node systemd runs it (``cloudtrain-agent.service``, restarted
whenever it dies); on ssh and local nodes the bootstrap starts it detached under a
supervisor of its own (`ensure`), which starts it again when it dies, and the coordinator's
heartbeat starts a new one when both are gone (`heal`)::

    python -m cloudtrain.node agent --root ROOT [--source S] [--endpoint URL]
        the agent, in the foreground (systemd's ExecStart)
    python -m cloudtrain.node agent --root ROOT --ensure [--source S] [--endpoint URL]
        start it detached and supervised unless one is resident; prints its beat

What it does, every `BEAT_S`: writes ``<root>/agent/beat.json`` (its pid, since when, the
node's running jobs, since when the node has had none) — the coordinator's heartbeat reads it
through ``python -m cloudtrain.node status``, so a node answers for its agent as well as for
its job. With a `--source`, it watches the cloud's preemption notice (`cloudtrain.node.notices`)
in a thread and, on one, records it and tells the node's jobs (`cloudtrain.node.tell_job`).

One agent per node: the resident one holds ``<root>/agent/lock`` (flock); a second one sees it
held and exits 0, which its supervisor takes as "nothing to do". The agent exits 0 when its
node's folder is gone (a teardown on ssh or local removes it), and on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloudtrain.node import notices, procs, restarts, selfstop

#: Seconds between two beats; a beat older than `STALE_S` is an agent that is not there.
BEAT_S = 2.0
STALE_S = 3 * BEAT_S + 2
#: A file present on nodes whose agent runs detached (`ensure`): their heartbeat heals it.
DETACHED = "detached"
#: The autostop policy in the agent's folder (`set_policy`).
POLICY = "policy.json"


def agent_dir(root: Path) -> Path:
    return root / "agent"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def running_jobs(root: Path) -> list[str]:
    """The ids of the jobs that have a process on the node at `root`."""
    mine, jobs = str(root).encode(), set()
    for _, env in procs.environments():
        if env.get(b"CLOUDTRAIN_NODE_ROOT") == mine and b"CLOUDTRAIN_JOB_ID" in env:
            jobs.add(env[b"CLOUDTRAIN_JOB_ID"].decode(errors="replace"))
    return sorted(jobs)


def _held(root: Path) -> contextlib.AbstractContextManager[bool]:
    """Whether this process got the node's agent lock (held until the block ends)."""
    agent_dir(root).mkdir(mode=0o700, parents=True, exist_ok=True)
    return procs.held_if_free(agent_dir(root) / "lock")


#: The policy's fields: seconds without a job (or a user's SSH session) before the node stops;
#: in how many seconds from now it stops in any case (``ends_in``) and why (`ENDS`: which of
#: the cluster's limits that is); whether SSH sessions of the user count as work (not on the
#: user's own machine: the local provider).
POLICY_FIELDS = ("idle_s", "ends_in", "why", "sessions")
#: What a deadline may be: the cluster's lifetime (``--max-hours``) or its budget (``--max-cost``).
ENDS = ("lifetime", "budget")
#: The clock a deadline is kept on: seconds since this boot, suspend included, whatever the
#: wall clock says or is set to (a node's clock off by minutes must not move its lifetime).
BOOT_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
#: How the policy keeps a deadline (`_ends`).
DEADLINE = ("ends_boot", "boot_id", "ends_wall")


def boot_id() -> str | None:
    """This boot's id (Linux); the boot clock starts again at 0 with another."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _ends(left_s: float) -> dict[str, Any]:
    """A deadline `left_s` seconds from now, as the policy keeps it: on the boot clock
    (``ends_boot``, with the boot's id), and on this node's wall clock (``ends_wall``: used
    only after a reboot, when the boot clock started again)."""
    return {
        "ends_boot": time.clock_gettime(BOOT_CLOCK) + left_s,
        "boot_id": boot_id(),
        "ends_wall": time.time() + left_s,
    }


def ends_in(policy: dict[str, Any]) -> float | None:
    """Seconds until the policy's deadline (negative: past), on this node's boot clock."""
    if policy.get("ends_boot") is None:
        return None
    if policy.get("boot_id") == boot_id():
        return float(policy["ends_boot"]) - time.clock_gettime(BOOT_CLOCK)
    return float(policy.get("ends_wall") or 0) - time.time()  # rebooted since: its own clock


def read_policy(root: Path) -> dict[str, Any] | None:
    """The node's autostop policy (`set_policy`), or None when it has none."""
    try:
        found = json.loads((agent_dir(root) / POLICY).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def set_policy(root: Path, **changes: Any) -> dict[str, Any]:
    """Change the node's policy (`POLICY_FIELDS`; a field left out keeps its value, None clears
    it). A change of ``idle_s`` starts the idle clock again now. The policy is kept even when
    nothing is set in it, so that an agent that starts again does not take its boot policy back
    (`boot_policy`)."""
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        raise ValueError(f"not a policy field: {sorted(unknown)}")
    policy = {**dict.fromkeys(POLICY_FIELDS), **(read_policy(root) or {}), **changes}
    left = policy.pop("ends_in", None)  # kept as a deadline, from the moment it came
    if "ends_in" in changes:
        policy.update(_ends(float(left)) if left is not None else dict.fromkeys(DEADLINE))
    if "idle_s" in changes or "set_at" not in policy:
        policy["set_at"] = time.time()
    agent_dir(root).mkdir(mode=0o700, parents=True, exist_ok=True)
    _write_atomic(agent_dir(root) / POLICY, json.dumps(policy) + "\n")
    return policy


def boot_policy(root: Path, **given: Any) -> None:
    """The policy a node was made with (its unit's flags): set unless it has one already."""
    if read_policy(root) is None and any(v is not None for v in given.values()):
        set_policy(root, **given)


def stops_in(
    policy: dict[str, Any], idle_since: float | None, now: float
) -> tuple[float, str] | None:
    """In how many seconds from `now` (this node's wall clock, which the idle clock runs on)
    the node stops itself if nothing changes (0 or less: due), and why; None: not while it
    works. The deadline is on the boot clock (`ends_in`)."""
    due: list[tuple[float, str]] = []
    left = ends_in(policy)
    if left is not None:
        why = policy.get("why") if policy.get("why") in ENDS else "time"
        due.append((left, f"its {why} ended"))
    if policy.get("idle_s") is not None and idle_since is not None:
        idle_s = float(policy["idle_s"])
        start = max(idle_since, float(policy.get("set_at") or 0))
        due.append((start + idle_s - now, f"idle for {idle_s:g} s"))
    return min(due) if due else None


def stopped_record(root: Path) -> Path:
    """Where a node that stopped itself says why: beside its folder, which it removed."""
    return root.parent / f"{root.name}.stopped.json"


def stopped_reasons(cluster_dir: Path) -> list[str]:
    """What the nodes of a cluster that removed themselves said (`stopped_record`)."""
    found = []
    for record in sorted(cluster_dir.glob("node-*.stopped.json")):
        try:
            text = record.read_text()
        except OSError:
            text = ""
        found.append(said_when_stopped(record.name.split(".")[0], text))
    return found


def said_when_stopped(node: str, text: str) -> str:
    """One line from the text of a node's `stopped_record` (a bad one still says it stopped)."""
    try:
        said = json.loads(text)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(said["at"])))
        return f"{node} removed itself at {when}: {str(said['why'])[:200]}"
    except (ValueError, KeyError, TypeError):
        return f"{node} removed itself"


def _stop_node(
    root: Path, why: str, halt: str | None, metadata: str | None, arm: str | None
) -> bool:
    """The node stops: its jobs stopped, the reason left beside its folder; then either the
    folder deleted (ssh, local: the machines are the user's; its jobs' folders and checkpoints
    moved beside it first, `selfstop.keep`) or, with `halt`, the machine
    stopped the cloud's way (`cloudtrain.node.selfstop`). False when that failed (it is tried
    again a minute later)."""
    _write_atomic(stopped_record(root), json.dumps({"at": time.time(), "why": why}) + "\n")
    procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(root)}, grace_s=10)  # not this agent
    if halt is None:
        selfstop.keep(root)  # for the next command at home to bring home
        shutil.rmtree(root, ignore_errors=True)
        return True
    failed = selfstop.stop(halt, metadata, arm)
    if failed:
        print(f"cloudtrain-agent: {failed}", file=sys.stderr, flush=True)
    return failed is None


def resident(
    root: Path,
    source: str | None = None,
    endpoint: str | None = None,
    *,
    halt: str | None = None,
    arm: str | None = None,
    interval_s: float = 1.0,
    beat_s: float = BEAT_S,
) -> int:
    """The agent's life: 0 when another one is resident, the node's folder went away or a
    SIGTERM came. `halt`: how a cloud node stops (`cloudtrain.node.selfstop`: the metadata
    server is `endpoint`, ARM `arm`); None: by removing its folder."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with _held(root) as mine:
        if not mine:
            print(f"cloudtrain-agent: one is resident at {root} already", flush=True)
            return 0
        if source is not None:
            threading.Thread(
                target=_notices, args=(root, source, endpoint, interval_s), daemon=True
            ).start()
        since = time.time()
        idle_since: float | None = since
        halt_tried = 0.0
        sshd = procs.own_sshd()  # an ssh node's: the sessions that count are with it
        while not stop.is_set():
            if not root.is_dir():
                return 0
            jobs = running_jobs(root)
            now = time.time()
            policy = read_policy(root) or {}
            sessions = procs.ssh_sessions(sshd) if policy.get("sessions") else []
            idle_since = None if jobs or sessions else (idle_since or now)
            due = stops_in(policy, idle_since, now)
            if due is not None and due[0] <= 0 and now - halt_tried > 60:
                halt_tried = now
                if _stop_node(root, due[1], halt, endpoint, arm) and halt is None:
                    return 0
            beat = {
                "pid": os.getpid(),
                "since": since,
                "beat": now,
                "source": source,
                "endpoint": endpoint,
                "halt": halt,
                "arm": arm,
                "notice": notices.read(root) is not None,
                "jobs": jobs,
                "sessions": len(sessions),
                "idle_since": idle_since,
                "autostop": policy or None,
                "stops_in": due[0] if due else None,
                "stops_at": now + due[0] if due else None,
            }
            with contextlib.suppress(FileNotFoundError):  # the folder went away meanwhile
                _write_atomic(agent_dir(root) / "beat.json", json.dumps(beat) + "\n")
            stop.wait(beat_s)
    return 0


def _notices(root: Path, source: str, endpoint: str | None, interval_s: float) -> None:
    if notices.read(root) is not None:
        return  # told already (an agent that came back after the notice)

    def report(exc: Exception) -> None:
        print(f"cloudtrain-agent: {source}: {exc}", file=sys.stderr, flush=True)

    notice = notices.watch(notices.source(source, endpoint), interval_s=interval_s, on_error=report)
    if notice is not None:
        told = procs.tell_job(root, notice)
        print(json.dumps({**notice.to_dict(), "signalled": told}), flush=True)


def supervise(child: Sequence[str]) -> int:
    """Run `child` until it exits 0, starting it again after each death (`restarts`: 1 s,
    doubling up to 30 s; back to 1 s after a minute's life). SIGTERM stops the child and this."""

    def say(line: str) -> None:
        print(f"cloudtrain-agent: {line}", file=sys.stderr, flush=True)

    return restarts.supervise(child, "the agent", say)


def beat(root: Path) -> dict[str, Any]:
    """The agent's last beat as the node sees it: ``resident`` (a beat younger than
    `STALE_S`), ``age`` in seconds, and the beat's own fields."""
    try:
        last = dict(json.loads((agent_dir(root) / "beat.json").read_text()))
    except (OSError, ValueError):
        return {"resident": False, "age": None}
    age = max(0.0, time.time() - float(last.get("beat", 0)))
    return {**last, "resident": age < STALE_S, "age": round(age, 1)}


def view(root: Path) -> dict[str, Any]:
    """The agent's beat with its autostop policy as it is now (``autostop``; ``stops_in``,
    seconds from now, and ``stops_at`` by this node's clock: the policy may be newer than the
    last beat)."""
    now, policy, clock = beat(root), read_policy(root), time.time()
    idle_since = now.get("idle_since")
    due = stops_in(policy, idle_since if now["resident"] else None, clock) if policy else None
    return {
        **now,
        "autostop": policy,
        "stops_in": due[0] if due else None,
        "stops_at": clock + due[0] if due else None,
    }


def argv(root: Path, source: str | None, endpoint: str | None) -> list[str]:
    """The command line of the agent of the node at `root` (in the foreground)."""
    line = [sys.executable, "-m", "cloudtrain.node", "agent", "--root", str(root)]
    if source is not None:
        line += ["--source", source]
    if endpoint is not None:
        line += ["--endpoint", endpoint]
    return line


def ensure(
    root: Path, source: str | None = None, endpoint: str | None = None, *, wait_s: float = 0
) -> dict[str, Any]:
    """Start the agent detached, under its supervisor, unless one is resident; its beat, with
    ``launched`` saying whether this call started it (waiting up to `wait_s` for its first
    beat)."""
    root = root.absolute()
    now = beat(root)
    if now["resident"]:
        return {**now, "launched": False}
    with _held(root) as free:
        if not free:  # alive but late with its beat: leave it be
            return {**now, "launched": False}
    folder = agent_dir(root)
    (folder / DETACHED).touch()
    with open(folder / "agent.log", "ab") as log:
        subprocess.Popen(
            [*argv(root, source, endpoint), "--supervise"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            env={**os.environ, "CLOUDTRAIN_NODE_ROOT": str(root)},
            start_new_session=True,
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not beat(root)["resident"]:
        time.sleep(0.05)
    return {**beat(root), "launched": True}


def heal(root: Path) -> dict[str, Any]:
    """The heartbeat's answer for the agent: its beat; a detached agent that is not there is
    started again (``restarted``: why)."""
    now = beat(root)
    if now["resident"] or not (agent_dir(root) / DETACHED).exists():
        return now
    why = "it never beat" if now["age"] is None else f"its last beat was {now['age']:.0f} s ago"
    started = ensure(root, now.get("source"), now.get("endpoint"))
    return {**started, "restarted": why} if started["launched"] else now
