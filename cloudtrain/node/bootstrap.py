"""Stage 2 of the node bootstrap: torch, the NCCL settings and the check that both work.

Stage 1 (``templates/bootstrap.sh``, root, before any Python) makes the venv and installs the
cloudtrain wheel the coordinator copied; it then replaces itself with this program, keeping its
lock, and this program goes on with the same config file, phase records and status file::

    python -m cloudtrain.node.bootstrap run CONFIG [--lock-fd N | --lock-dir D]

Run by hand (no ``--lock-*``), it takes the lock itself and refuses to start before stage 1 is
done. Its phases, in order (each idempotent, timed, logged to ``<log dir>/<phase>.log``):

=========  ====================================================================================
torch      ``pip install CT_TORCH_VERSION --index-url CT_TORCH_INDEX`` unless the installed
           torch matches the pin and the index's CUDA (one of another CUDA is replaced).
           Check-only (``CT_INSTALL=0``): torch is installed (a mismatch is a warning)
nccl       ``<root>/nccl.env`` (``KEY='value'`` lines every job on the node gets): the socket
           interface, EFA's settings (no GPUDirect RDMA on Volta), the fabric's; CPU: skipped
verify     in the node's Python, not here: torch sees the GPUs and has kernels for them, then an
           NCCL all_reduce across them under ``torch.distributed.run``; CPU: a gloo all_reduce
=========  ====================================================================================

The status file and the records have the format ``bootstrap.sh``'s header gives; this module
and the script are its two writers. The agent stays stdlib-only: torch is imported only by
`cloudtrain.node.verify`, which the verify phase runs in the node's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from cloudtrain.node import agent

ALL_PHASES = ("base", "nvidia-driver", "python", "cloudtrain", "torch", "nccl", "verify")
PHASES = ("torch", "nccl", "verify")
MODULE = "cloudtrain.node.bootstrap"
#: The verify phase's probes, run in the node's Python (which has torch).
VERIFY = "cloudtrain.node.verify"
VERIFY_TIMEOUT_S = 300
#: The installed torch's version and CUDA, read from its ``version.py`` without importing torch
#: (seconds of CPU on every node at every `up`; the verify phase imports it once).
TORCH_PROBE = (
    "import importlib.util, os, runpy; spec = importlib.util.find_spec('torch'); "
    "info = runpy.run_path(os.path.join(spec.submodule_search_locations[0], 'version.py')); "
    "print(info['__version__'], info['cuda'])"
)
EXIT_LOCKED, EXIT_CONFIG = 69, 78
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
    """The keys of the config file (see ``bootstrap.sh``'s header), with its defaults."""

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
            "CT_STATUS": f"{root}/bootstrap/status.json",
            "CT_LOG_DIR": f"{root}/bootstrap/logs",
            "CT_PHASES": " ".join(ALL_PHASES),
            "CT_INSTALL": "1",
            "CT_PYTHON": "python3",
            "CT_VENV": f"{root}/venv",
            "CT_GPU_COUNT": "0",
            "CT_EFA": "0",
            "CT_LOCK_TIMEOUT": "600",
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
    def boot_dir(self) -> Path:
        return self.root / "bootstrap"

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

    @property
    def phases(self) -> list[str]:
        """The phases of CT_PHASES, in their fixed order."""
        asked = set(self["CT_PHASES"].split())
        return [p for p in ALL_PHASES if p in asked]

    def inputs(self, phase: str) -> str:
        """The config `phase` depends on, as one line: a change redoes the phase."""
        keys = {
            "torch": ("CT_INSTALL", "CT_PYTHON", "CT_VENV", "CT_TORCH_VERSION", "CT_TORCH_INDEX"),
            "nccl": ("CT_ROOT", "CT_GPU_COUNT", "CT_ACCELERATOR", "CT_EFA",
                     "CT_NCCL_SOCKET_IFNAME", "CT_NCCL_ENV"),
            "verify": ("CT_INSTALL", "CT_PYTHON", "CT_VENV", "CT_GPU_COUNT", "CT_ACCELERATOR"),
        }[phase]  # fmt: skip
        return "py " + " ".join(shlex.quote(self[k]) for k in keys)


@dataclass(frozen=True)
class Record:
    """One phase's line in ``<root>/bootstrap/phases/<phase>`` (``-`` for none)."""

    state: str = "pending"
    code: int | None = None
    started: str | None = None
    finished: str | None = None
    inputs: str = ""

    def finished_for(self, inputs: str) -> bool:
        return self.state in ("done", "skipped") and self.inputs == inputs


class Records:
    """The phase records and the status file rendered from them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.folder = config.boot_dir / "phases"

    def read(self, phase: str) -> Record:
        try:
            lines = (self.folder / phase).read_text().split("\n")
        except FileNotFoundError:
            return Record()
        state, code, started, finished = (lines[0].split() + ["-"] * 4)[:4]
        return Record(state, int(code) if code.isdigit() else None,
                      None if started == "-" else started, None if finished == "-" else finished,
                      lines[1] if len(lines) > 1 else "")  # fmt: skip

    def write(self, phase: str, record: Record) -> None:
        fields = (record.state, record.code, record.started, record.finished)
        line = " ".join("-" if f is None else str(f) for f in fields)
        _write_atomic(self.folder / phase, f"{line}\n{record.inputs}\n")

    def status(self, state: str, phase: str) -> None:
        log_dir = self.config["CT_LOG_DIR"]
        phases = []
        for name in self.config.phases:
            rec = self.read(name)
            phases.append({"name": name, "state": rec.state, "started": rec.started,
                           "finished": rec.finished, "exit_code": rec.code,
                           "log": f"{log_dir}/{name}.log"})  # fmt: skip
        doc = {"phase": phase, "state": state, "phases": phases}
        try:
            _write_atomic(Path(self.config["CT_STATUS"]), json.dumps(doc) + "\n")
        except OSError as exc:
            say(f"warning: cannot write {self.config['CT_STATUS']}: {exc}", sys.stderr)


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


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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

    def run(self, argv: Sequence[str], timeout: float | None = None) -> int:
        """Run `argv` with its output in the log; its exit code (124 when it timed out)."""
        self.log.flush()
        try:
            return subprocess.run(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout,
                                  check=False).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            self.echo(f"timed out after {timeout:.0f} s: {shlex.join(argv)}")
            return 124
        except OSError as exc:
            self.echo(f"cannot run {argv[0]}: {exc}")
            return 127

    def check(self, argv: Sequence[str], timeout: float | None = None) -> None:
        code = self.run(argv, timeout)
        if code != 0:
            raise fail(f"{shlex.join(argv)} exited {code}", code)

    def probe(self, code: str) -> str | None:
        """The last line `code` prints in the node's Python; None when it fails."""
        try:
            done = subprocess.run([self.config.python, "-c", code], capture_output=True,
                                  text=True, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
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
            p.echo(f"warning: not {req or 'the pinned torch'} from "
                   f"{index or 'the expected index'} (check-only mode keeps it)")  # fmt: skip
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
    """CPU: one process checks and all-reduces. GPU: check, then one rank per GPU all-reduces."""
    gpus, py = p.config.gpus, p.config.python
    p.check([py, "-m", VERIFY, "check", str(gpus)], VERIFY_TIMEOUT_S)
    if gpus > 0:
        p.check([py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
                 "-m", VERIFY, "allreduce"], VERIFY_TIMEOUT_S)  # fmt: skip


PHASE_RUNNERS: dict[str, Callable[[Phase], None]] = {
    "torch": phase_torch,
    "nccl": phase_nccl,
    "verify": phase_verify,
}


# --- the run -----------------------------------------------------------------------------------


class Stage2:
    """One run of stage 2 over a config: records, status, signals."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.records = Records(config)
        self.current: tuple[str, str] | None = None  # the phase running, and since when

    def run_phase(self, name: str) -> int:
        c = self.config
        log_path = Path(c["CT_LOG_DIR"]) / f"{name}.log"
        started, t0 = now(), time.monotonic()
        self.current = (name, started)
        self.records.write(name, Record("running", None, started, None, c.inputs(name)))
        self.records.status("running", name)
        code, reason = 0, None
        with open(log_path, "a") as log:
            log.write(f"==== {started}: phase {name} (CT_INSTALL={c['CT_INSTALL']})\n")
            try:
                PHASE_RUNNERS[name](Phase(c, log))
            except PhaseEnd as end:
                code, reason = end.code, str(end)
                log.write(f"{'skipped' if code == 0 else 'error'}: {reason}\n")
        self.current = None
        state = "failed" if code else "skipped" if reason else "done"
        self.records.write(name, Record(state, code, started, now(), c.inputs(name)))
        took = f"{time.monotonic() - t0:.0f} s"
        if state == "failed":
            self.records.status("failed", name)
            say(f"{name}: failed (exit {code}, {took}); the end of {log_path}:", sys.stderr)
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            print("".join(f"  | {line}\n" for line in tail), end="", file=sys.stderr, flush=True)
        elif state == "skipped":
            say(f"{name}: skipped, {reason} ({took})")
        else:
            say(f"{name}: done ({took})")
        return code

    def start_agent(self) -> None:
        """Where the node's agent runs detached (``CT_AGENT=detached``: ssh and local nodes;
        systemd runs it on clouds), start it unless it is resident: before the node says
        ready, so a node that is ready has its agent."""
        if self.config["CT_AGENT"] != "detached":
            return
        try:
            beat = agent.ensure(self.config.root, wait_s=10)
        except OSError as exc:  # the heartbeat starts it later
            say(f"agent: did not start ({exc})", sys.stderr)
            return
        say(f"agent: {'started' if beat['launched'] else 'resident already'}")

    def main(self) -> int:
        """Run the stage-2 phases from the first one not done; 0 when the node is ready. A
        signal records the running phase as failed (the command it ran is killed)."""
        try:
            return self._main()
        except Interrupted as stop:
            if self.current is not None:
                (name, started), code = self.current, stop.code
                self.records.write(name, Record("failed", code, started, now(),
                                                self.config.inputs(name)))  # fmt: skip
                self.records.status("failed", name)
                say(f"{name}: interrupted (exit {code})", sys.stderr)
            return stop.code

    def _main(self) -> int:
        c, phases = self.config, self.config.phases
        mine = [p for p in phases if p in PHASES]
        for name in phases:
            if name not in PHASES and self.records.read(name).state not in ("done", "skipped"):
                say(f"stage 1 has not finished its phase {name}: run bootstrap.sh", sys.stderr)
                return EXIT_CONFIG
        todo = [p for p in mine if not self.records.read(p).finished_for(c.inputs(p))]
        if not todo:
            self.start_agent()
            self.records.status("ready", phases[-1])
            say(f"ready: every phase already done ({c['CT_PHASES']})")
            return 0
        start = mine.index(todo[0])
        if self.records.read(mine[start]).state != "pending":
            say(f"resuming at {mine[start]}")
        for name in mine[start:]:
            self.records.write(name, Record(inputs=c.inputs(name)))
        for name in mine[start:]:
            code = self.run_phase(name)
            if code:
                return code
        self.start_agent()
        self.records.status("ready", phases[-1])
        say("ready")
        return 0


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(SIGNAL_EXITS[signal.Signals(signum)])


@contextlib.contextmanager
def _lock(config: Config, fd: int | None, lock_dir: str | None) -> Iterator[None]:
    """Hold the bootstrap's lock: stage 1's (inherited as `fd` or `lock_dir`), or our own."""
    if fd is not None:
        yield
        return
    if lock_dir is not None:
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                (Path(lock_dir) / "pid").unlink()
                Path(lock_dir).rmdir()
        return
    path = config.boot_dir / "lock"
    with open(path, "a") as f:
        deadline = time.monotonic() + int(config["CT_LOCK_TIMEOUT"])
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    say(f"another bootstrap run still holds {path}; giving up", sys.stderr)
                    raise SystemExit(EXIT_LOCKED) from None
                time.sleep(0.2)
        yield


def run(config_path: Path, lock_fd: int | None = None, lock_dir: str | None = None) -> int:
    """Stage 2 over the config file; the exit code bootstrap.sh documents."""
    try:
        config = Config.load(config_path)
    except (OSError, ValueError) as exc:
        say(f"cannot load the config file {config_path}: {exc}", sys.stderr)
        return EXIT_CONFIG
    for key, value in (("PIP_DISABLE_PIP_VERSION_CHECK", "1"), ("PIP_PROGRESS_BAR", "off"),
                       ("PYTHONUNBUFFERED", "1")):  # fmt: skip
        os.environ.setdefault(key, value)
    os.chdir("/")  # a package in the caller's folder must not shadow torch
    for folder in (config.boot_dir / "phases", Path(config["CT_LOG_DIR"])):
        folder.mkdir(parents=True, exist_ok=True)
    for signum in SIGNAL_EXITS:
        signal.signal(signum, _on_signal)
    with _lock(config, lock_fd, lock_dir):
        return Stage2(config).main()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="stage 2 of the bootstrap")
    p_run.add_argument("config", type=Path)
    held = p_run.add_mutually_exclusive_group()
    held.add_argument("--lock-fd", type=int, help="stage 1's lock, held on this descriptor")
    held.add_argument("--lock-dir", help="stage 1's mkdir lock: removed at the end")
    args = parser.parse_args(argv)
    return run(args.config, args.lock_fd, args.lock_dir)


if __name__ == "__main__":
    sys.exit(main())
