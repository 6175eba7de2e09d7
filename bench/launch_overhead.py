"""What does cloudtrain add to torchrun? The example's 2-node training, both ways, alternately.

    python bench/launch_overhead.py [--rounds 5] [--epochs 5]

Each round runs `examples/digits_ddp.py` on two local nodes
  (a) through `cloudtrain train` on a cluster made once by `cloudtrain up` (a new CLI process
      each round: state, workdir sync, the node agent, detached agents, streamed logs), and
  (b) as bare torchrun: two agents with the c10d rendezvous on 127.0.0.1, started by hand,
in alternating order, each with a fresh checkpoint folder. It prints medians of the time to the
first optimizer step (the example prints "cloudtrain: first step") and of the wall time, and
cloudtrain's ratio to bare torchrun (≤ 1.0 means cloudtrain adds nothing measurable).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
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


def run_cloudtrain(env: dict[str, str], epochs: int, ckpt: Path) -> tuple[float, float, str]:
    argv = [
        sys.executable,
        "-m",
        "cloudtrain.cli",
        "train",
        "-c",
        "bench",
        str(EXAMPLES / "digits_ddp.py"),
        "--",
        "--epochs",
        str(epochs),
        "--checkpoint-dir",
        str(ckpt),
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
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

    with tempfile.TemporaryDirectory(prefix="cloudtrain-bench-") as tmp:
        env = {**os.environ, "CLOUDTRAIN_HOME": str(Path(tmp) / "home")}
        cli = [sys.executable, "-m", "cloudtrain.cli"]
        subprocess.run(
            [*cli, "up", "--name", "bench", "--nodes", "2"],
            env=env,
            check=True,
            capture_output=True,
        )
        results: dict[str, list[tuple[float, float]]] = {"cloudtrain": [], "torchrun": []}
        try:
            for r in range(args.rounds):
                order = ("cloudtrain", "torchrun") if r % 2 == 0 else ("torchrun", "cloudtrain")
                for who in order:
                    ckpt = Path(tmp) / f"ckpt-{who}-{r}"
                    run = run_cloudtrain if who == "cloudtrain" else run_torchrun
                    first, wall, _ = run(env, args.epochs, ckpt)
                    results[who].append((first, wall))
                    print(
                        f"round {r + 1} {who:>10}: first step {first:5.2f} s, wall {wall:5.2f} s",
                        flush=True,
                    )
        finally:
            subprocess.run([*cli, "down", "bench"], env=env, check=True, capture_output=True)

    med = {
        who: (statistics.median(f for f, _ in rs), statistics.median(w for _, w in rs))
        for who, rs in results.items()
    }
    (ct_first, ct_wall), (tr_first, tr_wall) = med["cloudtrain"], med["torchrun"]
    print()
    print(f"medians over {args.rounds} rounds, 2 local nodes x 1 process, {args.epochs} epochs:")
    print(f"  {'':>22} {'cloudtrain':>11} {'torchrun':>9} {'ratio':>6}")
    print(
        f"  {'time to first step (s)':>22} {ct_first:11.2f} {tr_first:9.2f} "
        f"{ct_first / tr_first:6.2f}"
    )
    print(f"  {'wall time (s)':>22} {ct_wall:11.2f} {tr_wall:9.2f} {ct_wall / tr_wall:6.2f}")


if __name__ == "__main__":
    main()
