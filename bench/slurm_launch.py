"""From nothing to the first step on a real Slurm: cloudtrain against a hand-written sbatch script.

    python bench/slurm_launch.py [--rounds 3]

Starts the test suite's Slurm lab (tests/slurmlab.py: slurmctld and two slurmd's on this
machine, Debian's 22.05) and, each round, in an order that alternates:
  (a) by hand: ``sbatch`` of a script whose ``srun`` starts ``torchrun`` on both nodes (c10d
      rendezvous on the first) with `examples/digits_ddp.py`; from the submission to the first
      optimizer step (the example prints "cloudtrain: first step"), read from its output file;
      then a second ``sbatch`` of the same, timed the same way (a second job queues again);
  (b) cloudtrain: ``cloudtrain up --provider slurm --nodes 2`` then ``cloudtrain train`` of the
      same script, from the start of `up` to the first step; then a second ``train`` on the same
      allocation (no queueing; a warm agent forks its workers), then ``down`` (not timed).
It prints the medians and each one's ratio to its hand-written peer: the issue's aims are
≤ 1.1× for the first job and ≤ 0.5× for the second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launched import ARGS, EXAMPLE, MARK, cloudtrain  # noqa: E402

from tests.slurmlab import ENDED, SlurmLab, lab  # noqa: E402
from tests.sshd import free_port  # noqa: E402


def by_hand(slurm: SlurmLab, folder: Path, name: str) -> float:
    """Seconds from ``sbatch`` to the first step of the hand-written job (waited to its end;
    a checkpoint folder of its own, so that it trains rather than resumes)."""
    out = folder / f"{name}.out"
    port = free_port("127.0.0.1")
    script = folder / f"{name}.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --nodes=2 --ntasks-per-node=1 --exclusive --output={out}\n"
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        f"srun {sys.executable} -m torch.distributed.run --nnodes=2 --nproc-per-node=1 "
        f"--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port} --rdzv-id={name} "
        f"{EXAMPLE} {' '.join(ARGS)} --checkpoint-dir {folder / name}-checkpoints\n"
    )
    start = time.perf_counter()
    job = slurm.submit(str(script))
    first = None
    while (state := slurm.job_state(job)) not in ENDED:
        if first is None and out.exists() and MARK in out.read_text(errors="replace"):
            first = time.perf_counter() - start
        if time.perf_counter() - start > 300:
            raise SystemExit(f"the hand-written job {job} did not end in 300 s")
        time.sleep(0.1)
    if state != "COMPLETED" or first is None:
        raise SystemExit(f"the hand-written job ended {state}:\n{out.read_text()}")
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"hand 1st": [], "hand 2nd": [], "ct 1st": [], "ct 2nd": []}
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as tmp, lab(Path(tmp) / "lab") as slurm:
        for r in range(args.rounds):
            folder = Path(tmp) / f"round-{r}"
            folder.mkdir()
            for side in ("hand", "ct") if r % 2 == 0 else ("ct", "hand"):
                if side == "hand":
                    firsts = (
                        by_hand(slurm, folder, f"hand{r}a"),
                        by_hand(slurm, folder, f"hand{r}b"),
                    )
                else:
                    firsts = cloudtrain("slurm", slurm.env, folder / "home", f"ct{r}")
                times[f"{side} 1st"].append(firsts[0])
                times[f"{side} 2nd"].append(firsts[1])
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedians of {args.rounds} rounds, submission or `up` to the first step:")
    print(f"  first job:  by hand {med['hand 1st']:.1f} s, cloudtrain {med['ct 1st']:.1f} s: "
          f"{med['ct 1st'] / med['hand 1st']:.2f}x")  # fmt: skip
    print(f"  second job: by hand {med['hand 2nd']:.1f} s, cloudtrain {med['ct 2nd']:.1f} s: "
          f"{med['ct 2nd'] / med['hand 2nd']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
