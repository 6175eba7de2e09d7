"""What does cloudtrain add to torchrun, or save? The example's 2-node training, four ways.

    python bench/launch_overhead.py [--rounds 5] [--epochs 5]

Each round runs `examples/digits_ddp.py` on two local nodes
  (a) bare torchrun: two agents with the c10d rendezvous on 127.0.0.1, started by hand;
  (b) `cloudtrain train --start-method spawn` on a cluster made once by `cloudtrain up` (a new
      CLI process each round: state, workdir sync, the node agent, detached agents, streamed
      logs), whose agents are torchrun itself;
  (c) `cloudtrain train` with its default, fork: torchrun's agent forks workers that inherit
      its imported torch (`cloudtrain.jobs.elastic`), and is itself forked by the node's warm
      server (`cloudtrain.jobs.warm`), which the first fork job on each node starts at its end:
      round 1's fork is cold, the next rounds are warm;
  (d) the floor: the script in one plain process (one rank, no rendezvous, no agent);
in an order that rotates each round, each with a fresh checkpoint folder, after compiling
cloudtrain's modules as pip does at install. It prints medians of
the time to the first optimizer step (the example prints "cloudtrain: first step"), of the
steady training time after it, and of the wall time, with each one's ratio to bare torchrun,
and the median of each round's own ratio at the first step (paired: a busier round moves both
sides).
"""

from __future__ import annotations

import argparse
import compileall
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
MARK = "cloudtrain: first step"


def timed(procs: list[subprocess.Popen[str]], start: float) -> tuple[float, float, str]:
    """(time to first step, wall time, output) of processes started at `start`."""
    first: list[float] = []
    chunks: list[str] = []

    def read(proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout or ():
            chunks.append(line)
            if MARK in line and not first:
                first.append(time.perf_counter() - start)

    readers = [threading.Thread(target=read, args=(p,)) for p in procs]
    for r in readers:
        r.start()
    codes = [p.wait() for p in procs]
    for r in readers:
        r.join()
    wall = time.perf_counter() - start
    out = "".join(chunks)
    if any(codes) or not first:
        raise SystemExit(f"a run failed (exit codes {codes}):\n{out[-3000:]}")
    return first[0], wall, out


def run_cloudtrain(
    env: dict[str, str], epochs: int, ckpt: Path, start_method: str
) -> tuple[float, float, str]:
    argv = [
        sys.executable, "-m", "cloudtrain.cli", "train", "-c", "bench",
        "--start-method", start_method,
        str(EXAMPLES / "digits_ddp.py"), "--", "--epochs", str(epochs),
        "--checkpoint-dir", str(ckpt),
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return timed([proc], start)


def run_floor(env: dict[str, str], epochs: int, ckpt: Path) -> tuple[float, float, str]:
    argv = [sys.executable, "digits_ddp.py", "--epochs", str(epochs), "--checkpoint-dir", str(ckpt)]
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, env={**env, "OMP_NUM_THREADS": "1"}, cwd=EXAMPLES,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return timed([proc], start)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_torchrun(env: dict[str, str], epochs: int, ckpt: Path) -> tuple[float, float, str]:
    port = free_port()
    env = {**env, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                f"bench-{port}",
                "--rdzv-conf",
                f"is_host={int(node == 0)}",
                "--local-addr",
                "127.0.0.1",
                "digits_ddp.py",
                "--epochs",
                str(epochs),
                "--checkpoint-dir",
                str(ckpt),
            ],
            env=env,
            cwd=EXAMPLES,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    return timed(procs, start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one round of one epoch (CI)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.epochs = 1, 1

    # As a wheel's install leaves it: cloudtrain's modules compiled once (torch was, by pip).
    # A checkout run with PYTHONDONTWRITEBYTECODE has no bytecode for them, and every CLI,
    # node command, agent and worker would compile them from source.
    compileall.compile_dir(REPO / "cloudtrain", quiet=1)
    with tempfile.TemporaryDirectory(prefix="cloudtrain-bench-") as tmp:
        env = {**os.environ, "CLOUDTRAIN_HOME": str(Path(tmp) / "home")}
        cli = [sys.executable, "-m", "cloudtrain.cli"]
        subprocess.run(
            [*cli, "up", "--name", "bench", "--nodes", "2"],
            env=env,
            check=True,
            capture_output=True,
        )
        runs: dict[str, Callable[[dict[str, str], int, Path], tuple[float, float, str]]] = {
            "torchrun": run_torchrun,
            "spawn": lambda e, n, c: run_cloudtrain(e, n, c, "spawn"),
            "fork": lambda e, n, c: run_cloudtrain(e, n, c, "fork"),
            "floor": run_floor,
        }
        names = list(runs)
        results: dict[str, list[tuple[float, float]]] = {who: [] for who in names}
        try:
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for who in order:
                    ckpt = Path(tmp) / f"ckpt-{who}-{r}"
                    first, wall, _ = runs[who](env, args.epochs, ckpt)
                    results[who].append((first, wall))
                    print(
                        f"round {r + 1} {who:>8}: first step {first:5.2f} s, wall {wall:5.2f} s",
                        flush=True,
                    )
        finally:
            subprocess.run([*cli, "down", "bench"], env=env, check=True, capture_output=True)

    med = {
        who: (
            statistics.median(f for f, _ in rs),
            statistics.median(w - f for f, w in rs),
            statistics.median(w for _, w in rs),
        )
        for who, rs in results.items()
    }
    print()
    print(f"medians over {args.rounds} rounds, 2 local nodes x 1 process, {args.epochs} epochs "
          "(ratio: to bare torchrun):")  # fmt: skip
    print(f"  {'':>26} " + " ".join(f"{who:>8} {'ratio':>5}" for who in names))
    rows = ("time to first step (s)", "steady, after it (s)", "wall time (s)")
    for i, label in enumerate(rows):
        base = med["torchrun"][i]
        cells = " ".join(f"{med[who][i]:8.2f} {med[who][i] / base:5.2f}" for who in names)
        print(f"  {label:>26} {cells}")
    # Paired: each round's ratio to that round's torchrun, then their median (a round on a
    # busier machine moves both sides).
    base_runs = results["torchrun"]
    paired = {
        who: statistics.median(f / t for (f, _), (t, _) in zip(rs, base_runs, strict=True))
        for who, rs in results.items()
    }
    cells = " ".join(f"{'':>8} {paired[who]:5.2f}" for who in names)
    print(f"  {'first step, round by round':>26} {cells}")


if __name__ == "__main__":
    main()
