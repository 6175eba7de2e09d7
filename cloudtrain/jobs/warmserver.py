"""The node's warm server (`cloudtrain.jobs.warm` says what it is for and what it promises):
it imports what a torchrun agent and its workers import, then forks an agent for each request
of this user's clients, each with its job's streams, folder, umask, environment and arguments,
and sends each client its agent's exit status. Started as ``python -m
cloudtrain.jobs.warmserver ROOT`` (`warm.start`)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.jobs import warm
from cloudtrain.jobs.warm import IDLE_S, STARTING, fingerprint, folder

_MAX_REQUEST = 4 << 20


def serve(root: Path, held: int | None = None) -> int:
    """Import what an agent and its workers import, then fork an agent for each request.
    `held`: the descriptor of the node's lock, taken for this server by `warm.start` (which
    made the `STARTING` file too); None: take it here."""
    here = folder(root)
    starting = here / STARTING
    if held is None:
        lock, taken = warm.lock_node(here)
        if not taken:
            os.close(lock)
            return 0  # another server holds the node
        starting.touch(mode=0o600)
    else:
        lock = held
        os.set_inheritable(lock, False)  # the forked agents' jobs must not hold it
    try:
        return _serve(root, lock)
    finally:
        starting.unlink(missing_ok=True)


def _serve(root: Path, lock: int) -> int:
    here = folder(root)
    from cloudtrain.jobs import elastic

    before = dict(os.environ)
    key = fingerprint(before)
    for name in (
        "torch",
        "torch.distributed.run",
        "torch.distributed.launcher.api",
        *elastic.PRELOAD,
    ):
        importlib.import_module(name)
    # What those imports set (torch._inductor's cache folder…): a cold agent's imports set it
    # in the job's environment, so each fork adds it to its job's.
    added = {k: v for k, v in os.environ.items() if k not in before}
    path = here / "sock"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    # Before the socket: a start that finds it listening compares its job's key with this.
    (here / "key.new").unlink(missing_ok=True)
    fd = os.open(here / "key.new", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as f:
        f.write(key)
    os.replace(here / "key.new", here / warm.KEY)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        with warm.unix_address(path) as address:
            listener.bind(address)
    finally:
        os.umask(old)
    listener.listen(16)
    (here / STARTING).unlink(missing_ok=True)
    print(f"cloudtrain-warm: serving on {path} (pid {os.getpid()})", flush=True)
    server = _Server(root, listener, path, key, lock, added)
    try:
        server.loop()
    finally:
        server.stop_listening()
    return 0


class _Server:
    """The accept loop: one request at a time (a fork takes milliseconds), each fork's exit
    status sent to its client when the fork ends."""

    def __init__(
        self,
        root: Path,
        listener: socket.socket,
        path: Path,
        key: str,
        lock: int,
        added: Mapping[str, str],
    ) -> None:
        self.root, self.listener, self.key, self.lock = root, listener, key, lock
        self.added = added
        self.children: dict[int, socket.socket] = {}
        self.waker_r, self.waker_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.path = path
        self.inode = os.stat(path).st_ino  # (a socket's own fstat is another inode)

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


def _handle(
    conn: socket.socket, key: str, added: Mapping[str, str], close_server: Callable[[], object]
) -> int:
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
            raise _Refused(
                "the job's interpreter, packages, import-time variables or confinement "
                "(cgroups, limits, CPUs) are not this server's",
                stale=True,
            )
        if request.get("retire"):  # (from a `warm.start` for this server's jobs: nothing to do)
            raise _Refused("a request to retire from a job this server serves")
        start, end = warm.environ_region()
        if size + len(warm.environ_block(added)) > end - start:
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
    start, end = warm.environ_region()
    block = warm.environ_block(env)
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
    sys.exit(serve(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None))
