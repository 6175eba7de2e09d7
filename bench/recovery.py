"""What does a lost node cost? A managed job's recovery from each kind of loss, beside a restart by
hand.

    python bench/recovery.py [--rounds 3] [--epochs 8] [--kill-after 3] [--case NAME]...

Each round trains `examples/digits_ddp.py` on two local nodes (a checkpoint per epoch, a
one-second pause after each so that the kill lands mid-job) at the defaults (no faster copy of
checkpoints home) and, once epoch `--kill-after` is printed, breaks it one way:

  worker lost     node 1 is lost the way a machine is (every process at once, its folder gone);
  head lost       node 0, the rendezvous host, is lost;
  rank killed     node 1's training process alone is SIGKILLed (as the OOM killer does);
  all lost        both nodes are lost at once: only the checkpoints at home are left;
  lost again      node 1 is lost, and its replacement is lost too while it boots;
  by hand         node 1 is lost under a plain `cloudtrain train`, which fails; then, as fast as
                  a script can, `cloudtrain up` completes the cluster and `cloudtrain train
                  --resume-from JOB` starts from the newest checkpoint kept (a person takes
                  longer: this is the peer's best case).

Every case but the last runs `cloudtrain train --managed`, whose watcher notices, replaces
what was lost, restores the newest checkpoint and starts again, with no one at the keyboard.
It prints, per case, medians of the time from the kill to the first optimizer step after it
(the example prints "cloudtrain: first step" once per start) and of the epochs trained again
(trained before the kill, trained again after) against the checkpoint interval (one epoch).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
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
        self.env = {**os.environ, "CLOUDTRAIN_HOME": str(home)}

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

    def root(self, cluster: str, index: int) -> Path:
        return self.home / "local" / cluster / f"node-{index}"

    def kill_node(self, cluster: str, index: int) -> float:
        root = self.root(cluster, index)
        killed = time.perf_counter()
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(root)}, grace_s=0)
        shutil.rmtree(root, ignore_errors=True)
        return killed

    def kill_rank(self, cluster: str, index: int) -> float:
        """SIGKILL the node's training processes alone: the node's processes that have no
        child among them and are not its agent (a forked worker's command line is its
        agent's, so the tree tells them apart)."""
        mine = set(procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(self.root(cluster, index))}))
        parents = {pid: _parent(pid) for pid in mine}
        ranks = [pid for pid in mine if pid not in parents.values()
                 and b"cloudtrain.node" not in _cmdline(pid)]  # fmt: skip
        if not ranks:
            raise SystemExit(f"no training process on node {index}")
        killed = time.perf_counter()
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        return killed

    def kill_replacement(self, cluster: str, index: int, timeout: float = 120.0) -> None:
        """Wait until node `index` is being made again (a process of it runs), then lose it."""
        root, deadline = self.root(cluster, index), time.monotonic() + timeout
        while not procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(root)}):
            if time.monotonic() > deadline:
                raise SystemExit(f"no replacement of node {index} within {timeout:.0f} s")
            time.sleep(0.05)
        self.kill_node(cluster, index)


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


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


TIMELINE = False  # --timeline: print each line after the kill with its time since the kill


def after_kill(lines: list[str], killed: float, proc: subprocess.Popen[str]) -> float:
    """Read `proc` to its end; when the first step after the kill came (perf_counter)."""
    first = None
    for line in proc.stdout or ():
        lines.append(line)
        if TIMELINE and first is None:
            print(f"  {time.perf_counter() - killed:6.2f}  {line.rstrip()[:150]}", flush=True)
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


def break_job(sh: Home, case: str) -> float:
    """Break cluster bm's job the way `case` says; when (perf_counter)."""
    if case == "worker lost":
        return sh.kill_node("bm", 1)
    if case == "head lost":
        return sh.kill_node("bm", 0)
    if case == "rank killed":
        return sh.kill_rank("bm", 1)
    if case == "all lost":
        killed = sh.kill_node("bm", 0)
        sh.kill_node("bm", 1)
        return killed
    if case == "lost again":
        killed = sh.kill_node("bm", 1)
        sh.kill_replacement("bm", 1)
        return killed
    raise ValueError(case)


def managed(sh: Home, epochs: int, kill_after: int, case: str) -> tuple[float, int]:
    sh.run("up", "--name", "bm", "--nodes", "2")
    proc = sh.popen("train", "-c", "bm", "--managed", *train_args(epochs))
    before = until_epoch(proc, kill_after)
    killed = break_job(sh, case)
    after: list[str] = []
    seconds = after_kill(after, killed, proc)
    if proc.returncode != 0 or "final test accuracy" not in "".join(after):
        raise SystemExit(f"{case}: the managed job did not finish:\n" + "".join(after[-40:]))
    sh.run("down", "bm")
    return seconds, redone(before, after)


def by_hand(sh: Home, epochs: int, kill_after: int, case: str = "by hand") -> tuple[float, int]:
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


CASES = ("worker lost", "head lost", "rank killed", "all lost", "lost again", "by hand")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--kill-after", type=int, default=3, metavar="EPOCH")
    parser.add_argument("--case", action="append", choices=CASES, help="default: every case")
    parser.add_argument("--quick", action="store_true", help="one round of 5 epochs (CI)")
    parser.add_argument(
        "--timeline", action="store_true", help="print the lines after a kill with their times"
    )
    args = parser.parse_args()
    global TIMELINE
    TIMELINE = args.timeline
    if args.quick:
        args.rounds, args.epochs, args.kill_after = 1, 5, 2
    cases = args.case or list(CASES)
    results: dict[str, list[tuple[float, int]]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for case in cases if r % 2 == 0 else cases[::-1]:
                sh = Home(Path(tmp) / f"{case.replace(' ', '-')}-{r}")
                fn = by_hand if case == "by hand" else managed
                results[case].append(fn(sh, args.epochs, args.kill_after, case))
                print(f"round {r + 1} {case}: {results[case][-1][0]:.2f} s, "
                      f"{results[case][-1][1]} epoch(s) redone", flush=True)  # fmt: skip
    print(f"\nmedians over {args.rounds} round(s), 2 local nodes, broken after epoch "
          f"{args.kill_after} of {args.epochs}, a checkpoint every epoch:")  # fmt: skip
    print(f"{'':14}{'kill to first step (s)':>24}{'epochs trained again':>22}")
    for case, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        epochs = statistics.median(e for _, e in runs)
        print(f"{case:14}{seconds:24.2f}{epochs:22.0f}")
    if "worker lost" in results and "by hand" in results:
        ratio = (statistics.median(s for s, _ in results["worker lost"])
                 / statistics.median(s for s, _ in results["by hand"]))  # fmt: skip
        print(f"managed recovery of a lost worker / a restart by hand: {ratio:.2f}")


if __name__ == "__main__":
    main()
