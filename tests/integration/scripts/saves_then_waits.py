"""Prints, writes one checkpoint file, then waits: a job that a cluster's own stop ends."""

import os
import time
from pathlib import Path

print(f"saver rank {os.environ['RANK']} started", flush=True)
folder = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]) / "step-1"
folder.mkdir(parents=True, exist_ok=True)
(folder / "model.txt").write_text("weights at step 1\n")
print("saved step-1", flush=True)
time.sleep(600)
