"""Reports a step and prints a line, then waits until that report is in the home's copy of the
job's metrics and prints how long it took: the progress panel draws from that copy, so this
is how far it trails the log. The first report is made quietly and waited for, so that the
steps after it start a second after a heartbeat brought it home (the next is seconds away)."""

import json
import os
import time
from pathlib import Path

from cloudtrain import runtime
from cloudtrain.jobs import metrics

COPY = metrics.copy_path(Path(os.environ["CLOUDTRAIN_HOME"]), os.environ["CLOUDTRAIN_JOB_ID"], 0, 0)


def home(step: int) -> bool:
    try:
        lines = COPY.read_text().splitlines()
    except OSError:
        return False
    return any(json.loads(line).get("step") == step for line in lines if line.strip())


def wait_home(step: int) -> float:
    began = time.monotonic()
    deadline = began + 120
    while not home(step) and time.monotonic() < deadline:
        time.sleep(0.05)
    return time.monotonic() - began


runtime.report(step=0, total_steps=3)  # no line printed: it comes home with a heartbeat
wait_home(0)
for step in (1, 2, 3):
    time.sleep(1)  # past the pull that brought the last one (it reads until nothing is new)
    runtime.report(  # a line of metrics wider than 72 columns
        step,
        loss=1.0 / step,
        train_accuracy_running_mean=0.5,
        validation_accuracy_running_mean=0.25,
        samples_per_second_all_ranks=1234.0,
    )
    print(f"step {step} reported", flush=True)
    print(f"step {step} home after {wait_home(step):.2f} s", flush=True)
