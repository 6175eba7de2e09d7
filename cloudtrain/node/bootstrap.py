"""The bootstrap's phases that run in the node's Python: torch, the NCCL settings, the check.

``templates/bootstrap.sh`` runs every phase of a node's bootstrap, keeps the phase records, writes
the status file and holds the lock: it is their one writer. Once its ``python`` and
``cloudtrain`` phases made the node's Python and installed cloudtrain in it, it runs each of
these phases as::

    python -m cloudtrain.node.bootstrap phase NAME CONFIG SKIP_FILE

in a process whose output is the phase's log: its exit code is the phase's, a reason written to
``SKIP_FILE`` says it was skipped, and SIGTERM (the script's own signal, passed on) kills what it
runs and exits 143. The phases, each idempotent:

=========  ====================================================================================
torch      ``pip install CT_TORCH_VERSION --index-url CT_TORCH_INDEX`` unless the installed
           torch matches the pin and the index's CUDA (one of another CUDA is replaced).
           Check-only (``CT_INSTALL=0``): torch is installed (a mismatch is a warning)
nccl       ``<root>/nccl.env`` (``KEY='value'`` lines every job on the node gets): the socket
           interface, EFA's settings (no GPUDirect RDMA on Volta), the fabric's; CPU: skipped
verify     in the node's Python, not here: torch sees the GPUs and has kernels for them, then an
           NCCL all_reduce across them under ``torch.distributed.run``; CPU: a gloo all_reduce
           by a rank forked from the node's warm server (`cloudtrain.jobs.warm`), started here
=========  ====================================================================================

The agent stays stdlib-only: torch is imported only by `cloudtrain.node.verify`, which the
verify phase runs in the node's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

ALL_PHASES = ("base", "nvidia-driver", "python", "cloudtrain", "torch", "nccl", "verify")
MODULE = "cloudtrain.node.bootstrap"
#: The verify phase's probes, run in the node's Python (which has torch).
VERIFY = "cloudtrain.node.verify"
#: A CPU node's check runs as a rank forked from the node's warm server, which it starts.
WARM = "cloudtrain.jobs.warm"
#: The check's one-node launch, its stores and transport on loopback alone (cloudtrain's
#: rendezvous, `cloudtrain.jobs.rendezvous`: torch's ``--standalone`` listens on every
#: interface, with no authentication).
LOOPBACK = (
    "--nnodes", "1", "--rdzv-backend", "cloudtrain", "--rdzv-endpoint", "127.0.0.1:0",
    "--rdzv-id", "verify", "--rdzv-conf", "is_host=1", "--local-addr", "127.0.0.1",
)  # fmt: skip
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
VERIFY_TIMEOUT_S = 300
#: The installed torch's version and CUDA, read from its ``version.py`` without importing torch
#: (seconds of CPU on every node at every `up`; the verify phase imports it once).
TORCH_PROBE = (
    "import importlib.util, os, runpy; spec = importlib.util.find_spec('torch'); "
    "info = runpy.run_path(os.path.join(spec.submodule_search_locations[0], 'version.py')); "
    "print(info['__version__'], info['cuda'])"
)
EXIT_CONFIG = 78
SIGNAL_EXITS = {signal.SIGHUP: 129, signal.SIGINT: 130, signal.SIGTERM: 143}


class PhaseEnd(Exception):
    """Ends a phase early: skipped (``code`` 0) or failed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Interrupted(BaseException):
    """A signal arrived; `code` is the exit code it stands for."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def skip(reason: str) -> PhaseEnd:
    return PhaseEnd(0, reason)


def fail(message: str, code: int = 1) -> PhaseEnd:
    return PhaseEnd(code, message)


@dataclass(frozen=True)
class Config:
    """The keys of the config file (see ``bootstrap.sh``'s header) the phases read, with their
    defaults."""

    values: dict[str, str]

    @classmethod
    def load(cls, path: Path) -> Config:
        """Read ``KEY=VALUE`` lines, values shell-quoted. Raises `ValueError` on a bad line."""
        values: dict[str, str] = {}
        for line in path.read_text().splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if len(words) != 1 or "=" not in words[0]:
                raise ValueError(f"{path}: not KEY=VALUE: {line!r}")
            key, value = words[0].split("=", 1)
            values[key] = value
        root = values.get("CT_ROOT", "")
        if not root.startswith("/"):
            raise ValueError(f"CT_ROOT must be an absolute path, not {root!r}")
        defaults = {
            "CT_INSTALL": "1",
            "CT_PYTHON": "python3",
            "CT_VENV": f"{root}/venv",
            "CT_GPU_COUNT": "0",
            "CT_EFA": "0",
        }
        for key, value in defaults.items():
            values[key] = values.get(key) or value
        return cls(values)

    def __getitem__(self, key: str) -> str:
        return self.values.get(key, "")

    @property
    def root(self) -> Path:
        return Path(self["CT_ROOT"])

    @property
    def install(self) -> bool:
        return self["CT_INSTALL"] == "1"

    @property
    def gpus(self) -> int:
        return int(self["CT_GPU_COUNT"])

    @property
    def python(self) -> str:
        """The node's interpreter: the venv's, or CT_PYTHON in check-only mode."""
        return f"{self['CT_VENV']}/bin/python" if self.install else self["CT_PYTHON"]


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def say(message: str, stream: TextIO | None = None) -> None:
    print(f"cloudtrain-bootstrap: {message}", file=stream or sys.stdout, flush=True)


# --- the phases --------------------------------------------------------------------------------


class Phase:
    """What a running phase has: the config, its log, a way to run commands into the log."""

    def __init__(self, config: Config, log: TextIO) -> None:
        self.config = config
        self.log = log

    def echo(self, message: str) -> None:
        self.log.write(message + "\n")
        self.log.flush()

    def run(
        self, argv: Sequence[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> int:
        """Run `argv` (in `env`, else this process's) with its output in the log; its exit code
        (124 when it timed out)."""
        self.log.flush()
        try:
            return subprocess.run(
                argv,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
                env=env,
            ).returncode
        except subprocess.TimeoutExpired:
            self.echo(f"timed out after {timeout:.0f} s: {shlex.join(argv)}")
            return 124
        except OSError as exc:
            self.echo(f"cannot run {argv[0]}: {exc}")
            return 127

    def check(
        self, argv: Sequence[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> None:
        code = self.run(argv, timeout, env)
        if code != 0:
            raise fail(f"{shlex.join(argv)} exited {code}", code)

    def probe(self, code: str) -> str | None:
        """The last line `code` prints in the node's Python; None when it fails."""
        try:
            done = subprocess.run(
                [self.config.python, "-c", code],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except OSError as exc:
            self.echo(f"probe {code!r}: {exc}")
            return None
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            self.echo(f"probe {code!r}: {tail[0]}")
            return None
        lines = done.stdout.strip().splitlines()
        return lines[-1] if lines else ""


def torch_matches(info: str, requirement: str, index: str) -> bool:
    """The installed torch (``"VERSION CUDA"``) fits the pin and the CUDA of the index."""
    version, _, cuda = info.partition(" ")
    pinned = re.fullmatch(r"torch\s*==\s*([^,;\s]+)", requirement)
    if pinned:
        want = pinned.group(1)
        if "+" not in want:
            version = version.split("+")[0]
        if version != want:
            return False
    tag = index.rstrip("/").rsplit("/", 1)[-1]
    if tag == "cpu":
        return cuda == "None"
    cu = re.fullmatch(r"cu(\d{2})(\d+)", tag)
    return not cu or cuda == f"{int(cu.group(1))}.{cu.group(2)}"


def phase_torch(p: Phase) -> None:
    c = p.config
    py, req, index = c.python, c["CT_TORCH_VERSION"], c["CT_TORCH_INDEX"]
    info = p.probe(TORCH_PROBE)
    if not c.install:
        if not info:
            raise fail(f"torch is not installed for {py}")
        p.echo(f"torch {info.replace(' ', ', CUDA ', 1)}")
        if not torch_matches(info, req, index):
            p.echo(
                f"warning: not {req or 'the pinned torch'} from "
                f"{index or 'the expected index'} (check-only mode keeps it)"
            )
        return
    if info and torch_matches(info, req, index):
        p.echo(f"torch {info.replace(' ', ', CUDA ', 1)}: already installed")
        return
    if info:
        p.echo(f"replacing torch {info.replace(' ', ' (CUDA ', 1)})")
        p.check([py, "-m", "pip", "uninstall", "-y", "torch"])
    p.echo(f"+ pip install {req} --index-url {index}")
    p.check([py, "-m", "pip", "install", "--no-input", req, "--index-url", index])
    info = p.probe(TORCH_PROBE)
    if not info:
        raise fail("torch is not installed after pip install")
    if not torch_matches(info, req, index):
        got = info.replace(" ", " (CUDA ", 1)
        raise fail(f"pip installed torch {got}), not {req} from {index}")
    p.echo(f"torch {info.replace(' ', ', CUDA ', 1)}")


def _quote(value: str) -> str:
    """Single quotes, readable by sh and by Python's shlex."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def nccl_settings(config: Config) -> dict[str, str]:
    """The node's NCCL settings. Raises `PhaseEnd` for a bad CT_NCCL_ENV word."""
    settings: dict[str, str] = {}
    ifname = config["CT_NCCL_SOCKET_IFNAME"]
    if ifname:
        settings.update(NCCL_SOCKET_IFNAME=ifname, GLOO_SOCKET_IFNAME=ifname)
    if config["CT_EFA"] == "1":
        settings.update(FI_PROVIDER="efa", NCCL_PROTO="simple")
        # p3dn's EFA has no GPUDirect RDMA; libfabric refuses FI_EFA_USE_DEVICE_RDMA=1 there.
        if not config["CT_ACCELERATOR"].startswith("V100"):
            settings["FI_EFA_USE_DEVICE_RDMA"] = "1"
    for word in config["CT_NCCL_ENV"].split():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", word):
            raise fail(f"CT_NCCL_ENV: {word!r} is not KEY=value")
        key, value = word.split("=", 1)
        settings[key] = value
    return settings


def phase_nccl(p: Phase) -> None:
    out = p.config.root / "nccl.env"
    if p.config.gpus == 0:
        _write_atomic(out, "# cloudtrain: a CPU node; gloo needs no NCCL settings.\n")
        raise skip("CPU node: no NCCL settings")
    if p.config["CT_EFA"] == "1" and p.config["CT_ACCELERATOR"].startswith("V100"):
        p.echo("Volta EFA instance: no GPUDirect RDMA")
    if p.config["CT_EFA"] == "1" and not Path("/opt/amazon/efa").is_dir():
        p.echo("warning: no /opt/amazon/efa: NCCL needs the EFA software and aws-ofi-nccl for EFA")
    lines = ["# cloudtrain: NCCL settings of this node, KEY='value' (sh, or Python's shlex)."]
    lines += [f"{k}={_quote(v)}" for k, v in nccl_settings(p.config).items()]
    _write_atomic(out, "\n".join(lines) + "\n")
    p.echo(f"wrote {out}:\n" + "\n".join(lines))


def phase_verify(p: Phase) -> None:
    """CPU: the node's warm server, then a rank forked from it checks and all-reduces (alone in
    one process where ``CT_WARM=0`` or ``CLOUDTRAIN_WARM=0``). GPU: check, then one rank per
    GPU all-reduces.
    Skipped where another node verified this machine (``CT_VERIFIED_BY``)."""
    if p.config["CT_VERIFIED_BY"]:
        raise skip(f"this machine is verified by {p.config['CT_VERIFIED_BY']}")
    gpus, py = p.config.gpus, p.config.python
    if gpus == 0 and p.config["CT_WARM"] != "0" and _as_the_jobs_user(p.config.root):
        # The torch import a check pays is the one `up` readies the node's jobs with (a warm
        # server, `cloudtrain.jobs.warm`): pay it once. The environment is a CPU job's, as far
        # as the import reads it (`Coordinator._node_env`), so `up`'s readying finds the same
        # server; where it is not (a job's cgroup is another), `up`'s start retires it for one
        # that is. `--keep`: a server there already (a recovery readies its replacement while
        # this runs) is left as it is, and checked with only where it is this check's.
        env = {**os.environ, **LOOPBACK_ENV, "CLOUDTRAIN_NODE_ROOT": str(p.config.root)}
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        p.check([py, "-m", WARM, "--keep", "--start"], VERIFY_TIMEOUT_S, env)
        rank = [*LOOPBACK, "--nproc-per-node", "1", "--start-method", "fork"]
        argv = [py, "-m", WARM, "--keep", *rank, "-m", VERIFY, "check", "0"]
        p.check(argv, VERIFY_TIMEOUT_S, env)
        return
    p.check([py, "-m", VERIFY, "check", str(gpus)], VERIFY_TIMEOUT_S)
    if gpus > 0:
        ranks = [*LOOPBACK, "--nproc-per-node", str(gpus)]
        argv = [py, "-m", "torch.distributed.run", *ranks, "-m", VERIFY, "allreduce"]
        p.check(argv, VERIFY_TIMEOUT_S, {**os.environ, **LOOPBACK_ENV})


def _as_the_jobs_user(root: Path) -> bool:
    """Whether this runs as the user the node's jobs run as (who owns its folder), and may
    start their warm server: a cloud node's bootstrap runs as root (cloud-init), whose server
    would serve no job. ``CLOUDTRAIN_WARM=0`` here: never."""
    if os.environ.get("CLOUDTRAIN_WARM", "1") == "0":
        return False
    try:
        return root.stat().st_uid == os.geteuid()
    except OSError:
        return False


PHASE_RUNNERS: dict[str, Callable[[Phase], None]] = {
    "torch": phase_torch,
    "nccl": phase_nccl,
    "verify": phase_verify,
}


# --- the command -------------------------------------------------------------------------------


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(SIGNAL_EXITS[signal.Signals(signum)])


def run_phase(name: str, config_path: Path, skip_file: Path) -> int:
    """Phase `name` over the config file, its log on stdout; its exit code (see the module)."""
    try:
        config = Config.load(config_path)
    except (OSError, ValueError) as exc:
        say(f"cannot load the config file {str(config_path)!r}: {exc}", sys.stderr)
        return EXIT_CONFIG
    for key, value in (
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        ("PIP_PROGRESS_BAR", "off"),
        ("PYTHONUNBUFFERED", "1"),
    ):
        os.environ.setdefault(key, value)
    os.chdir("/")  # a package in the caller's folder must not shadow torch
    for signum in SIGNAL_EXITS:
        signal.signal(signum, _on_signal)
    try:
        PHASE_RUNNERS[name](Phase(config, sys.stdout))
    except PhaseEnd as end:
        if end.code:
            print(f"error: {end}", flush=True)
            return end.code
        skip_file.write_text(f"{end}\n")
        print(f"skipped: {end}", flush=True)
    except Interrupted as stop:
        print(f"interrupted (exit {stop.code})", flush=True)
        return stop.code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_phase = sub.add_parser("phase", help="run one phase (bootstrap.sh does)")
    p_phase.add_argument("name", choices=sorted(PHASE_RUNNERS))
    p_phase.add_argument("config", type=Path)
    p_phase.add_argument("skip_file", type=Path, help="where a skipped phase's reason goes")
    args = parser.parse_args(argv)
    return run_phase(args.name, args.config, args.skip_file)


if __name__ == "__main__":
    sys.exit(main())
