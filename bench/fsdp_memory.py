"""Does FSDP hold less memory per rank than DDP on CPU? `examples/digits_fsdp.py`, both ways.

    python bench/fsdp_memory.py [--ranks 2] [--epochs 2]

Runs the example under ``torchrun --standalone --nproc-per-node RANKS`` three times in this run:
``--strategy ddp``, ``--strategy fsdp``, and fsdp again with ``MALLOC_MMAP_THRESHOLD_`` set to
glibc's ceiling of 32 MiB (`runtime.wrap` then leaves the threshold alone: about how FSDP ran
before it pinned it, `cloudtrain.runtime.parallel`), each with a budget large enough for all,
and reads what each rank prints at its end: the training state it held at most (parameters,
gradients and Adam's moments, counted from the tensors it holds) and its peak resident memory
(``ru_maxrss``: what the OS saw, torch, the data and the allocator's kept memory included),
also as the rise over what it held before the model. Prints per run the largest over its ranks,
and each fsdp run's ratio to DDP's (< 1.0: FSDP holds less). The memory figures repeat from
run to run; the seconds follow the machine's load, and are printed as a note only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits_fsdp.py"
LINE = re.compile(
    r"rank (\d+)/\d+: held at most ([\d.]+) MB .*max RSS (\d+) MiB \(\+(\d+) over the (\d+) "
    r"before the model\); ([\d.]+) s training"
)


@dataclass
class Figures:
    held_mb: float  # the training state a rank held at most
    rss_mib: int  # its peak resident memory
    rise_mib: int  # that, over what it held before the model
    seconds: float


def run(strategy: str, ranks: int, epochs: int, env: dict[str, str]) -> Figures:
    """The example under `strategy` on `ranks` ranks, with `env` added to the environment; the
    largest figures over its ranks."""
    with tempfile.TemporaryDirectory(prefix="fsdp-memory-") as folder:
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(EXAMPLE),
            "--strategy",
            strategy,
            "--budget-mb",
            "100000",
            "--epochs",
            str(epochs),
            "--checkpoint-dir",
            folder,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"{strategy} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    found = [LINE.search(line) for line in done.stdout.splitlines()]
    rows = [m for m in found if m]
    if len(rows) != ranks:
        sys.exit(f"{strategy}: expected {ranks} rank lines, got:\n{done.stdout}")
    return Figures(
        held_mb=max(float(m[2]) for m in rows),
        rss_mib=max(int(m[3]) for m in rows),
        rise_mib=max(int(m[4]) for m in rows),
        seconds=max(float(m[6]) for m in rows),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    ceiling = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
    runs = {
        "ddp": run("ddp", args.ranks, args.epochs, {}),
        "fsdp": run("fsdp", args.ranks, args.epochs, {}),
        "fsdp@32M": run("fsdp", args.ranks, args.epochs, ceiling),
    }
    print(
        f"examples/digits_fsdp.py, {args.ranks} ranks x {args.epochs} epochs, per rank (the "
        "largest over the ranks); fsdp@32M: MALLOC_MMAP_THRESHOLD_=32 MiB (as before the pin)"
    )
    print(
        f"{'':30}" + "".join(f"{name:>10}" for name in runs) + f"{'fsdp/ddp':>10}{'@32M/ddp':>10}"
    )
    rows = [
        ("training state held (MB)", "held_mb"),
        ("peak RSS (MiB)", "rss_mib"),
        ("peak RSS over the start (MiB)", "rise_mib"),
    ]
    for label, field in rows:
        values = [float(getattr(f, field)) for f in runs.values()]
        cells = "".join(f"{v:10.1f}" for v in values)
        print(f"{label:>30}{cells}{values[1] / values[0]:10.3f}{values[2] / values[0]:10.3f}")
    took = ", ".join(f"{name} {f.seconds:.1f} s" for name, f in runs.items())
    print(f"(training took {took}, at this machine's load at the time)")


if __name__ == "__main__":
    main()
