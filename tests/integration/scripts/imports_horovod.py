"""A script for Horovod's own launcher: under torchrun it would be a world of one per worker."""

import horovod.torch as hvd  # type: ignore[import-not-found, unused-ignore]

hvd.init()
print(f"trained alone: rank {hvd.rank()} of {hvd.size()}", flush=True)
