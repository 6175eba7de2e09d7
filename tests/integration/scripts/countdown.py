"""Counts down for a few seconds, then exits 0: a job that outlives a killed CLI."""

import os
import time

rank = os.environ["RANK"]
for i in range(6, 0, -1):
    print(f"rank {rank}: {i}", flush=True)
    time.sleep(0.5)
print(f"rank {rank}: done", flush=True)
