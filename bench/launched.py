"""The cloudtrain side of the launch benches (`slurm_launch`, `k8s_launch`): `up` of two nodes,
then a `train` of the digits example timed to its first step, twice, then `down`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits_ddp.py"
MARK = "cloudtrain: first step"
ARGS = ["--epochs", "1"]


def cloudtrain(provider: str, env: Mapping[str, str], home: Path, name: str) -> tuple[float, float]:
    """Seconds from `up --provider PROVIDER --nodes 2` to the first step of a `train`, and of a
    second `train` on the same cluster (`env`: what reaches the provider); then `down`."""
    full = {**os.environ, **env, "CLOUDTRAIN_HOME": str(home)}
    cli = [sys.executable, "-m", "cloudtrain.cli"]

    def train() -> float:
        start = time.perf_counter()
        argv = [*cli, "train", "-c", name, str(EXAMPLE), "--", *ARGS]
        proc = subprocess.Popen(
            argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        first = None
        for line in proc.stdout or ():
            if first is None and MARK in line:
                first = time.perf_counter() - start
        if proc.wait() != 0 or first is None:
            raise SystemExit(f"cloudtrain train failed ({proc.returncode})")
        return first

    start = time.perf_counter()
    subprocess.run([*cli, "up", "--provider", provider, "--nodes", "2", "--name", name],
                   env=full, check=True, capture_output=True)  # fmt: skip
    up = time.perf_counter() - start
    try:
        return up + train(), train()
    finally:
        subprocess.run([*cli, "down", name], env=full, check=True, capture_output=True)
