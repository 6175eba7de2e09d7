"""Prints its rank and then waits, for tests of detach, logs -f, cancel and Ctrl-C."""

import os
import time

print(f"sleeper rank {os.environ['RANK']} node {os.environ['CLOUDTRAIN_NODE_RANK']}", flush=True)
for i in range(600):
    print(f"tick {i}", flush=True)
    time.sleep(0.5)
