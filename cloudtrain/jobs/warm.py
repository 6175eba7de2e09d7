"""A warm agent: a job's torchrun agent forked from a process that imported torch before the job.

Under ``--start-method fork`` a job's workers inherit their agent's torch (`cloudtrain.jobs.
elastic`), but the agent itself still starts a new interpreter and imports torch and
``torch._dynamo`` (about 2.5 s of CPU here) before the first worker can start. Run as::

    python -m cloudtrain.jobs.warm [elastic's flags] script.py ARGS      (the client)
    python -m cloudtrain.jobs.warmserver ROOT                             (the server)
    python -m cloudtrain.jobs.warm --start            (start the server for the job's env)
    python -m cloudtrain.jobs.warm --keep ...         (either, disturbing no server: `KEEP`)

the client asks the node's server (``<root>/warm/sock``; ``<root>`` is the job's
``CLOUDTRAIN_NODE_ROOT``) for an agent: the server forks one with its standard streams, its
folder, umask, environment and arguments, and the client waits for it and exits as it did
(a signal it gets it passes on). With no server that answers, the client is the agent itself,
as ``python -m cloudtrain.jobs.elastic`` (cold), and when that job ends it starts a server
detached, for the node's next job or attempt: when it ended on its own, or a stop of the job
stopped it (a recovery's, a cancel's: they mark its folder first), not when the node's
teardown did (that leaves no process behind it did not find). ``--start`` starts one with the
job's environment before any job ran (`up` readies each new node so, and a recovery its
replacement while the node's bootstrap checks torch), and a client that finds a server still
importing (its `STARTING` file there, its lock held) waits for it up to `STARTING_S`. A CPU
node's bootstrap starts one for its own check of torch (`KEEP`: it disturbs none there),
in its own environment: ``--start`` keeps a server whose `fingerprint` is its jobs' and
retires one whose is not (it stops listening, and exits once no agent of it runs) for a new
one. So every
fork job on a node is warm, for as long as the server lives: until the node's
teardown (it carries ``CLOUDTRAIN_NODE_ROOT``, and is stopped with the node's processes), its
folder is gone, or `IDLE_S` without a request.

A forked agent must be the process a cold start would have made:

- The environment is the job's, and other processes must see it too: the node finds a job's
  processes by ``/proc/PID/environ`` (`cloudtrain.node.procs`), which is the memory that held
  the environment the process was started with. The server is started with a blank variable
  `PAD_VAR` of `PAD_BYTES`, and each fork writes its job's environment over that memory
  (``env_start``..``env_end`` of ``/proc/self/stat``), after it moved the C library's own
  ``environ`` off it. A job whose environment does not fit is refused (it starts cold).
- No job's environment enters the server (a job's ``--env`` and ``envs:`` hold secrets, and
  the server outlives the job by up to `IDLE_S`): it is started with the first job's
  import-time variables alone (`server_env`), a request gives only its environment's size,
  and the client sends the environment itself to the forked agent, which reads it.
- What torch reads when it is imported must be what the job would have given it: the server
  serves a request only when the interpreter, ``sys.path``, the modification times of its
  folders (a ``pip install`` changes them), every variable of `IMPORT_TIME` prefixes and the
  process's confinement (`confinement`: cgroups, limits, CPUs, nice, which a fork inherits
  from the server) are the same as at its start (`fingerprint`). Otherwise it refuses and
  exits: the job starts cold and starts a new server when it ends.
- The client hides itself from those scans (it renames its own ``CLOUDTRAIN_JOB_ID`` and
  ``CLOUDTRAIN_NODE_ROOT`` in place): a stop signals the agent once, as it would a cold one.
- The exit status is the agent's: it sends it on the connection it inherited, and the
  server sends it again when it reaps the agent (alone when a signal killed it), so a job
  whose server died under it still ends with its own status.
- Only this user's processes may ask: the socket's folder is 0700 and the server checks the
  peer's uid (``SO_PEERCRED``).

The server is single-threaded and imports nothing that starts a thread or touches a GPU
(``torch.cuda`` is not initialised by importing torch; `elastic` checks it again).
``CLOUDTRAIN_WARM=0`` in a job's environment starts it cold and starts no server.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.node import procs

#: The variable the server is started with, whose room each fork's environment takes.
PAD_VAR, PAD_BYTES = "CLOUDTRAIN_WARM_PAD", 65536
#: The server exits after this long without a request (it holds torch's memory).
IDLE_S = 3600.0
#: How long a job waits for a server that is starting (importing torch) before it starts cold.
STARTING_S = 30.0
#: The file a server holds while it imports, before it listens.
STARTING = "starting"
#: The file that holds a listening server's `fingerprint`, which `start` compares with its job's.
KEY = "key"
#: How long `start` waits for a server it retired (one not for its job's fingerprint) to exit.
RETIRE_S = 5.0
#: Variables read when torch and its libraries are imported: a request must match the server's.
IMPORT_TIME = ("PYTHON", "TORCH", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "CUDA_")
#: The variables the node finds a job's processes by (`cloudtrain.node.procs`).
MARKERS = ("CLOUDTRAIN_JOB_ID", "CLOUDTRAIN_NODE_ROOT")
#: What else of the first job's environment the server keeps, with the node's marker (a
#: teardown finds the server by it): what the interpreter and the C library read as they
#: start. Nothing else: a job's `--env` values (secrets) never enter the server.
SERVER_ENV = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE")
#: ``CLOUDTRAIN_WARM=0`` turns warm starts off for a job.
SWITCH = "CLOUDTRAIN_WARM"
#: The first flag of a client that must leave the node's server as it is (the bootstrap's
#: check): ``--start`` retires none, and a job asks only a server of its own fingerprint.
KEEP = "--keep"


def folder(root: Path) -> Path:
    return root / "warm"


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """`path` as an address to bind or connect a Unix socket to, however deep its folder is:
    through a descriptor of the folder (an address holds 107 bytes, and a node's folder under
    a long home or a shared file system is often longer)."""
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def fingerprint(env: Mapping[str, str]) -> str:
    """What must not change between the server's start and a request: the interpreter, its
    search path (the script's own folder, ``sys.path[0]``, aside), when each of its folders
    last changed, the variables read at import time, and where the process runs
    (`confinement`)."""
    stats = []
    for entry in sys.path[1:]:
        try:
            st = os.stat(entry or ".")
            stats.append([entry, st.st_ino, st.st_mtime_ns])
        except OSError:
            stats.append([entry, None, None])
    wanted = sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME))
    text = json.dumps([sys.executable, sys.version, stats, wanted, confinement()])
    return hashlib.sha256(text.encode()).hexdigest()


def confinement() -> list[object]:
    """What confines this process, which a forked agent inherits from the server rather than
    from the job's launcher: its cgroups (the memory limit a job runs under, and where the
    OOM killer's count of its ranks is read, `cloudtrain.node.oom`; a Slurm step's devices
    and CPUs), its resource limits, the CPUs it may run on and its nice value. A job started
    elsewhere (another cgroup: a memory-limited scope, another login session's scope) starts
    cold, in its own."""
    try:
        cgroups = Path("/proc/self/cgroup").read_text()
    except OSError:
        cgroups = ""
    limits = sorted(
        (name, resource.getrlimit(getattr(resource, name)))
        for name in dir(resource)
        if name.startswith("RLIMIT_")
    )
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return [cgroups, limits, affinity, os.getpriority(os.PRIO_PROCESS, 0)]


def server_env(job_env: Mapping[str, str]) -> dict[str, str]:
    """The server's environment, from the job's that starts it: its `IMPORT_TIME` variables
    (the `fingerprint` compares them with each request's) and `SERVER_ENV`, and the blank room
    each fork writes its own job's environment over."""
    kept = (*SERVER_ENV, "CLOUDTRAIN_NODE_ROOT")
    env = {k: v for k, v in job_env.items() if k.startswith(IMPORT_TIME) or k in kept}
    return {**env, PAD_VAR: "." * PAD_BYTES}


def environ_block(env: Mapping[str, str]) -> bytes:
    return b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0" for k, v in env.items())


def environ_region() -> tuple[int, int]:
    """(start, end) of this process's initial environment's memory (``/proc/self/stat``)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[47]), int(fields[48])  # fields 50 and 51 of proc(5); 3 is fields[0]


def _set_first_letter(names: Sequence[str], old: str, new: str) -> None:
    """Change the first letter of each of `names` from `old` to `new` in this process's
    initial environment memory: ``_LOUDTRAIN_JOB_ID`` no longer matches a scan of
    ``/proc/PID/environ``, and no string moves (the C library's pointers into that memory
    stay valid)."""
    start, end = environ_region()
    block = b"\0" + ctypes.string_at(start, end - start)
    for name in names:
        at = block.find(b"\0" + (old + name[1:] + "=").encode())  # its offset in the region
        if at >= 0:
            ctypes.memset(start + at, ord(new), 1)


# -- the client ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    keep = args[:1] == [KEEP]
    args = args[keep:]
    named = os.environ.get("CLOUDTRAIN_NODE_ROOT")
    root = Path(named) if named and os.environ.get(SWITCH, "1") != "0" else None
    if args == ["--start"]:  # a job's next start is near: its server, now (`prewarm`)
        if root is not None:
            start(root, os.environ, retire=not keep)
        return
    status = ask(root, args, keep) if root is not None else None
    if status is not None:
        _exit_as(status)
    from cloudtrain.jobs import elastic

    env = dict(os.environ)  # the job's, before torch elastic adds its own
    signalled = False  # by a job's stop, or by the node's teardown
    try:
        elastic.main(args)  # cold: this process is the agent
    except BaseException as exc:
        signalled = isinstance(exc, (KeyboardInterrupt, elastic.Stopped))
        raise
    finally:
        if root is not None and (not signalled or _stopped_as_a_job(env)):
            start(root, env)


def _stopped_as_a_job(env: Mapping[str, str]) -> bool:
    """Whether the signal came from a stop of this job (a recovery's, a cancel's), which marks
    the job's folder first (`procs.STOPPED`): the node stays, and its next attempt or job
    starts warm. A teardown marks nothing, and must leave no process it did not find."""
    run_dir = env.get("CLOUDTRAIN_RUN_DIR")
    return run_dir is not None and (Path(run_dir) / procs.STOPPED).exists()


#: What the client passes on to the agent.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def ask(root: Path, argv: Sequence[str], keep: bool = False) -> int | None:
    """Have the node's server fork the agent for `argv`, and wait for it: its exit status
    (negative: killed by that signal), or None when no server took the request. `keep`: ask
    only a server of this process's `fingerprint` (one of another's would stop serving)."""
    path = folder(root) / "sock"
    if not _serving(root) or (keep and _key(root) != fingerprint(os.environ)):
        return None
    # From the request on, the agent is the job's process, not this one: a stop finds it, and
    # this process passes on a signal it gets (held until the agent's pid is known).
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    _set_first_letter(MARKERS, "C", "_")
    try:
        conn, reader, pid = _request(path, argv)
    except _NotServed:
        _set_first_letter(MARKERS, "_", "C")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        return None

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    with conn, reader:
        try:
            line = reader.readline()
        except OSError:
            line = b""
    try:
        return int(json.loads(line)["status"])
    except (ValueError, KeyError, TypeError):
        print(
            f"cloudtrain: the warm agent's server went away while it ran (pid {pid}); "
            "its exit status is unknown",
            file=sys.stderr,
            flush=True,
        )
        return 1


def _serving(root: Path, within_s: float = STARTING_S) -> bool:
    """Whether the node's server listens, once the server that holds its lock but does not
    listen yet (it imports torch: a recovery readied the node, or the job before this one
    just ended) does, within `within_s`: what is left of its imports is less than a cold
    start's."""
    here = folder(root)
    deadline = time.monotonic() + within_s
    while not (here / "sock").exists():
        if not (here / STARTING).exists():
            return False  # none is starting (one that stopped listening holds the lock too)
        try:
            fd = os.open(here / "lock", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False  # no server holds it: none is starting
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class _NotServed(Exception):
    pass


def _request(path: Path, argv: Sequence[str]) -> tuple[socket.socket, Any, int]:
    """Send the request, and the job's environment to the agent once it is forked: (the
    connection, its reader, the agent's pid). The server reads the request alone (the size
    of the environment, not the environment)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with unix_address(path) as address:
            conn.connect(address)
        mask = os.umask(0)
        os.umask(mask)
        size, key = len(environ_block(os.environ)), fingerprint(os.environ)
        request = {"argv": list(argv), "size": size, "cwd": os.getcwd(), "umask": mask, "key": key}
        data = json.dumps(request).encode() + b"\n"
        socket.send_fds(conn, [data[:65536]], [0, 1, 2])
        conn.sendall(data[65536:])
        reader = conn.makefile("rb")
        reply = json.loads(reader.readline() or b"{}")
        pid = reply.get("pid") if isinstance(reply, dict) else None
        if not isinstance(pid, int):
            raise ValueError(reply)
        # a client gone here: the agent, forked, reads no environment and exits 1 unrun
        conn.sendall(json.dumps(dict(os.environ)).encode() + b"\n")
    except (OSError, ValueError):
        conn.close()  # (a reader made holds it until it is collected, on return)
        raise _NotServed from None
    return conn, reader, pid


def _exit_as(status: int) -> None:
    """Exit as a process whose exit status is `status` (negative: killed by that signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # (no handler to reset there)
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status
    os._exit(status & 0xFF)


def start(root: Path, job_env: Mapping[str, str], retire: bool = False) -> None:
    """Start the node's server detached, unless one holds its lock (or the node is gone), with
    what of `job_env` acts at import time (`server_env`) and nothing else of it. `retire`:
    unless the one that holds it serves jobs of `job_env`'s `fingerprint` (`_retired`).

    The server is handed the lock held, with its `STARTING` file made: from the moment this
    returns, a job's client waits for it (`_serving`). A server that took them itself would
    leave a window, while its interpreter starts, in which a job that came (the first one
    after `up`) found neither and started cold."""
    here = folder(root)
    if not root.is_dir():
        return
    here.mkdir(mode=0o700, exist_ok=True)
    lock, taken = lock_node(here)
    try:
        if not taken and not _retired(lock, root, fingerprint(job_env) if retire else None):
            return  # a server for these jobs holds the node, or one busy with another's
        (here / STARTING).touch(mode=0o600)
        try:
            with open(here / "server.log", "ab") as log:
                server = subprocess.Popen(
                    [sys.executable, "-m", "cloudtrain.jobs.warmserver", str(root), str(lock)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=root,
                    env=server_env(job_env),
                    start_new_session=True,
                    pass_fds=(lock,),
                )
        except BaseException:
            (here / STARTING).unlink(missing_ok=True)
            raise
        os.ftruncate(lock, 0)
        os.pwrite(lock, str(server.pid).encode(), 0)
    finally:
        os.close(lock)  # no unlock: the server's descriptor holds the same lock


def lock_node(here: Path) -> tuple[int, bool]:
    """The node's lock (``<here>/lock``), which its one server holds: the open descriptor (the
    caller closes it) and whether this process took it (it does not wait)."""
    fd = os.open(here / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return fd, _try_lock(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _retired(lock: int, root: Path, key: str | None) -> bool:
    """Whether this process took the node's `lock` (held by a server) after retiring that
    server because it serves jobs of another fingerprint than `key` (it would refuse each of
    them, and the first would start cold): the node's bootstrap started it for its own check
    of torch, in its own environment (`cloudtrain.node.bootstrap`'s verify). Retired, it stops
    listening and exits once no agent of it runs; one still busy after `RETIRE_S` keeps the
    node. No `key`: none is retired."""
    if key is None or not _serving(root) or _key(root) in (key, None):
        return False
    if not _retire(folder(root) / "sock", key):
        return False
    deadline = time.monotonic() + RETIRE_S
    while not _try_lock(lock):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _key(root: Path) -> str | None:
    """The listening server's `fingerprint` (it writes it before it listens)."""
    try:
        return (folder(root) / KEY).read_text()
    except OSError:
        return None


def _retire(path: Path, key: str) -> bool:
    """Ask the server at `path` to retire: a request with `key`, which it refuses and stops
    listening for unless `key` is its own (a server that took the node meanwhile: it refuses
    the request alone, since it asks for no agent). Whether the server answered."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with conn, open(os.devnull, "rb") as null:
            with unix_address(path) as address:
                conn.connect(address)
            request = {"argv": [], "size": 0, "cwd": "/", "umask": 0o77, "key": key, "retire": 1}
            fds = [null.fileno()] * 3
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)
            conn.settimeout(10)
            return bool(conn.recv(4096))
    except OSError:
        return False


if __name__ == "__main__":
    main()
