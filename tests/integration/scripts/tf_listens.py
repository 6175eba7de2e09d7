"""Every worker joins MultiWorkerMirroredStrategy (its gRPC server listening), says so, and
stays until cancelled: the time to look at what the job listens on."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print(f"joined {int(total)}", flush=True)  # every worker's server is up and was reached
time.sleep(600)
