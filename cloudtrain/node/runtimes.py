"""The framework a job's runtime needs on this node: installed on a cloud node, checked on a
machine of the user's (ssh, local), before every TensorFlow or Horovod job. Stdlib only::

    python -m cloudtrain.node runtime tensorflow|horovod --root ROOT

A cloud node's bootstrap config (``CT_INSTALL=1``) lets it install into the node's venv, once:
later jobs find the framework importable and go on at once. A machine of the user's is only
checked (cloudtrain never changes an environment it did not make); the error names what to
install. The config is ``<root>/bootstrap/bootstrap.env`` (ssh, local) or
``/etc/cloudtrain/bootstrap.env`` (cloud); with neither, the node is the user's.

=============  ===================================================================================
tensorflow     ``tensorflow`` (no GPU: tf-keras requires it, and ``tensorflow-cpu`` beside it
               would share its folder) or ``tensorflow[and-cuda]`` at `TF_VERSION`, with
               ``tf-keras`` of the same version: the Keras 2 that MultiWorkerMirroredStrategy works
               with (TF's own Keras 3 breaks it: tensorflow#72388, keras#20585); jobs get
               ``TF_USE_LEGACY_KERAS=1``. On GPU nodes TensorFlow must see every GPU; when it
               does not, the CUDA it was built for is checked against the driver's
               (`gpus_missing`).
horovod        built once per node for the node's torch (`cloudtrain.node.horovod`: 0.28.1 with the
               two fixes it needs for torch >= 2.1), the wheel cached in ``<root>/cache/wheels``
=============  ===================================================================================
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TF_VERSION", "driver_cuda", "gpus_missing", "main", "tensorflow_packages"]

TF_VERSION = "2.21.0"
CONFIGS = ("bootstrap/bootstrap.env", "/etc/cloudtrain/bootstrap.env")
TF_PROBE = (
    "import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'"
    "; import tensorflow as tf, tf_keras"
    "; print(tf.__version__, len(tf.config.list_physical_devices('GPU')),"
    " tf.sysconfig.get_build_info().get('cuda_version') or '-')"
)
_DRIVER_CUDA = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")
HOROVOD_PROBE = "import horovod.torch as hvd; import horovod; print(horovod.__version__)"


def tensorflow_packages(gpus: int, version: str = TF_VERSION) -> list[str]:
    """What pip installs for the tensorflow runtime on a node with `gpus` GPUs."""
    tf = f"tensorflow[and-cuda]=={version}" if gpus else f"tensorflow=={version}"
    return [tf, f"tf-keras=={version}"]


def _config(root: Path) -> dict[str, str]:
    for name in CONFIGS:
        path = root / name  # an absolute name stays itself
        try:
            text = path.read_text()
        except OSError:
            continue
        words = [w for line in text.splitlines() for w in shlex.split(line, comments=True)]
        return dict(w.split("=", 1) for w in words if "=" in w)
    return {}


def _probe(code: str) -> str | None:
    """What `code` printed in this node's Python; None when it failed."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def _say(message: str) -> None:
    print(f"cloudtrain runtime: {message}", flush=True)


def _pip(args: Sequence[str]) -> None:
    _say("+ pip install " + shlex.join(args))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", *args], check=True)


def tensorflow(install: bool, gpus: int) -> str:
    """TensorFlow with tf-keras importable (installed when `install`), seeing `gpus` GPUs;
    what was found, or `RuntimeError` saying what is wrong."""
    found = _probe(TF_PROBE)
    packages = tensorflow_packages(gpus)
    if found is None and install:
        _pip(packages)
        found = _probe(TF_PROBE)
    if found is None:
        raise RuntimeError(
            f"TensorFlow with tf-keras is not importable by {sys.executable}: install it there "
            f"({shlex.join(['pip', 'install', *packages])}); cloud nodes install it themselves"
        )
    version, seen, built = found.split()
    if int(seen) < gpus:
        raise RuntimeError(gpus_missing(version, int(seen), gpus, built, driver_cuda()))
    return f"TensorFlow {version} with tf-keras" + (f", {seen} GPU(s)" if gpus else "")


def driver_cuda() -> tuple[int, int] | None:
    """The newest CUDA the node's NVIDIA driver supports (``nvidia-smi``'s header), or None."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _DRIVER_CUDA.search(out)
    return (int(found.group(1)), int(found.group(2))) if found else None


def gpus_missing(
    version: str, seen: int, gpus: int, built: str, driver: tuple[int, int] | None
) -> str:
    """Why TensorFlow `version`, built for CUDA `built` ("-": not a CUDA build), sees `seen`
    of the node's `gpus` GPUs, given the CUDA the driver supports: what to do about it."""
    head = f"TensorFlow {version} sees {seen} of the node's {gpus} GPU(s)"
    if built == "-":
        return f"{head}: it is not a CUDA build (install tensorflow[and-cuda]=={version})"
    needed = tuple(int(part) for part in built.split(".")[:2])
    if driver is None:
        return f"{head}: nvidia-smi does not answer, so the NVIDIA driver is not working"
    supports = f"{driver[0]}.{driver[1]}"
    if driver < needed:
        return (
            f"{head}: it is built for CUDA {built} and the NVIDIA driver supports CUDA "
            f"{supports} at most: a newer driver (or a TensorFlow built for CUDA {supports})"
        )
    return (
        f"{head}, built for CUDA {built} with a driver for CUDA {supports}: its CUDA "
        f"libraries do not load (pip install tensorflow[and-cuda]=={version} installs them)"
    )


def horovod(install: bool, root: Path) -> str:
    found = _probe(HOROVOD_PROBE)
    if found is None and install:
        from cloudtrain.node import horovod as build

        wheel = build.build(sys.executable, root / "cache" / "wheels")
        _pip([str(wheel)])
        found = _probe(HOROVOD_PROBE)
    if found is None:
        raise RuntimeError(
            f"Horovod is not importable by {sys.executable}: build it there with "
            f"`{sys.executable} -m cloudtrain.node horovod build --cache DIR` and pip install "
            "the wheel it prints; cloud nodes build it themselves"
        )
    return f"Horovod {found}"


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cloudtrain.node runtime")
    parser.add_argument("runtime", choices=("tensorflow", "horovod"))
    parser.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    root = args.root.absolute()
    config = _config(root)
    install = config.get("CT_INSTALL") == "1"
    gpus = int(config.get("CT_GPU_COUNT") or 0)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    fd = os.open(root / "runtime.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two jobs at once install once
        try:
            if args.runtime == "tensorflow":
                found = tensorflow(install, gpus)
            else:
                found = horovod(install, root)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            print(f"cloudtrain runtime {args.runtime}: {exc}", file=sys.stderr)
            return 1
    finally:
        os.close(fd)
    _say(f"{found} ({time.monotonic() - started:.1f} s)")
    return 0
