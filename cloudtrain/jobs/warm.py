"""A warm agent: a job's torchrun agent forked from a process that imported torch before the job.

Under ``--start-method fork`` a job's workers inherit their agent's torch (`cloudtrain.jobs.
elastic`), but the agent itself still starts a new interpreter and imports torch and
``torch._dynamo`` (about 2.5 s of CPU here) before the first worker can start. Run as::

    python -m cloudtrain.jobs.warm [elastic's flags] script.py ARGS      (the client)
    python -m cloudtrain.jobs.warm --serve ROOT                           (the server)

the client asks the node's server (``<root>/warm/sock``; ``<root>`` is the job's
``CLOUDTRAIN_NODE_ROOT``) for an agent: the server forks one with its standard streams, its
folder, umask, environment and arguments, and the client waits for it and exits as it did
(a signal it gets it passes on). With no server that answers, the client is the agent itself,
as ``python -m cloudtrain.jobs.elastic`` (cold), and when that job ends (not when a signal
stopped it: a cancel, a teardown) it starts a server detached, for the node's next job. So
the first fork job on a node is cold and the next are warm, for as long as the server lives:
until the node's teardown (it carries ``CLOUDTRAIN_NODE_ROOT``, and is stopped with the node's
processes), its folder is gone, or `IDLE_S` without a request.

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
  folders (a ``pip install`` changes them) and every variable of `IMPORT_TIME` prefixes are
  the same as at its start (`fingerprint`). Otherwise it refuses and exits: the job starts
  cold and starts a new server when it ends.
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

import atexit
import contextlib
import ctypes
import fcntl
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The variable the server is started with, whose room each fork's environment takes.
PAD_VAR, PAD_BYTES = "CLOUDTRAIN_WARM_PAD", 65536
#: The server exits after this long without a request (it holds torch's memory).
IDLE_S = 3600.0
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
_MAX_REQUEST = 4 << 20
_UNIX_PATH_MAX = 107


def folder(root: Path) -> Path:
    return root / "warm"


def fingerprint(env: Mapping[str, str]) -> str:
    """What must not change between the server's start and a request: the interpreter, its
    search path (the script's own folder, ``sys.path[0]``, aside), when each of its folders
    last changed, and the variables read at import time."""
    stats = []
    for entry in sys.path[1:]:
        try:
            st = os.stat(entry or ".")
            stats.append([entry, st.st_ino, st.st_mtime_ns])
        except OSError:
            stats.append([entry, None, None])
    wanted = sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME))
    text = json.dumps([sys.executable, sys.version, stats, wanted])
    return hashlib.sha256(text.encode()).hexdigest()


def server_env(job_env: Mapping[str, str]) -> dict[str, str]:
    """The server's environment, from the job's that starts it: its `IMPORT_TIME` variables
    (the `fingerprint` compares them with each request's) and `SERVER_ENV`, and the blank room
    each fork writes its own job's environment over."""
    kept = (*SERVER_ENV, "CLOUDTRAIN_NODE_ROOT")
    env = {k: v for k, v in job_env.items() if k.startswith(IMPORT_TIME) or k in kept}
    return {**env, PAD_VAR: "." * PAD_BYTES}


def _environ_block(env: Mapping[str, str]) -> bytes:
    return b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0" for k, v in env.items())


def _environ_region() -> tuple[int, int]:
    """(start, end) of this process's initial environment's memory (``/proc/self/stat``)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[47]), int(fields[48])  # fields 50 and 51 of proc(5); 3 is fields[0]


def _set_first_letter(names: Sequence[str], old: str, new: str) -> None:
    """Change the first letter of each of `names` from `old` to `new` in this process's
    initial environment memory: ``_LOUDTRAIN_JOB_ID`` no longer matches a scan of
    ``/proc/PID/environ``, and no string moves (the C library's pointers into that memory
    stay valid)."""
    start, end = _environ_region()
    block = b"\0" + ctypes.string_at(start, end - start)
    for name in names:
        at = block.find(b"\0" + (old + name[1:] + "=").encode())  # its offset in the region
        if at >= 0:
            ctypes.memset(start + at, ord(new), 1)


# -- the client ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        sys.exit(serve(Path(args[1])))
    named = os.environ.get("CLOUDTRAIN_NODE_ROOT")
    root = Path(named) if named and os.environ.get(SWITCH, "1") != "0" else None
    status = ask(root, args) if root is not None else None
    if status is not None:
        _exit_as(status)
    from cloudtrain.jobs import elastic

    env = dict(os.environ)  # the job's, before torch elastic adds its own
    stopped = False  # a job stopped by a signal (a cancel, a teardown) starts no server
    try:
        elastic.main(args)  # cold: this process is the agent
    except BaseException as exc:
        stopped = isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "SignalException"
        raise
    finally:
        if root is not None and not stopped:
            start(root, env)


#: What the client passes on to the agent.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def ask(root: Path, argv: Sequence[str]) -> int | None:
    """Have the node's server fork the agent for `argv`, and wait for it: its exit status
    (negative: killed by that signal), or None when no server took the request."""
    path = folder(root) / "sock"
    if len(os.fsencode(path)) > _UNIX_PATH_MAX or not path.exists():
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
        print(f"cloudtrain: the warm agent's server went away while it ran (pid {pid}); "
              "its exit status is unknown", file=sys.stderr, flush=True)  # fmt: skip
        return 1


class _NotServed(Exception):
    pass


def _request(path: Path, argv: Sequence[str]) -> tuple[socket.socket, Any, int]:
    """Send the request, and the job's environment to the agent once it is forked: (the
    connection, its reader, the agent's pid). The server reads the request alone (the size
    of the environment, not the environment)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        mask = os.umask(0)
        os.umask(mask)
        size, key = len(_environ_block(os.environ)), fingerprint(os.environ)
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
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status
    os._exit(status & 0xFF)


def start(root: Path, job_env: Mapping[str, str]) -> None:
    """Start the node's server detached, unless one holds its lock (or the node is gone), with
    what of `job_env` acts at import time (`server_env`) and nothing else of it."""
    from cloudtrain.node import procs

    here = folder(root)
    if not root.is_dir() or len(os.fsencode(here / "sock")) > _UNIX_PATH_MAX:
        return
    here.mkdir(mode=0o700, exist_ok=True)
    with procs.held_if_free(here / "lock") as free:
        if not free:
            return
    env = server_env(job_env)
    with open(here / "server.log", "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "cloudtrain.jobs.warm", "--serve", str(root)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=root, env=env, start_new_session=True,
        )  # fmt: skip


# -- the server ------------------------------------------------------------------------------


def serve(root: Path) -> int:
    """Import what an agent and its workers import, then fork an agent for each request."""
    here = folder(root)
    lock = os.open(here / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server holds the node
    from cloudtrain.jobs import elastic

    before = dict(os.environ)
    key = fingerprint(before)
    for name in ("torch", "torch.distributed.run", "torch.distributed.launcher.api",
                 *elastic.PRELOAD):  # fmt: skip
        importlib.import_module(name)
    # What those imports set (torch._inductor's cache folder…): a cold agent's imports set it
    # in the job's environment, so each fork adds it to its job's.
    added = {k: v for k, v in os.environ.items() if k not in before}
    path = here / "sock"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(16)
    print(f"cloudtrain-warm: serving on {path} (pid {os.getpid()})", flush=True)
    server = _Server(root, listener, key, lock, added)
    try:
        server.loop()
    finally:
        server.stop_listening()
    return 0


class _Server:
    """The accept loop: one request at a time (a fork takes milliseconds), each fork's exit
    status sent to its client when the fork ends."""

    def __init__(self, root: Path, listener: socket.socket, key: str, lock: int,
                 added: Mapping[str, str]) -> None:  # fmt: skip
        self.root, self.listener, self.key, self.lock = root, listener, key, lock
        self.added = added
        self.children: dict[int, socket.socket] = {}
        self.waker_r, self.waker_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.path = listener.getsockname()
        self.inode = os.stat(self.path).st_ino  # (a socket's own fstat is another inode)

    def loop(self) -> None:
        signal.set_wakeup_fd(self.waker_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        last, serving = time.monotonic(), True
        while True:
            self.reap()
            idle = not self.children
            if idle and (not serving or time.monotonic() - last > IDLE_S):
                return
            if not self.root.is_dir():
                return
            watched = [self.listener.fileno(), self.waker_r] if serving else [self.waker_r]
            ready, _, _ = select.select(watched, [], [], 5.0)
            if self.waker_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.waker_r, 512)
            if not serving or self.listener.fileno() not in ready:
                continue
            try:
                conn, _ = self.listener.accept()
            except OSError:  # out of descriptors for a moment: the client starts cold
                continue
            last = time.monotonic()
            try:
                pid = _handle(conn, self.key, self.added, self.close_in_fork)
            except _Refused as refused:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"refused": str(refused)}).encode() + b"\n")
                conn.close()
                print(f"cloudtrain-warm: refused a request: {refused}", flush=True)
                if refused.stale:  # no more requests: the next job starts cold, and a new server
                    serving = False
                    self.stop_listening()
                continue
            self.children[pid] = conn
            print(f"cloudtrain-warm: forked agent {pid}", flush=True)

    def stop_listening(self) -> None:
        """Close the socket, and remove its file unless a newer server's replaced it."""
        if self.listener.fileno() < 0:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        self.listener.close()

    def close_in_fork(self) -> None:
        """In a fork: let go of what is the server's (its other clients' connections too)."""
        self.listener.close()
        for fd in (self.waker_r, self.waker_w, self.lock):
            os.close(fd)
        for conn in self.children.values():
            conn.close()

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": code}).encode() + b"\n")
            conn.close()


class _Refused(Exception):
    def __init__(self, why: str, stale: bool = False) -> None:
        super().__init__(why)
        self.stale = stale


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _line(conn: socket.socket, first: bytes = b"") -> Any:
    """The JSON line the peer sends (after `first`, read already), or None: the peer sends
    nothing after it until it has an answer, so nothing past it is read."""
    conn.settimeout(10)
    chunks = [first]
    while not chunks[-1].endswith(b"\n") and sum(map(len, chunks)) < _MAX_REQUEST:
        more = conn.recv(65536)
        if not more:
            break
        chunks.append(more)
    conn.settimeout(None)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return None


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    conn.settimeout(10)
    data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
    request = _line(conn, data)
    if not isinstance(request, dict) or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise _Refused("a request that is not one")
    return request, fds


def _handle(conn: socket.socket, key: str, added: Mapping[str, str],
            close_server: Callable[[], object]) -> int:  # fmt: skip
    if _peer_uid(conn) != os.getuid():
        raise _Refused("a request from another user")
    try:
        request, fds = _receive(conn)
    except OSError as e:
        raise _Refused(f"a request that could not be read ({e})") from None
    try:
        size, argv = request.get("size"), request.get("argv")
        if not isinstance(size, int) or not isinstance(argv, list):
            raise _Refused("a request without its environment's size and arguments")
        if request.get("key") != key:
            raise _Refused("the job's interpreter, packages or import-time variables are not "
                           "this server's", stale=True)  # fmt: skip
        start, end = _environ_region()
        if size + len(_environ_block(added)) > end - start:
            raise _Refused("the job's environment is larger than this server's room for it")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                close_server()
                _become(conn, request, fds, added, argv)
            except BaseException:  # on the job's stderr once its streams are the job's
                traceback.print_exc()
            finally:
                os._exit(1)
    finally:
        for fd in fds:
            os.close(fd)
    with contextlib.suppress(OSError):  # a client gone: the agent runs on, and is reaped
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _become(
    conn: socket.socket,
    request: Mapping[str, Any],
    fds: Sequence[int],
    added: Mapping[str, str],
    argv: Sequence[str],
) -> None:
    """In the fork: turn into the cold agent `python -m cloudtrain.jobs.elastic ARGV` would
    be, with the job's environment (read here from the client: never by the server) and what
    the server's imports `added`, run it, and exit with its status, which it also tells its
    client itself (the server tells it again, and alone when a signal ended the agent). Never
    returns."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.chdir(str(request["cwd"]))
    os.umask(int(request["umask"]))
    sent = _line(conn)
    if not isinstance(sent, dict):
        raise _Refused("the client sent no environment")
    env = {**added, **{str(k): str(v) for k, v in sent.items()}}
    start, end = _environ_region()
    block = _environ_block(env)
    if len(block) > end - start:  # not as its request said
        raise _Refused("the job's environment is larger than this server's room for it")
    os.environ.clear()  # the C library's environ now lives on the heap, not in the region
    os.environ.update(env)
    ctypes.memmove(start, block + b"\0" * (end - start - len(block)), end - start)
    from cloudtrain.jobs import elastic

    sys.argv = [elastic.__file__, *argv]
    sys.path[0] = os.getcwd()
    elastic.reseed()
    code = _status(lambda: elastic.main(list(argv)))
    threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter ends: threads,
    atexit._run_exitfuncs()  # then exit handlers (a fork's os._exit runs none)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):  # the client takes the first status it reads
        conn.sendall(json.dumps({"status": code}).encode() + b"\n")
    os._exit(code)


def _status(body: Callable[[], object]) -> int:
    """`body`'s exit status as the interpreter would give it."""
    code = 0
    try:
        body()
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    return code & 0xFF


if __name__ == "__main__":
    main()
