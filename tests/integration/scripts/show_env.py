"""Prints the Horovod rendezvous timeout its environment holds (rank 0)."""

import os

if os.environ.get("HOROVOD_RANK", os.environ.get("RANK")) == "0":
    print("HOROVOD_GLOO_TIMEOUT_SECONDS=" + os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"], flush=True)
