"""Node 1 fails with exit code 3; node 0 would run for a long time (it must be stopped)."""

import os
import sys
import time

node = os.environ["CLOUDTRAIN_NODE_RANK"]
print(f"started on node {node}", flush=True)
if node == "1":
    print("boom: node 1 gives up", flush=True)
    sys.exit(3)
time.sleep(300)
