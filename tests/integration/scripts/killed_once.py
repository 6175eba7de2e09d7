"""Counts steps and checkpoints each one; on its first run, the rank on node `--rank` kills
itself (or, with `--agent`, its torchrun agent) with SIGKILL at step `--at`, as the kernel's
OOM killer would; with `--oom` it takes memory until the OOM killer kills it (run it in a cgroup
with a memory limit). The marker file `--marker` says it happened: the next attempt resumes
from the checkpoint and finishes.

    killed_once.py --marker PATH [--rank R] [--at STEP] [--steps N] [--agent | --oom]
"""

import argparse
import json
import os
import signal
import time
from pathlib import Path

from cloudtrain import runtime
from cloudtrain.runtime import progress

p = argparse.ArgumentParser()
p.add_argument("--marker", type=Path, required=True)
p.add_argument("--rank", type=int, default=1)
p.add_argument("--at", type=int, default=6)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--agent", action="store_true", help="kill the torchrun agent, not the rank")
p.add_argument("--oom", action="store_true", help="take memory until the OOM killer strikes")
args = p.parse_args()

rank = int(os.environ["RANK"])
# the node by its index: torchrun's global ranks follow the rendezvous' order, not the node's
node = int(os.environ.get("CLOUDTRAIN_NODE_RANK", rank))
folder = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
saved = folder / "state.json"
start = json.loads(saved.read_text())["step"] if saved.exists() else 0
progress.resume(start)
print(f"rank {rank}: resumed from step {start}", flush=True)
for step in range(start + 1, args.steps + 1):
    time.sleep(0.3)
    runtime.step()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # each node's copy, as the runtime writes
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.tmp").write_text(json.dumps({"step": step}))
        (folder / "state.tmp").replace(saved)
        progress.write()
    print(f"rank {rank}: step {step}/{args.steps}", flush=True)
    if node == args.rank and step == args.at and not args.marker.exists():
        args.marker.write_text(f"{os.getpid()}\n")
        if args.oom:
            print(f"rank {rank}: taking memory", flush=True)
            hog = []
            while True:  # each block written, so that it is resident
                hog.append(b"x" * (64 << 20))
        victim = os.getppid() if args.agent else os.getpid()
        print(f"rank {rank}: SIGKILL to pid {victim}", flush=True)
        os.kill(victim, signal.SIGKILL)
        time.sleep(60)  # the agent's kill leaves this rank running: it must be stopped
print(f"rank {rank}: done at step {args.steps}", flush=True)
