"""Finding, signalling and stopping a node's processes by their environment. Stdlib only.

Processes are found by environment variables the coordinator sets on every job
(``CLOUDTRAIN_JOB_ID``, ``CLOUDTRAIN_NODE_ROOT``), which torchrun passes on to its workers —
workers run in sessions of their own, so a process-group kill would miss them.
A host's teardown runs this file as a script, from its source (`main`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cloudtrain.node import notices


POLL_S = 0.05


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except PermissionError:
        return True
    return state not in (b"Z", b"X")


def _ancestors() -> set[int]:
    pids, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        pids.add(pid)
    return pids


def environments() -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """(pid, environment) of every live process this user can read, but this process and
    its ancestors (whose command lines may name what they look for)."""
    skip = _ancestors()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                pairs = f.read().split(b"\0")
        except OSError:
            continue
        if alive(int(entry.name)):
            yield int(entry.name), dict(p.split(b"=", 1) for p in pairs if b"=" in p)


def ssh_sessions(server: str | None = None) -> list[str]:
    """The terminals of this user's interactive SSH sessions (sshd sets ``SSH_TTY`` in a session
    that has one; a command the coordinator runs has none). With `server` (``"ADDRESS PORT"``,
    as ``SSH_CONNECTION`` ends), only sessions with that sshd: one machine may hold several
    nodes' sshds (ssh hosts of a lab), or a terminal whose processes inherit its ``SSH_TTY``."""
    ttys = set()
    for _, env in environments():
        tty, link = env.get(b"SSH_TTY"), env.get(b"SSH_CONNECTION", b"").split()
        if tty and (server is None or b" ".join(link[2:4]).decode(errors="replace") == server):
            ttys.add(tty.decode(errors="replace"))
    return sorted(ttys)


def own_sshd() -> str | None:
    """``"ADDRESS PORT"`` of the sshd this process came through (None under systemd)."""
    link = os.environ.get("SSH_CONNECTION", "").split()
    return " ".join(link[2:4]) if len(link) == 4 else None


def find_processes(match: Mapping[str, str]) -> list[int]:
    """Pids whose environment holds every KEY=VALUE of `match` (never this process's own line)."""
    wanted = {k.encode(): v.encode() for k, v in match.items()}
    return [pid for pid, env in environments() if all(env.get(k) == v for k, v in wanted.items())]


#: The file a job's stop (`kill --job-dir`) writes in the attempt's folder before its first
#: signal: the job was stopped (it did not vanish), and the node stays (not a teardown).
STOPPED = "stopped"

#: The variables a node's processes name their node by: the coordinator's, and the warm
#: client's (`cloudtrain.jobs.warm` renames its own in place, so that a job's stop signals
#: its agent once; a teardown stops the client too).
NODE_ROOT_NAMES = (b"CLOUDTRAIN_NODE_ROOT", b"_LOUDTRAIN_NODE_ROOT")


def find_nodes(base: str) -> list[int]:
    """Pids of every node under `base`, a cluster's folder on its host (its nodes' roots are
    ``BASE/node-I``), whether or not a node's folder is still there."""
    prefix = os.fsencode(base.rstrip("/")) + b"/node-"
    return [pid for pid, env in environments() if _names_under(env, prefix)]


def find_node(root: str) -> list[int]:
    """Pids of the one node whose root is `root` (exactly: ``node-1`` is not ``node-10``),
    whether or not its folder is still there."""
    exact = os.fsencode(root.rstrip("/"))
    return [
        pid
        for pid, env in environments()
        if any(env.get(name) == exact for name in NODE_ROOT_NAMES)
    ]


def _names_under(env: Mapping[bytes, bytes], prefix: bytes) -> bool:
    return any(env.get(name, b"").startswith(prefix) for name in NODE_ROOT_NAMES)


def kill_matching(
    match: Mapping[str, str], grace_s: float = 10.0, spare: int | None = None
) -> dict[str, int]:
    """TERM every matching process but `spare`, wait up to `grace_s` for all of them (`spare`
    too: a job's wrapper, which then writes the exit code), then KILL the rest (`stop`).
    Blocks until they are gone (or `KILL_WAIT_S` after KILL). Returns counts; idempotent."""
    counts = stop(lambda: find_processes(match), grace_s, spare)
    return {"terminated": counts["terminated"], "killed": counts["killed"]}


#: How long `stop` waits for the processes it KILLed (one in the kernel's uninterruptible
#: sleep outlives it: it is reported, not waited for).
KILL_WAIT_S = 5.0
#: How often `stop` looks again for processes that came since (a supervisor's restart).
RESCAN_S = 0.25


def stop(find: Callable[[], list[int]], grace_s: float, spare: int | None = None) -> dict[str, int]:
    """Stop the processes `find` gives: TERM each but `spare`, those it gives later too,
    until it gives none or `grace_s` passed; then KILL each it still gives, until it gives
    none or `KILL_WAIT_S` passed. Returns how many were TERMed (or spared), KILLed, and are
    ``left`` (0 unless something outlived KILL). Blocks; idempotent."""
    termed = _until_gone(find, signal.SIGTERM, grace_s, spare)
    killed = _until_gone(find, signal.SIGKILL, KILL_WAIT_S, None)
    left = find()
    return {"terminated": len(termed), "killed": len(killed), "left": len(left)}


def _until_gone(
    find: Callable[[], list[int]], sig: signal.Signals, within_s: float, spare: int | None
) -> set[int]:
    """Send `sig` once to each process `find` gives but `spare`, looking again every
    `RESCAN_S` (at once when the ones found are gone) until it gives none, or `within_s`
    passed. Returns every pid it found."""
    deadline, seen = time.monotonic() + within_s, set()
    while True:
        pids = find()
        for pid in pids:
            if pid not in seen and pid != spare:
                _signal(pid, sig)
                if sig == signal.SIGTERM:  # a stopped process (^Z, a debugger) acts on it
                    _signal(pid, signal.SIGCONT)
        seen.update(pids)
        if not pids or time.monotonic() >= deadline:
            return seen
        until = min(deadline, time.monotonic() + RESCAN_S)
        while time.monotonic() < until and any(alive(p) for p in pids):
            time.sleep(POLL_S)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def tell_job(root: Path, notice: notices.Notice) -> list[int]:
    """Record `notice` in `root` and send the notice signal to every process of the node's
    jobs that catches it: those whose environment names the node (``CLOUDTRAIN_NODE_ROOT``)
    and a job (``CLOUDTRAIN_JOB_ID``); the pids signalled. The node's bootstrap and agent name
    no job, and must not be told: a bash with an EXIT trap "catches" the signal, and dies of
    it (a notice during a bootstrap once killed it so)."""
    from cloudtrain.node import notices

    notices.record(root, notice)
    signum = signal.Signals[notices.NOTICE_SIGNAL_NAME]
    node = os.fsencode(str(root))
    told = []
    for pid, env in environments():
        if env.get(b"CLOUDTRAIN_NODE_ROOT") != node or b"CLOUDTRAIN_JOB_ID" not in env:
            continue
        if notices.catches(pid, signum):
            _signal(pid, signum)
            told.append(pid)
    return told


@contextlib.contextmanager
def held_if_free(path: Path) -> Iterator[bool]:
    """Hold the flock on `path` (made 0600, this pid written in it) for the block if no other
    process holds it; never waits. Yields whether this process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def main(argv: Sequence[str]) -> int:
    """``python -c "$(cat procs.py)" stop-nodes BASE GRACE_S``: `stop` every process of the
    nodes under BASE (``~`` expanded; ``stop-node ROOT GRACE_S``: of the one node whose root
    is ROOT) and print the counts as one JSON line; exit 1 when one outlived KILL. A host's
    teardown runs this file as source with the host's own Python: it cannot count on
    cloudtrain being importable there (in its nodes' venv, or not yet)."""
    import json

    finders = {"stop-nodes": find_nodes, "stop-node": find_node}
    if len(argv) != 3 or argv[0] not in finders:
        print("usage: stop-nodes BASE GRACE_S | stop-node ROOT GRACE_S", file=sys.stderr)
        return 2
    where, find = os.path.expanduser(argv[1]), finders[argv[0]]
    counts = stop(lambda: find(where), float(argv[2]))
    print(json.dumps(counts), flush=True)
    return 1 if counts["left"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
