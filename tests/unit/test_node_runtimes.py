"""What a job's runtime needs on a node (`cloudtrain.node.runtimes`): the packages per node,
TensorFlow's GPU check against the driver (with a fake ``nvidia-smi`` on PATH), and the check of
a user's machine for real, in a Python that lacks the framework."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.node import runtimes

SMI_HEADER = (
    "+-----------------------------------------------------------------------------------------+\n"
    "| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |\n"
)


def test_a_gpu_node_gets_tensorflow_with_its_cuda_libraries() -> None:
    assert runtimes.tensorflow_packages(0) == ["tensorflow==2.21.0", "tf-keras==2.21.0"]
    assert runtimes.tensorflow_packages(8) == ["tensorflow[and-cuda]==2.21.0", "tf-keras==2.21.0"]


def test_the_drivers_cuda_is_read_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'END'\n{SMI_HEADER}END\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert runtimes.driver_cuda() == (12, 4)
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n")
    assert runtimes.driver_cuda() is None


def test_tensorflow_not_seeing_the_gpus_is_explained_by_its_cuda_and_the_drivers() -> None:
    old_driver = runtimes.gpus_missing("2.21.0", 0, 8, "12.5.1", (12, 4))
    assert old_driver == (
        "TensorFlow 2.21.0 sees 0 of the node's 8 GPU(s): it is built for CUDA 12.5.1 and the "
        "NVIDIA driver supports CUDA 12.4 at most: a newer driver (or a TensorFlow built for "
        "CUDA 12.4)"
    )
    assert "its CUDA libraries do not load (pip install tensorflow[and-cuda]==2.21.0" in (
        runtimes.gpus_missing("2.21.0", 0, 8, "12.5.1", (12, 8))
    )
    assert "not a CUDA build" in runtimes.gpus_missing("2.21.0", 0, 1, "-", (12, 8))
    assert "the NVIDIA driver is not working" in runtimes.gpus_missing("2.21.0", 0, 1, "12.5", None)


def test_a_users_machine_without_the_framework_gets_the_command_to_run(tmp_path: Path) -> None:
    """In a venv without TensorFlow or Horovod (and no bootstrap config: the user's machine,
    which cloudtrain never changes), each check fails with one line naming what to install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**os.environ, "PYTHONPATH": str(Path(runtimes.__file__).parents[2])}
    for runtime, expected in [
        ("tensorflow", "install it there (pip install tensorflow==2.21.0 tf-keras==2.21.0)"),
        ("horovod", "-m cloudtrain.node horovod build --cache DIR` and pip install the wheel"),
    ]:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "cloudtrain.node", "runtime", runtime,
             "--root", str(tmp_path / "root")],
            capture_output=True, text=True, env=env, check=False, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"cloudtrain runtime {runtime}: ")
        assert expected in done.stderr
