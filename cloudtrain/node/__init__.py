"""The node agent: the few commands the coordinator runs on a node, through any executor.

Stdlib only and quick to start, because it runs on every node for every job::

    python -m cloudtrain.node port                    print a free TCP port
    python -m cloudtrain.node follow JOB_DIR          stream node.log until the job ends
    python -m cloudtrain.node follow JOB_DIR --once   print node.log as it is now
    python -m cloudtrain.node status JOB_DIR          one JSON line: exit code, alive, pid
    python -m cloudtrain.node kill --match K=V ...    stop every process whose environment has
                     [--grace S] [--mark JOB_DIR]     all K=V (TERM, then KILL after S seconds)
    python -m cloudtrain.node watch --source S        wait for the cloud's preemption notice
                     --root ROOT [--endpoint URL]     (`cloudtrain.node.notices`); on one,
                                                      record it in ROOT and tell the job

Processes are found by environment variables the coordinator sets on every job
(``CLOUDTRAIN_JOB_ID``, ``CLOUDTRAIN_NODE_ROOT``), which torchrun passes on to its workers —
workers run in sessions of their own, so a process-group kill would miss them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cloudtrain.node import notices

POLL_S = 0.05
MAX_POLL_S = 0.1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
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


def find_processes(match: Mapping[str, str]) -> list[int]:
    """Pids whose environment holds every KEY=VALUE of `match` (never this process's own line)."""
    wanted = {f"{k}={v}".encode() for k, v in match.items()}
    skip = _ancestors()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= env and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_matching(
    match: Mapping[str, str], grace_s: float = 10.0, spare: int | None = None
) -> dict[str, int]:
    """TERM every matching process but `spare`, wait up to `grace_s` for all of them (`spare`
    too: a job's wrapper, which then writes the exit code), then KILL the rest. Blocks until
    they are gone (or 5 s after KILL). Returns counts; idempotent."""
    pids = find_processes(match)
    for pid in pids:
        if pid != spare:
            _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(POLL_S)
    stubborn = [p for p in pids if _alive(p)] + [p for p in find_processes(match) if p not in pids]
    for pid in stubborn:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in stubborn):
        time.sleep(POLL_S)
    return {"terminated": len(pids), "killed": len(stubborn)}


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def job_status(job_dir: Path) -> dict[str, object]:
    """The state of the job's process on this node, from its files."""
    code_text = _read(job_dir / "exit_code")
    pid_text = _read(job_dir / "pid")
    pid = int(pid_text) if pid_text and pid_text.isdigit() else None
    log, exit_file = job_dir / "node.log", job_dir / "exit_code"
    return {
        "exit_code": int(code_text) if code_text and code_text.lstrip("-").isdigit() else None,
        "ended": exit_file.stat().st_mtime if code_text is not None else None,
        "cancelled": (job_dir / "cancelled").exists(),
        "alive": pid is not None and _alive(pid),
        "pid": pid,
        "log_bytes": log.stat().st_size if log.exists() else 0,
        # the node's preemption notice, if its cloud gave one (<root>/jobs/<id> is the job's)
        "preemption": notices.read(job_dir.parent.parent),
    }


def tell_job(root: Path, notice: notices.Notice) -> list[int]:
    """Record `notice` in `root` and send the notice signal to every process of the node's
    jobs (found by ``CLOUDTRAIN_NODE_ROOT``) that catches it; the pids signalled."""
    notices.record(root, notice)
    signum = signal.Signals[notices.NOTICE_SIGNAL_NAME]
    told = []
    for pid in find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)}):
        if notices.catches(pid, signum):
            _signal(pid, signum)
            told.append(pid)
    return told


def watch(source: str, root: Path, endpoint: str | None, interval_s: float) -> int:
    """The resident watcher: block until the notice, tell the job, print what was done."""

    def report(exc: Exception) -> None:
        print(f"cloudtrain-agent: {source}: {exc}", file=sys.stderr, flush=True)

    notice = notices.watch(notices.source(source, endpoint), interval_s=interval_s,
                           on_error=report)  # fmt: skip
    if notice is None:
        return 1
    told = tell_job(root, notice)
    print(json.dumps({**notice.to_dict(), "signalled": told}), flush=True)
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def follow(job_dir: Path, *, once: bool = False, tail: int | None = None) -> int:
    """Copy node.log to stdout as it grows, until the job ended and the log is drained.
    Returns 0, or 3 when the job's process vanished without an exit code. With `tail`, start
    from (about) the last `tail` lines."""
    out = sys.stdout.buffer
    log, offset, delay = job_dir / "node.log", 0, POLL_S
    if tail is not None and log.exists():
        offset = _tail_offset(log, tail)
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
    """The offset where the last `lines` lines of `log` start (reads at most 1 MiB back)."""
    size = log.stat().st_size
    start = max(0, size - (1 << 20))
    with open(log, "rb") as f:
        f.seek(start)
        data = f.read()
    cut = len(data)
    for _ in range(lines + 1):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return start
    return start + cut + 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cloudtrain.node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("port")
    p_follow = sub.add_parser("follow")
    p_follow.add_argument("job_dir", type=Path)
    p_follow.add_argument("--once", action="store_true")
    p_follow.add_argument("--tail", type=int, metavar="LINES")
    p_status = sub.add_parser("status")
    p_status.add_argument("job_dir", type=Path)
    p_kill = sub.add_parser("kill")
    p_kill.add_argument("--match", action="append", required=True, metavar="KEY=VALUE")
    p_kill.add_argument("--grace", type=float, default=10.0)
    p_kill.add_argument(
        "--job-dir", type=Path, help="spare the job's wrapper (it records the exit)"
    )
    p_kill.add_argument("--mark", action="store_true", help="write JOB_DIR/cancelled first")
    p_watch = sub.add_parser("watch")
    p_watch.add_argument("--source", required=True, choices=sorted(notices.ENDPOINTS))
    p_watch.add_argument("--root", type=Path, required=True)
    p_watch.add_argument("--endpoint", help="the metadata server (default: the cloud's own)")
    p_watch.add_argument("--interval", type=float, default=1.0, metavar="SECONDS")
    args = parser.parse_args(argv)

    if args.command == "port":
        print(free_port())
    elif args.command == "follow":
        return follow(args.job_dir, once=args.once, tail=args.tail)
    elif args.command == "status":
        print(json.dumps(job_status(args.job_dir)))
    elif args.command == "watch":
        return watch(args.source, args.root, args.endpoint, args.interval)
    else:
        match = dict(item.split("=", 1) for item in args.match)
        spare = None
        if args.job_dir is not None and args.job_dir.is_dir():
            if args.mark:
                (args.job_dir / "cancelled").write_text(f"{time.time()}\n")
            pid_text = _read(args.job_dir / "pid")
            spare = int(pid_text) if pid_text and pid_text.isdigit() else None
        print(json.dumps(kill_matching(match, args.grace, spare)))
    return 0
