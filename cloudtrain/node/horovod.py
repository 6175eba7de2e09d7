"""Horovod on a node: its wheel, built once per torch, and the rendezvous its workers meet at.
Stdlib only at import time (Horovod is imported by `serve` alone)::

    python -m cloudtrain.node horovod build --cache DIR [--python PY] [--install]
    python -m cloudtrain.node horovod rendezvous --bind ADDR --hosts H:N,... [--iface IF]
        [--port P] [--timeout-s S] [--until JOB_DIR] [--max-s S]

`build` prints the wheel's path (progress goes to stderr). Horovod 0.28.1, its last release, does
not build against torch >= 2.1 as published: torch's headers need C++17 and its two
``CMakeLists.txt`` ask for C++14. The build patches them, builds with gloo (no MPI, no
TensorFlow, no MXNet; NCCL on a GPU node) against the torch that `python` has, and keeps the
wheel in ``DIR/<key>/``, the key naming everything the wheel is tied to: Horovod's version,
torch's, the Python ABI, the machine and CPU or CUDA. What the build needs and `python` lacks
(setuptools, packaging, CMake) is pip-installed there first. Guarantees:

=================  ===============================================================================
idempotent         a wheel in the cache is returned without building
one build          an ``fcntl`` lock on ``DIR/<key>/.lock``: a second build on this machine waits
                   and then finds the first's wheel
never half a       the wheel is copied to a hidden name in the cache, then renamed into place
wheel              (``os.replace``): a crash, or two machines sharing ``DIR``, leave whole wheels
=================  ===============================================================================

`rendezvous` (the head of a Horovod job) serves Horovod's gloo rendezvous on ADDR only (the
cluster's private address: never every interface) for the ranks dealt to `--hosts` by Horovod's
`get_host_assignments`. It prints one JSON line: ``addr``, ``port`` and each slot with its
worker's environment (`worker_env`); then, as JSON lines, ``{"joined": rank, "after_s": S}`` as
each worker reaches it and ``{"missing": [ranks], "after_s": S}`` once `--timeout-s` went by
after the first with some never come (the workers that came abort then: SIGABRT, after gloo's
``Wait timeout after S seconds for key(s): R``, which names no host). It serves until
SIGTERM, SIGINT or SIGHUP, until ``JOB_DIR`` has an ``exit_code`` or ``cancelled`` (or is
gone), or for `--max-s` seconds. The node's ``spawn`` serves it in process instead, for as long
as its workers run (`serve`, then ``stop()``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "GLOO_TIMEOUT_S",
    "HOROVOD_VERSION",
    "BuildError",
    "Rendezvous",
    "Slot",
    "Target",
    "build",
    "build_env",
    "cached_wheel",
    "install",
    "main",
    "parse_hosts",
    "patch_cmakelists",
    "probe",
    "serve",
    "worker_env",
]

HOROVOD_VERSION = "0.28.1"
#: The files that ask for C++14, relative to the source's root.
CMAKELISTS = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")
#: How long a worker's gloo rendezvous waits for the others before it aborts the process
#: (SIGABRT). It bounds the workers' start skew, not the job: a rank busy in Python for longer
#: (a checkpoint, an evaluation) does not trip it, Horovod's background thread keeps talking, and
#: a rank that dies mid-job ends the others at once (HorovodInternalError). Workers start node by
#: node and import torch cold on a fresh disk, tens of seconds apart; past two minutes a missing
#: worker is a failure to report (torch's default: 30 minutes of paid GPUs waiting).
GLOO_TIMEOUT_S = 120
BUILD_TIMEOUT_S = 3600.0
HEARTBEAT_S = 30.0
PROBE = (
    "import json, platform, sys, torch; print(json.dumps({'torch': torch.__version__, "
    "'cuda': torch.version.cuda, 'python': sys.implementation.cache_tag, "
    "'machine': platform.machine()}))"
)
BUILD_MODULES = ("setuptools", "packaging")  # setup.py imports both; no build isolation
_CXX = re.compile(r"^(\s*set\(CMAKE_CXX_STANDARD )(14|17)(\)\s*)$", re.MULTILINE)


class BuildError(RuntimeError):
    """Horovod's wheel could not be built or installed; the message says what to do."""


def _say(message: str) -> None:
    print(f"cloudtrain horovod: {message}", file=sys.stderr, flush=True)


# --- the wheel --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a wheel is tied to: the torch it is built against and where it runs."""

    torch: str  # torch.__version__, e.g. 2.13.0+cpu
    python: str  # the ABI: sys.implementation.cache_tag, e.g. cpython-311
    machine: str  # platform.machine()
    flavour: str  # "cpu", or "cuda12.8": built with NCCL for torch's CUDA
    horovod: str = HOROVOD_VERSION

    @property
    def key(self) -> str:
        """The wheel's folder in the cache."""
        return f"{self.horovod}-torch{self.torch}-{self.python}-{self.machine}-{self.flavour}"

    @property
    def gpu(self) -> bool:
        return self.flavour != "cpu"


def probe(python: str) -> Target:
    """The target of a build for `python` (which must import torch). Blocks for its start."""
    done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(
            f"{python} cannot import torch (install torch first: Horovod is built against it): "
            + _tail(done.stderr, 3)
        )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    cuda = seen["cuda"] if shutil.which("nvidia-smi") else None
    flavour = f"cuda{cuda}" if cuda else "cpu"
    return Target(str(seen["torch"]), str(seen["python"]), str(seen["machine"]), flavour)


def build_env(target: Target, jobs: int) -> dict[str, str]:
    """The variables Horovod's setup.py builds with (on top of the environment)."""
    env = {
        "HOROVOD_WITH_PYTORCH": "1",
        "HOROVOD_WITH_GLOO": "1",
        "HOROVOD_WITHOUT_MPI": "1",
        "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "CMAKE_POLICY_VERSION_MINIMUM": "3.5",  # CMake >= 4 refuses gloo's old minimum
        "MAKEFLAGS": f"-j{max(1, jobs)}",
    }
    if target.gpu:
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    return env


def patch_cmakelists(path: Path) -> bool:
    """Make `path` ask for C++17 where it asks for C++14 (torch >= 2.1's headers need it).
    Idempotent: True when it changed the file, False when it asked for 17 already. Raises
    BuildError when the file has no ``set(CMAKE_CXX_STANDARD 14|17)`` line (not 0.28.1's)."""
    text = path.read_text()
    if not _CXX.search(text):
        raise BuildError(f"{path}: no `set(CMAKE_CXX_STANDARD 14)` line to make 17")
    patched = _CXX.sub(r"\g<1>17\g<3>", text)
    if patched == text:
        return False
    path.write_text(patched)
    return True


def cached_wheel(folder: Path) -> Path | None:
    """The wheel in a key's folder of the cache, if one was built."""
    found = sorted(folder.glob("horovod-*.whl"))
    return found[-1] if found else None


def build(
    python: str, cache: Path, *, target: Target | None = None, timeout_s: float = BUILD_TIMEOUT_S
) -> Path:
    """The Horovod wheel for `python`'s torch on this machine: from `cache`, else built into
    it (minutes; one build at a time per machine and key). Idempotent; blocks; raises
    BuildError. `target`: what `probe(python)` would say (the cache is looked up without it)."""
    target = target or probe(python)
    folder = cache / target.key
    hit = cached_wheel(folder)
    if hit is not None:
        _say(f"cached wheel {hit}")
        return hit
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        hit = cached_wheel(folder)
        if hit is not None:
            _say(f"another build made {hit}")
            return hit
        started = time.monotonic()
        _say(f"building horovod {target.horovod} for torch {target.torch} ({target.key})")
        with tempfile.TemporaryDirectory(prefix="cloudtrain-horovod-") as tmp:
            built = _build_in(python, target, Path(tmp), folder, timeout_s)
            part = folder / f".{built.name}.{platform.node()}.{os.getpid()}.part"
            try:
                shutil.copyfile(built, part)
                os.replace(part, folder / built.name)
            finally:
                part.unlink(missing_ok=True)
        wheel = folder / built.name
        size_mb = wheel.stat().st_size / 1e6
        _say(f"built {wheel} ({size_mb:.1f} MB) in {time.monotonic() - started:.0f} s")
        return wheel


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"another build holds {path}; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _build_in(python: str, target: Target, tmp: Path, folder: Path, timeout_s: float) -> Path:
    """Download, patch and build in `tmp`; the wheel built there."""
    _say(f"downloading horovod=={target.horovod} (source)")
    pip, sdist, dist = [python, "-m", "pip"], tmp / "sdist", tmp / "dist"
    source = ["--no-deps", "--no-binary", ":all:", f"horovod=={target.horovod}"]
    _run([*pip, "download", *source, "-d", str(sdist)])
    archives = sorted(sdist.glob("horovod-*.tar.gz"))
    if not archives:
        raise BuildError(f"pip download left no horovod-*.tar.gz in {sdist}")
    with tarfile.open(archives[0]) as tar:
        tar.extractall(tmp / "src", filter="data")
    src = tmp / "src" / f"horovod-{target.horovod}"
    for name in CMAKELISTS:
        patch_cmakelists(src / name)
    env = {**os.environ, **_tools(python, target), **build_env(target, os.cpu_count() or 1)}
    log = folder / f"build-{platform.node()}.log"
    argv = [*pip, "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", str(dist), str(src)]
    _say(f"compiling with {env['MAKEFLAGS']} (log: {log})")
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        while True:
            try:
                code = proc.wait(timeout=HEARTBEAT_S)
                break
            except subprocess.TimeoutExpired:
                spent = time.monotonic() - started
                if spent > timeout_s:
                    proc.kill()
                    proc.wait()
                    raise BuildError(f"the build ran past {timeout_s:g} s (log: {log})") from None
                _say(f"still compiling, {spent:.0f} s: {_progress(_read_tail(log))}")
    if code != 0:
        raise BuildError(f"the build exited {code} (log: {log}):\n{_tail(_read_tail(log), 30)}")
    wheels = sorted(dist.glob("horovod-*.whl"))
    if not wheels:
        raise BuildError(f"the build made no wheel (log: {log})")
    return wheels[0]


def _tools(python: str, target: Target) -> dict[str, str]:
    """Make sure the build's tools are there (the Python modules setup.py imports, CMake: both
    installed into `python`; a C++ compiler and, for NCCL, nvcc: named when missing). Returns
    the PATH the build runs with (`python`'s bin folder first, where pip puts cmake)."""
    bindir = Path(shutil.which(python) or python).absolute().parent
    path = os.pathsep.join([str(bindir), os.environ.get("PATH", os.defpath)])
    check = (
        f"import importlib.util as u; print(*[m for m in {BUILD_MODULES!r} if not u.find_spec(m)])"
    )
    missing = _run([python, "-c", check]).split()
    if shutil.which("cmake", path=path) is None:
        missing.append("cmake")
    if missing:
        _say(f"installing the build's tools into {python}: {' '.join(missing)}")
        _run([python, "-m", "pip", "install", *missing])
    if not any(shutil.which(cxx, path=path) for cxx in ("c++", "g++", "clang++")):
        raise BuildError("no C++ compiler: install g++ (Debian, Ubuntu: build-essential)")
    if target.gpu:
        cuda_bin = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin"
        path = os.pathsep.join([path, str(cuda_bin)])
        if shutil.which("nvcc", path=path) is None:
            raise BuildError(
                f"torch has CUDA {target.flavour[4:]} but there is no nvcc (in PATH or "
                f"{cuda_bin}): install the CUDA toolkit of that version, or set CUDA_HOME"
            )
    return {"PATH": path}


def install(python: str, wheel: Path) -> str:
    """pip install `wheel` (and Horovod's small dependencies) into `python`; Horovod's version,
    once ``horovod.torch`` imports there (its extension loads against that torch). Idempotent;
    blocks; raises BuildError."""
    _say(f"installing {wheel.name} into {python}")
    _run([python, "-m", "pip", "install", str(wheel)])
    check = "import horovod, horovod.torch; print(horovod.__version__)"
    return _run([python, "-c", check]).strip()


def _run(argv: Sequence[str]) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shown = " ".join(argv)
        raise BuildError(f"`{shown}` exited {done.returncode}:\n{_tail(done.stderr, 20)}")
    return done.stdout


def _read_tail(path: Path, size: int = 16384) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode("utf-8", "replace")


def _progress(log: str) -> str:
    """CMake's last ``[ 42%] Building CXX object ...`` line, else the log's last line."""
    steps = re.findall(r"^\s*(\[\s*\d+%\].*)$", log, re.MULTILINE)
    return (steps[-1] if steps else _tail(log, 1))[:160]


def _tail(text: str, lines: int) -> str:
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


# --- the rendezvous ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One worker's place in the job: Horovod's ``SlotInfo``, without Horovod."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def worker_env(
    slot: Slot, addr: str, port: int, iface: str, *, timeout_s: int = GLOO_TIMEOUT_S
) -> dict[str, str]:
    """The variables a worker in `slot` needs to join the rendezvous at ``addr:port``, the
    gloo traffic on `iface` (left out when empty: gloo then uses the address of the hostname).
    ``NCCL_SOCKET_IFNAME`` is not among them: the node's ``nccl.env`` sets it."""
    env = {
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(timeout_s),
    }
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``"h0:2,h1:2"`` as ``[("h0", 2), ("h1", 2)]``. Raises ValueError: a malformed entry,
    fewer than 1 slot, a host named twice (its local scope would be shared)."""
    hosts: list[tuple[str, int]] = []
    for item in text.split(","):
        name, _, slots = item.strip().rpartition(":")
        if not re.fullmatch(r"[\w.-]+", name) or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"host {item.strip()!r}: write NAME:SLOTS, e.g. node0:2")
        hosts.append((name, int(slots)))
    names = [name for name, _ in hosts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"hosts named twice: {', '.join(twice)}")
    return hosts


class Rendezvous:
    """Horovod's rendezvous server, serving in a thread of this process."""

    def __init__(self, httpd: Any, slots: Sequence[Slot], timeout_s: float) -> None:
        self.httpd = httpd
        self.slots = tuple(slots)
        self.timeout_s = timeout_s
        self.addr, self.port = str(httpd.server_address[0]), int(httpd.server_address[1])
        self.started = time.monotonic()
        self.joined: dict[int, float] = {}  # rank: seconds after the start
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def note(self, scope: str, key: str) -> None:
        """A worker stored `key` in `scope`: ``rank_<r>`` in ``global`` is rank r arriving."""
        if scope != "global" or not key.startswith("rank_") or not key[5:].isdigit():
            return
        with self._lock:
            if int(key[5:]) not in self.joined:
                self.joined[int(key[5:])] = round(time.monotonic() - self.started, 3)

    def arrived(self) -> dict[int, float]:
        """The ranks that came, and when (seconds after the start)."""
        with self._lock:
            return dict(self.joined)

    def missing(self) -> list[Slot]:
        """The slots whose worker has not come, once `timeout_s` went by after the first came
        (gloo aborts the others then); empty before."""
        with self._lock:
            if (
                not self.joined
                or time.monotonic() - self.started < min(self.joined.values()) + self.timeout_s
            ):
                return []
            return [s for s in self.slots if s.rank not in self.joined]

    def plan(self, iface: str) -> dict[str, Any]:
        return {
            "addr": self.addr,
            "port": self.port,
            "slots": [
                {
                    **asdict(s),
                    "env": worker_env(
                        s, self.addr, self.port, iface, timeout_s=int(self.timeout_s)
                    ),
                }
                for s in self.slots
            ],
        }

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._thread is not None and self._thread.is_alive():
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()


def serve(
    bind_addr: str,
    hosts: Sequence[tuple[str, int]],
    port: int = 0,
    *,
    timeout_s: float = GLOO_TIMEOUT_S,
) -> Rendezvous:
    """Serve Horovod's rendezvous for `hosts` (name, slots: ranks dealt host by host) on
    ``bind_addr:port`` only (port 0: one the system chose: ``.port``). Returns at once, the
    server running in a daemon thread until ``stop()``. Raises OSError when the address
    cannot be bound, ImportError without Horovod."""
    names = importlib.import_module("horovod.runner.common.util.hosts")
    http = importlib.import_module("horovod.runner.http.http_server")
    plan = names.get_host_assignments([names.HostInfo(h, n) for h, n in hosts], 1)
    slots = [
        Slot(s.hostname, s.rank, s.local_rank, s.cross_rank, s.size, s.local_size, s.cross_size)
        for s in plan
    ]

    base: Any = http.RendezvousHandler

    class Handler(base):  # type: ignore[misc]
        def _put_value(self, scope: str, key: str, value: bytes) -> None:
            super()._put_value(scope, key, value)
            self.server.cloudtrain.note(scope, key)

    # Horovod's RendezvousServer.start() binds ('', port): every interface. Its HTTP server
    # class, bound here to one address, with the plan given before the first request.
    httpd = http.RendezvousHTTPServer((bind_addr, port), Handler, 0)
    httpd.init(plan)
    server = Rendezvous(httpd, slots, timeout_s)
    httpd.cloudtrain = server
    server.start()
    return server


# --- the command line -------------------------------------------------------------------------


def _emit(record: Mapping[str, object]) -> None:
    print(json.dumps(record), flush=True)


def _ended(job_dir: Path) -> bool:
    return not job_dir.is_dir() or any((job_dir / n).exists() for n in ("exit_code", "cancelled"))


def _rendezvous(args: argparse.Namespace) -> int:
    try:
        server = serve(args.bind, args.hosts, args.port, timeout_s=args.timeout_s)
    except ImportError as exc:
        _say(f"Horovod is not importable by {sys.executable} ({exc}): build and install it")
        return 1
    except OSError as exc:
        _say(f"cannot serve on {args.bind}:{args.port}: {exc}")
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    _emit(server.plan(args.iface))
    size = len(server.slots)
    _say(f"rendezvous for {size} worker(s) on {server.addr}:{server.port}")
    deadline = time.monotonic() + args.max_s if args.max_s else float("inf")
    told: set[int] = set()
    missing: list[Slot] = []
    try:
        while not stop.wait(0.5):
            arrived = server.arrived()
            for rank, after in sorted(arrived.items()):
                if rank not in told:
                    told.add(rank)
                    _emit({"joined": rank, "after_s": after})
                    if len(told) == size:
                        _say(f"all {size} worker(s) came, the last {max(arrived.values())} s in")
            if not missing and (missing := server.missing()):
                after = time.monotonic() - server.started
                _emit({"missing": [s.rank for s in missing], "after_s": round(after, 3)})
                names = ", ".join(
                    f"rank {s.rank} ({s.hostname}, slot {s.local_rank})" for s in missing
                )
                _say(
                    f"{names} did not come within {server.timeout_s:g} s of the first worker: "
                    "the workers that came abort now (SIGABRT, gloo's 'Wait timeout')"
                )
            if (args.until and _ended(args.until)) or time.monotonic() > deadline:
                break
    finally:
        server.stop()
    return 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cloudtrain.node horovod",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="print the wheel's path (built if not cached)")
    p_build.add_argument("--cache", type=Path, required=True, metavar="DIR")
    p_build.add_argument("--python", default=sys.executable, help="the Python with the torch")
    p_build.add_argument("--install", action="store_true", help="and install it there")
    p_serve = sub.add_parser("rendezvous", help="serve the rendezvous of a job's workers")
    p_serve.add_argument("--bind", required=True, metavar="ADDR", help="the private address")
    p_serve.add_argument("--hosts", required=True, type=_hosts, metavar="H:N,...")
    p_serve.add_argument("--iface", default="", help="the workers' network interface")
    p_serve.add_argument("--port", type=int, default=0, help="default: one the system chose")
    p_serve.add_argument(
        "--timeout-s",
        type=int,
        default=GLOO_TIMEOUT_S,
        help="the workers' HOROVOD_GLOO_TIMEOUT_SECONDS",
    )
    p_serve.add_argument("--until", type=Path, metavar="JOB_DIR", help="end with this job")
    p_serve.add_argument("--max-s", type=float, help="end after this many seconds")
    args = parser.parse_args(list(argv))
    if args.command == "rendezvous":
        return _rendezvous(args)
    try:
        wheel = build(args.python, args.cache.absolute())
        if args.install:
            _say(f"horovod {install(args.python, wheel)} imports in {args.python}")
    except BuildError as exc:
        _say(str(exc))
        return 1
    print(wheel, flush=True)
    return 0


def _hosts(text: str) -> list[tuple[str, int]]:
    try:
        return parse_hosts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
