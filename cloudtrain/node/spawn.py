"""Start a job's workers on one node when torchrun does not: TensorFlow's and Horovod's. Stdlib
only (Horovod is imported only on the head of a Horovod job, for its rendezvous)::

    python -m cloudtrain.node spawn --envs JSON [--rendezvous ADDR:PORT --hosts H:N,...]
                                    [--timeout S] -- COMMAND...

`JSON` is a list with one object per worker: the variables that worker gets on top of this
process's environment (its ``TF_CONFIG``, its ``HOROVOD_RANK`` ...). Every worker runs
`COMMAND` with the node's output (the job's log); the first that fails takes the others down
(TERM, then KILL after `GRACE_S`), and this process exits with its code, after a report in
the shape torchrun's has (``rank: R``, ``exitcode: C``), which `cloudtrain.jobs.torchrun`
reads for both. `--rendezvous` (the head of a Horovod job) serves Horovod's rendezvous for
`--hosts` on ADDR:PORT, the cluster's private address only, while the workers run.

A worker killed by SIGABRT in a Horovod job is most often the gloo rendezvous giving up on a
worker that never came (Horovod prints only gloo's C++ ``Wait timeout`` line, no Python error):
the report says so, naming `--timeout`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

__all__ = ["GRACE_S", "STOP_GRACE_S", "main", "report", "run_workers"]

#: How long the other workers get to finish once one has failed, before TERM.
GRACE_S = 10.0
#: How long the workers get to end once this process is told to stop (TERM or INT), before
#: KILL: less than the coordinator's own grace (10 s), so that this process reports and the
#: node's exit code is written before the coordinator KILLs what is left (TensorFlow's
#: multi-worker runtime ignores TERM while it waits for a peer).
STOP_GRACE_S = 5.0
POLL_S = 0.1


def report(rank: int, code: int, why: str = "") -> str:
    """The lines that say which worker ended the job and how (torchrun's keys)."""
    name = ""
    if code < 0:
        with contextlib.suppress(ValueError):
            name = f" ({signal.Signals(-code).name})"
    text = f"cloudtrain: worker rank {rank} exited {code}{name}{why}\n"
    return text + f"  rank: {rank}\n  exitcode: {code}\n"


def _copy_lines(proc: subprocess.Popen[bytes], lock: threading.Lock) -> None:
    """Copy the worker's output to ours a whole line at a time (workers' lines never mix)."""
    assert proc.stdout is not None
    with proc.stdout:
        for line in iter(proc.stdout.readline, b""):
            with lock:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()


def _drain(copiers: Sequence[threading.Thread]) -> None:
    for copier in copiers:
        copier.join(timeout=5)  # a worker's child may hold its pipe open: do not wait on it


def _stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def run_workers(
    command: Sequence[str],
    envs: Sequence[Mapping[str, str]],
    *,
    why_abort: str = "",
    grace_s: float = GRACE_S,
    stop_grace_s: float = STOP_GRACE_S,
) -> int:
    """Run one `command` per entry of `envs` (its variables on top of ours) until all end;
    0 when all succeed, else the code of the first that failed (the others stopped then).
    TERM or INT to this process is passed on to the workers; those that have not ended
    `stop_grace_s` later are KILLed."""
    procs: list[subprocess.Popen[bytes]] = []
    ranks = [int(env.get("RANK", env.get("HOROVOD_RANK", i))) for i, env in enumerate(envs)]
    stopping: list[int] = []
    stop_by: list[float] = []  # when the workers told to stop are KILLed
    copiers: list[threading.Thread] = []
    lock = threading.Lock()

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)
        stop_by.append(time.monotonic() + stop_grace_s)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {
        s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        for env in envs:  # a signal from here on reaches the workers started
            if stopping:
                break
            proc = subprocess.Popen(list(command), env={**os.environ, **env},
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
            procs.append(proc)
            copier = threading.Thread(target=_copy_lines, args=(proc, lock), daemon=True)
            copier.start()
            copiers.append(copier)
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in zip(ranks, codes, strict=False) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                _stop(procs, 0 if stopping else grace_s)
                _drain(copiers)
                why = why_abort if code == -signal.SIGABRT else ""
                sys.stdout.write(report(rank, code, why))
                sys.stdout.flush()
                return 128 - code if code < 0 else code
            if all(c == 0 for c in codes):
                _drain(copiers)
                return 0 if len(procs) == len(envs) else 128 + stopping[0]
            if stop_by and time.monotonic() > stop_by[0]:
                _stop(procs, 0)  # told to stop, and some did not: KILL them (reported next)
            time.sleep(POLL_S)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m cloudtrain.node spawn")
    parser.add_argument("--envs", required=True, help="a JSON list: each worker's variables")
    parser.add_argument("--rendezvous", metavar="ADDR:PORT", help="serve Horovod's here")
    parser.add_argument("--hosts", metavar="H:N,...", help="the Horovod job's hosts and slots")
    parser.add_argument("--timeout", type=float, help="Horovod's gloo timeout, for the report")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    envs = json.loads(args.envs)
    if not command or not isinstance(envs, list) or not envs:
        parser.error("give --envs (a list of one object per worker) and a command after --")
    why = ""
    if args.timeout is not None:
        why = (
            f": Horovod's gloo rendezvous gives up after {args.timeout:g} s without every "
            "worker (a worker on another node did not start or died first: see its log)"
        )
    if args.rendezvous:
        from cloudtrain.node import horovod

        addr, _, port = args.rendezvous.rpartition(":")
        server = horovod.serve(addr, horovod.parse_hosts(args.hosts or ""), int(port))
        try:
            return run_workers(command, envs, why_abort=why)
        finally:
            server.stop()
    return run_workers(command, envs, why_abort=why)
