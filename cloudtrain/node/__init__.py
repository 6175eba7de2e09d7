"""The node agent: the few commands the coordinator runs on a node, through any executor.

Stdlib only and quick to start, because it runs on every node for every job::

    python -m cloudtrain.node port [--count N]        print N free TCP ports
    python -m cloudtrain.node follow JOB_DIR          stream node.log until the job ends
    python -m cloudtrain.node follow JOB_DIR --once   print node.log as it is now
    python -m cloudtrain.node status JOB_DIR          one JSON line: exit code, alive, pid
    python -m cloudtrain.node metrics JOB_DIR         the offset after them, then the whole lines
                     [--offset N]                     of the job's metrics.jsonl from byte N
    python -m cloudtrain.node kill --match K=V ...    stop every process whose environment has
                     [--grace S] [--mark JOB_DIR]     all K=V (TERM, then KILL after S seconds)
    python -m cloudtrain.node agent --root ROOT       the resident agent (`cloudtrain.node.agent`):
        [--source S] [--endpoint URL]                 beats, and watches the notice if a source
        [--ensure [--wait S] | --supervise]           is given; --ensure starts it detached
    python -m cloudtrain.node notice --root ROOT      a scheduler says the node goes (Slurm's
        --source S [--action A] [--not-before T]      --signal): record it, tell the job
    python -m cloudtrain.node bootstrap phase ...     a bootstrap phase in the node's Python
                                                      (`cloudtrain.node.bootstrap`)
    python -m cloudtrain.node spawn --envs JSON ...   a TensorFlow or Horovod job's workers
                                                      (`cloudtrain.node.spawn`)
    python -m cloudtrain.node runtime RUNTIME         install (cloud nodes) or check what
                                                      a runtime needs (`.runtimes`)
    python -m cloudtrain.node horovod build|rendezvous  Horovod's wheel, built once per torch,
                                                      and its rendezvous (`.horovod`)
    python -m cloudtrain.node autostop --root ROOT    the node stops itself after S idle seconds
        [--idle-s S | --off] [--ends-in T --why W]    (--off: never when idle), or T seconds
        [--sessions | --no-sessions]                  from now, on the node's boot clock (its
                                                      wall clock may be off), because W
                                                      (lifetime, budget); prints the beat
                                                      (alone: only prints it); with no agent
                                                      running, stops the node if due, else
                                                      starts the agent again (`.unattended`)

The agent's own flags: ``--halt [poweroff|azure]`` (a cloud node: how it stops itself,
`cloudtrain.node.selfstop`; ``--arm URL`` for Azure's) and its boot policy
(``--idle-s``, ``--ends-in``, ``--why``, ``--sessions``: what `up` asked, set once at the first
start, kept when a later `autostop` changed it: the deadline counts from then, not again).

`status` answers the coordinator's heartbeat for the job and for the node's agent (a detached
agent that is not there is started again).
Processes are found by their environment (`cloudtrain.node.procs`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cloudtrain.node import procs
from cloudtrain.node.procs import POLL_S, alive, find_processes, kill_matching, tell_job

__all__ = ["find_processes", "kill_matching", "main", "tell_job", "whole_lines"]

MAX_POLL_S = 0.1
#: The commands of the node itself (its agent, a scheduler's notice, autostop), in
#: `cloudtrain.node.upkeep`: the coordinator's per-job calls (status, metrics, follow, kill,
#: port), every few seconds on every node, import none of their modules.
UPKEEP = ("agent", "notice", "autostop")
#: The most of a job's metrics one `metrics` call returns (the coordinator asks again).
METRICS_CHUNK = 4 << 20


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free now (all held open together while they are chosen)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(max(1, count))]
    try:
        for sock in socks:
            sock.bind(("", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def job_status(job_dir: Path) -> dict[str, object]:
    """The state of the job's process on this node, from its files."""
    from cloudtrain.node import notices, oom

    code_text = _read(job_dir / "exit_code")
    pid_text = _read(job_dir / "pid")
    pid = int(pid_text) if pid_text and pid_text.isdigit() else None
    log = job_dir / "node.log"
    return {
        "exit_code": int(code_text) if code_text and code_text.lstrip("-").isdigit() else None,
        "ended": _ended(job_dir) if code_text is not None else None,
        "now": time.time(),  # the node's clock, which `ended` is read on
        "cancelled": (job_dir / "cancelled").exists(),
        "stopped": (job_dir / procs.STOPPED).exists(),  # by cloudtrain's `kill` (another cause)
        "alive": pid is not None and alive(pid),
        "pid": pid,
        "log_bytes": log.stat().st_size if log.exists() else 0,
        # the node's preemption notice, if its cloud gave one (<root>/jobs/<id> is the job's)
        "preemption": notices.read(job_dir.parent.parent),
        # the steps the job counted (`cloudtrain.runtime.progress`), if it counts them
        "progress": _json(job_dir / "progress.json"),
        # the kernel's OOM kills in the job's memory cgroup while it ran (`.oom`), once it ended
        "oom_kills": oom.kills(job_dir),
    }


def _ended(job_dir: Path) -> float | None:
    """When the job's process ended, on this node's clock: the ``ended_at`` its wrapper wrote
    (`DETACH_SCRIPT`), else the time its ``exit_code`` was written."""
    with contextlib.suppress(ValueError):  # a `date` without %N wrote "N": the file's time
        written = float(_read(job_dir / "ended_at") or "nan")
        if math.isfinite(written):
            return written
    try:
        return (job_dir / "exit_code").stat().st_mtime
    except OSError:
        return None


def _json(path: Path) -> dict[str, object] | None:
    text = _read(path)
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def whole_lines(path: Path, offset: int, limit: int = METRICS_CHUNK) -> bytes:
    """The whole lines of `path` from byte `offset` on, at most `limit` bytes of them (a line
    longer than that alone); nothing when the file is not there or has no new whole line."""
    try:
        with open(path, "rb") as f:
            f.seek(max(offset, 0))
            data = f.read(limit)
            while data and b"\n" not in data:  # one line longer than the limit
                more = f.read(limit)
                if not more:
                    break
                data += more
    except OSError:
        return b""
    return data[: data.rfind(b"\n") + 1]


#: The most of node.log that ``follow --tail`` goes back.
TAIL_BYTES = 1 << 20


def follow(job_dir: Path, *, once: bool = False, tail: int | None = None) -> int:
    """Copy node.log to stdout as it grows, until the job ended and the log is drained.
    Returns 0, or 3 when the job's process vanished without an exit code. With `tail`, start
    from (about) the last `tail` lines."""
    out = sys.stdout.buffer
    log, offset, delay = job_dir / "node.log", 0, POLL_S
    if tail is not None and log.exists():
        offset = _tail_offset(log, tail)
        if offset and once:  # said apart from the log's text, which a script writes
            print(f"cloudtrain: left out {offset} bytes of node.log", file=sys.stderr)
    parent = os.getppid()
    while True:
        ended = (job_dir / "exit_code").exists() or (job_dir / "cancelled").exists()
        chunk = b""
        if log.exists():
            with open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        if chunk:
            out.write(chunk)
            out.flush()
            offset += len(chunk)
            delay = POLL_S
            continue
        if once or ended:
            return 0
        if os.getppid() != parent:  # whoever follows us went away
            return 0
        if not job_dir.is_dir():  # the node's files are gone (a machine lost, a teardown)
            print(f"cloudtrain: the job's folder on this node is gone ({job_dir})", file=sys.stderr)
            return 3
        status = job_status(job_dir)
        if status["pid"] is not None and not status["alive"]:
            time.sleep(0.2)  # the exit file is written just after the process ends
            if not (job_dir / "exit_code").exists():
                print(
                    f"cloudtrain: the job's process on this node is gone ({job_dir})",
                    file=sys.stderr,
                )
                return 3
        time.sleep(delay)
        delay = min(delay * 1.5, MAX_POLL_S)


def _tail_offset(log: Path, lines: int) -> int:
    """The offset where the last `lines` lines of `log` start (reads at most 1 MiB back: then
    where the first whole line in that MiB starts)."""
    size = log.stat().st_size
    start = max(0, size - TAIL_BYTES)
    with open(log, "rb") as f:
        f.seek(start)
        data = f.read(TAIL_BYTES)
    cut = len(data)
    for _ in range(lines + 1):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return start if start == 0 else start + data.find(b"\n") + 1
    return start + cut + 1


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] and words[0] in UPKEEP:  # the node's own commands: their modules only then
        from cloudtrain.node import upkeep

        return upkeep.main(words)
    if words[:1] == ["bootstrap"]:  # the bootstrap's phases, with their own arguments and --help
        from cloudtrain.node import bootstrap

        return bootstrap.main(words[1:])
    if words[:1] == ["spawn"]:  # a TensorFlow or Horovod job's workers on this node
        from cloudtrain.node import spawn

        return spawn.main(words[1:])
    if words[:1] == ["runtime"]:  # the framework a job's runtime needs
        from cloudtrain.node import runtimes

        return runtimes.main(words[1:])
    if words[:1] == ["horovod"]:  # Horovod's wheel, and a job's rendezvous
        from cloudtrain.node import horovod

        return horovod.main(words[1:])
    parser = argparse.ArgumentParser(
        prog="python -m cloudtrain.node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_port = sub.add_parser("port")
    p_port.add_argument("--count", type=int, default=1)
    p_follow = sub.add_parser("follow")
    p_follow.add_argument("job_dir", type=Path)
    p_follow.add_argument("--once", action="store_true")
    p_follow.add_argument("--tail", type=int, metavar="LINES")
    p_status = sub.add_parser("status")
    p_status.add_argument("job_dir", type=Path)
    p_metrics = sub.add_parser("metrics")
    p_metrics.add_argument("job_dir", type=Path)
    p_metrics.add_argument("--offset", type=int, default=0)
    p_kill = sub.add_parser("kill")
    p_kill.add_argument("--match", action="append", required=True, metavar="KEY=VALUE")
    p_kill.add_argument("--grace", type=float, default=10.0)
    p_kill.add_argument(
        "--job-dir", type=Path, help="spare the job's wrapper (it records the exit)"
    )
    p_kill.add_argument("--mark", action="store_true", help="write JOB_DIR/cancelled first")
    args = parser.parse_args(words)

    if args.command == "port":
        print(" ".join(str(p) for p in free_ports(args.count)))
    elif args.command == "follow":
        return follow(args.job_dir, once=args.once, tail=args.tail)
    elif args.command == "status":
        from cloudtrain.node import agent

        root = args.job_dir.absolute().parent.parent  # <root>/jobs/<id>
        print(json.dumps({**job_status(args.job_dir), "agent": agent.heal(root)}))
    elif args.command == "metrics":
        data = whole_lines(args.job_dir / "metrics.jsonl", args.offset)
        # the offset after them first: what the lines are as text need not be their bytes
        sys.stdout.buffer.write(b"%d\n" % (max(args.offset, 0) + len(data)) + data)
    else:
        match = dict(item.split("=", 1) for item in args.match)
        spare = None
        if args.job_dir is not None and args.job_dir.is_dir():
            if args.mark:
                (args.job_dir / "cancelled").write_text(f"{time.time()}\n")
            # a wrapper this stop kills writes no exit code: it was stopped, it did not vanish
            (args.job_dir / procs.STOPPED).write_text(f"{time.time()}\n")
            pid_text = _read(args.job_dir / "pid")
            spare = int(pid_text) if pid_text and pid_text.isdigit() else None
        print(json.dumps(kill_matching(match, args.grace, spare)))
    return 0
