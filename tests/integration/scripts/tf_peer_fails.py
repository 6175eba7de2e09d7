"""Worker 1 fails before it joins, once worker 0 (given the time to import TensorFlow) built
MultiWorkerMirroredStrategy and waits for it: TensorFlow would wait for a long time, and ignores
SIGTERM there, so it must be stopped."""

import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print(f"worker {index} started", flush=True)
if index == 1:
    time.sleep(float(os.environ.get("PEER_FAILS_AFTER_S", "20")))
    print("boom: worker 1 gives up", flush=True)
    sys.exit(3)

import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("worker 0 waits for its peer", flush=True)
strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print("worker 0 should never get here", flush=True)
