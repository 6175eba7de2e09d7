"""What does a lost node cost? A managed job's recovery beside a restart by hand.

    python bench/recovery.py [--rounds 3] [--epochs 8] [--kill-after 3]

Each round trains `examples/digits_ddp.py` on two local nodes (a checkpoint per epoch, a
one-second pause after each so that the kill lands mid-job) and, once epoch `--kill-after` is
printed, kills node 1 the way a machine is lost (every process at once, its folder gone):

  (a) managed: `cloudtrain train --managed`; its watcher notices, replaces the node, restores
      the newest checkpoint and starts again, with no one at the keyboard;
  (b) by hand: a plain `cloudtrain train` fails; then, as fast as a script can, `cloudtrain up`
      completes the cluster and `cloudtrain train --resume-from JOB` starts from the newest
      checkpoint kept (a person takes longer: this is the peer's best case).

It prints medians of the time from the kill to the first optimizer step after it (the example
prints "cloudtrain: first step" once per start), the epochs done again (trained before the
kill, trained again after), and managed's ratio to the restart by hand.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cloudtrain.node import procs  # noqa: E402

EXAMPLE = REPO / "examples" / "digits_ddp.py"
MARK = "cloudtrain: first step"
EPOCH = re.compile(r"epoch (\d+)/\d+ ")


class Home:
    """`cloudtrain` as a user runs it, in a home of its own."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "CLOUDTRAIN_HOME": str(home),
                    "CLOUDTRAIN_CHECKPOINT_PULL_S": "1"}  # fmt: skip

    def run(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "cloudtrain.cli", *args], env=self.env,
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"cloudtrain {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout + done.stderr

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "cloudtrain.cli", *args], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip

    def kill_node(self, cluster: str, index: int) -> float:
        root = self.home / "local" / cluster / f"node-{index}"
        killed = time.perf_counter()
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(root)}, grace_s=0)
        shutil.rmtree(root)
        return killed


def train_args(epochs: int) -> list[str]:
    return [str(EXAMPLE), "--", "--epochs", str(epochs), "--pause", "1"]


def until_epoch(proc: subprocess.Popen[str], epoch: int) -> list[str]:
    lines = []
    for line in proc.stdout or ():
        lines.append(line)
        found = EPOCH.search(line)
        if found and int(found.group(1)) >= epoch:
            return lines
    raise SystemExit("the job ended before the kill:\n" + "".join(lines[-40:]))


def after_kill(lines: list[str], killed: float, proc: subprocess.Popen[str]) -> float:
    """Read `proc` to its end; when the first step after the kill came (perf_counter)."""
    first = None
    for line in proc.stdout or ():
        lines.append(line)
        if MARK in line and first is None:
            first = time.perf_counter()
    proc.wait()
    if first is None:
        raise SystemExit("no step after the kill:\n" + "".join(lines[-40:]))
    return first - killed


def redone(before: list[str], after: list[str]) -> int:
    """Epochs trained before the kill and trained again after it."""
    done = {int(m.group(1)) for line in before if (m := EPOCH.search(line))}
    again = {int(m.group(1)) for line in after if (m := EPOCH.search(line))}
    return len(done & again)


def managed(sh: Home, epochs: int, kill_after: int) -> tuple[float, int]:
    sh.run("up", "--name", "bm", "--nodes", "2")
    proc = sh.popen("train", "-c", "bm", "--managed", *train_args(epochs))
    before = until_epoch(proc, kill_after)
    killed = sh.kill_node("bm", 1)
    after: list[str] = []
    seconds = after_kill(after, killed, proc)
    if proc.returncode != 0 or "final test accuracy" not in "".join(after):
        raise SystemExit("the managed job did not finish:\n" + "".join(after[-40:]))
    sh.run("down", "bm")
    return seconds, redone(before, after)


def by_hand(sh: Home, epochs: int, kill_after: int) -> tuple[float, int]:
    sh.run("up", "--name", "bh", "--nodes", "2")
    proc = sh.popen("train", "-c", "bh", *train_args(epochs))
    before = until_epoch(proc, kill_after)
    killed = sh.kill_node("bh", 1)
    tail = (proc.stdout.read() if proc.stdout else "").splitlines(keepends=True)
    if proc.wait() == 0:
        raise SystemExit("the plain job survived the kill")
    job = re.search(r"job (bh-\d+) failed", "".join(tail))
    if not job:
        raise SystemExit("no failed job:\n" + "".join(tail[-40:]))
    sh.run("up", "--name", "bh", "--nodes", "2")  # the missing node again
    again = sh.popen("train", "-c", "bh", "--resume-from", job.group(1), *train_args(epochs))
    after: list[str] = []
    seconds = after_kill(after, killed, again)
    if again.returncode != 0:
        raise SystemExit("the restarted job failed:\n" + "".join(after[-40:]))
    sh.run("down", "bh")
    return seconds, redone(before, after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--kill-after", type=int, default=3, metavar="EPOCH")
    parser.add_argument("--quick", action="store_true", help="one round of 5 epochs (CI)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.epochs, args.kill_after = 1, 5, 2
    results: dict[str, list[tuple[float, int]]] = {"managed": [], "by hand": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = [("managed", managed), ("by hand", by_hand)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                sh = Home(Path(tmp) / f"{name.replace(' ', '-')}-{r}")
                results[name].append(fn(sh, args.epochs, args.kill_after))
                print(f"round {r + 1} {name}: {results[name][-1][0]:.2f} s, "
                      f"{results[name][-1][1]} epoch(s) redone", flush=True)  # fmt: skip
    med = {k: statistics.median(s for s, _ in v) for k, v in results.items()}
    lost = {k: statistics.median(e for _, e in v) for k, v in results.items()}
    print(f"\nmedians over {args.rounds} round(s), 2 local nodes, node 1 killed after epoch "
          f"{args.kill_after} of {args.epochs}:")  # fmt: skip
    print(f"{'':34}{'managed':>9}{'by hand':>9}{'ratio':>7}")
    print(f"{'kill to first step after it (s)':>34}{med['managed']:9.2f}{med['by hand']:9.2f}"
          f"{med['managed'] / med['by hand']:7.2f}")  # fmt: skip
    print(f"{'epochs trained again':>34}{lost['managed']:9.0f}{lost['by hand']:9.0f}")


if __name__ == "__main__":
    main()
