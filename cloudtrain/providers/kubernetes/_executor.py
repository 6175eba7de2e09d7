"""One pod, reached through the API's exec (the WebSocket channels ``kubectl exec`` uses).

A command runs as the exec's process in the pod's one container (`run`). Its environment and
folder travel on its stdin, read by a few lines of Python before it replaces itself with the
command (`RUNNER`): never on the command line, which the API server's audit log keeps. A command
given neither runs as it is (``cat`` of a status needs no Python). A detached start
(`start_detached`) is the executors' `DETACH_SCRIPT`, run the same way: what it starts outlives
the exec, as a process of the container, until the pod goes.

Files travel as tar streams through exec, as ``kubectl cp`` moves them: `put` sends what the
sync would copy (`sync_listing`) to ``python -c files unpack DEST`` in the pod
(`cloudtrain.node.files`), `get` reads ``files pack SRC`` into a bounded file here and unpacks
it with `received.untar`, which takes it as untrusted. A transfer is whole each time, as on a
Slurm site without a shared home.

A connection that breaks, or an exec the API server refuses because the pod is gone, reads as
``SSH_FAILED`` (the command's status is unknown): the core's word for "the node did not
answer".
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import CommandError, NodeDataError, ProviderError
from cloudtrain.executors import base, received
from cloudtrain.executors.base import (
    DETACH_SCRIPT,
    SSH_FAILED,
    STREAM_TAIL,
    RunResult,
    sync_listing,
    too_much,
)
from cloudtrain.node import files
from cloudtrain.providers.kubernetes._api import Api

#: The container of a node's pod (`_pods.pod`).
CONTAINER = "node"
#: Reads one JSON line ({"argv", "env", "cwd"}) from stdin, then becomes the command, with
#: /dev/null as its stdin.
RUNNER = """\
import json, os, sys
line = b""
while not line.endswith(b"\\n"):
    more = os.read(0, 1)
    if not more:
        sys.exit("cloudtrain: no command came")
    line += more
r = json.loads(line)
if r.get("cwd"):
    os.chdir(r["cwd"])
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
env = dict(os.environ)
env.update(r.get("env") or {})
try:
    os.execvpe(r["argv"][0], r["argv"], env)
except OSError as e:
    sys.stderr.write("cloudtrain: %s: %s\\n" % (r["argv"][0], e.strerror))
    sys.exit(127)
"""
#: Bytes of stdin per WebSocket frame.
CHUNK = 1 << 16
#: The most frames one `update` of the exec's WebSocket reads (`_in_batches`).
BATCH = 64


class ExecExecutor:
    """Runs commands in the pod `pod` through the API's exec."""

    def __init__(self, api: Api, pod: str, python: str) -> None:
        self.api = api
        self.pod = pod
        self.python = python

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> RunResult:
        if env or cwd:
            request = json.dumps({"argv": list(argv), "env": dict(env or {}), "cwd": cwd})
            command, stdin = [self.python, "-c", RUNNER], [request.encode() + b"\n"]
        else:
            command, stdin = list(argv), None
        code, out, err = self._exec(command, stdin, timeout=timeout, on_output=on_output)
        if on_output is not None:  # what `run` keeps of a streamed output: its tail
            lines = (out + err).decode("utf-8", "replace").splitlines(keepends=True)
            return RunResult(tuple(argv), code, "".join(lines[-STREAM_TAIL:]), "")
        return RunResult(
            tuple(argv), code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        )

    def start_detached(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, job_dir: str
    ) -> int:
        self.run(["mkdir", "-p", "-m", "700", job_dir], timeout=60).check()
        done = self.run(
            ["sh", "-c", DETACH_SCRIPT, "cloudtrain-detach", job_dir, *argv],
            env=env, cwd=cwd, timeout=120,
        )  # fmt: skip
        pid = done.stdout.strip().splitlines()[-1:] or [""]
        if done.returncode != 0 or not pid[0].isdigit():
            raise CommandError(done.returncode, tuple(argv), done.stderr or done.stdout)
        return int(pid[0])

    def files(self, texts: Mapping[str, str], *, unless: str | None = None) -> bool:
        """Write `texts` (path: text) in the pod, atomically and the user's alone, unless the
        path `unless` exists there: whether they were written."""
        request = json.dumps({"files": dict(texts), "unless": unless}) + "\n"
        command = [self.python, "-c", files.source(), "files"]
        code, out, err = self._exec(command, [request.encode()], timeout=120)
        if code != 0:
            raise CommandError(code, ("files", *texts), (err or out).decode("utf-8", "replace"))
        return out.decode("utf-8", "replace").strip().endswith("written")

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None:
        command = [self.python, "-c", files.source(), "unpack", remote]
        code, out, err = self._exec(command, _tar(local, excludes), timeout=3600)
        if code != 0:
            said = (err or out).decode("utf-8", "replace")
            raise CommandError(code, ("put", str(local), remote), said)

    def get(self, remote: str, local: Path) -> bool:
        # `received.untar` holds the files to `limit()`; this bound, with room for the tar's
        # headers and padding, keeps a pod that lies from filling this machine's disk
        limit = received.limit()
        bound = limit + (limit >> 6) + (1 << 20)
        command = [self.python, "-c", files.source(), "pack", remote]
        with tempfile.TemporaryDirectory() as here:
            tar = Path(here) / "data.tar"
            with open(tar, "wb") as sink:
                code, _, err = self._exec(command, None, timeout=3600, sink=sink, bound=bound)
            if code == 3:
                return False  # no such folder in the pod
            if tar.stat().st_size >= bound:
                raise NodeDataError(received.too_large(local, limit))
            if code != 0:
                raise CommandError(code, ("get", remote), err.decode("utf-8", "replace"))
            received.untar(tar, local)
        return True

    def close(self) -> None:
        """Nothing held between commands: each exec is its own connection."""

    # -- the exec ------------------------------------------------------------------------------

    def _exec(
        self,
        command: Sequence[str],
        stdin: Iterable[bytes] | None,
        *,
        timeout: float | None,
        on_output: Callable[[str], None] | None = None,
        sink: io.BufferedWriter | None = None,
        bound: int = 0,
    ) -> tuple[int, bytes, bytes]:
        """Run `command` in the pod: its status, stdout and stderr. With `sink`, stdout goes
        there instead, cut at `bound` bytes (the command is then stopped)."""
        from kubernetes.stream import stream

        what = f"exec in pod {self.pod}"
        try:
            with self.api.calling(what), self.api.exec_core() as core:
                ws = stream(
                    core.connect_get_namespaced_pod_exec,
                    self.pod,
                    self.api.namespace,
                    container=CONTAINER,
                    command=list(command),
                    stdin=stdin is not None,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    binary=True,
                    _preload_content=False,
                    _request_timeout=60,
                )
        except ProviderError as exc:  # refused (the pod is gone, or not running) or unreachable
            return SSH_FAILED, b"", f"{exc}\n".encode()
        _in_batches(ws)
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err, status = bytearray(), bytearray(), bytearray()
        partial = [b""]
        written = 0

        def drain() -> None:
            nonlocal written
            got_out, got_err = ws.read_channel(1), ws.read_channel(2)
            status.extend(ws.read_channel(3))
            if sink is not None and got_out:
                room = max(0, bound - written)
                sink.write(got_out[:room])
                written += min(len(got_out), room)
            elif got_out:
                out.extend(got_out)
            err.extend(got_err)
            if on_output is not None and (got_out or got_err):
                text = partial[0] + got_out + got_err
                *whole, partial[0] = text.split(b"\n")
                for line in whole:
                    on_output(line.decode("utf-8", "replace"))
                _keep_tail(out)
                _keep_tail(err)

        try:
            if stdin is not None:
                for chunk in stdin:
                    for at in range(0, len(chunk), CHUNK):
                        ws.write_stdin(chunk[at : at + CHUNK])
                        ws.update(timeout=0)
                        drain()
                ws.close_channel(0)  # v5: the command sees the end of its input
            while ws.is_open():
                ws.update(timeout=0.2)
                drain()
                if sink is not None and written >= bound:
                    break  # more than it may send: stopped, refused by the caller
                over = [n for n, b in (("stdout", out), ("stderr", err), ("status", status))
                        if len(b) > base.MAX_OUTPUT]  # fmt: skip
                if over:
                    raise too_much(command, over[0])  # and the exec is closed
                if deadline is not None and time.monotonic() > deadline:
                    raise CommandError(124, tuple(command), f"timed out after {timeout:.0f} s")
            drain()
        except (OSError, ValueError) as exc:  # the connection broke
            return SSH_FAILED, bytes(out), bytes(err) + f"\n{what}: {exc}\n".encode()
        finally:
            _close(ws)
        if on_output is not None and partial[0]:
            on_output(partial[0].decode("utf-8", "replace"))
        return _status(bytes(status)), bytes(out), bytes(err)


def _in_batches(ws: Any) -> None:
    """Make `ws.update` return after `BATCH` frames at most. The client's (37) reads every
    frame already waiting before it returns: under a command that writes without end (a pod
    that lies, or `yes`) it never did, and neither a bound nor a deadline of ours was checked
    (seen). It asks `_frames_immediately_available` whether to go on; older clients do not,
    and are unchanged."""
    waiting = getattr(ws, "_frames_immediately_available", None)
    if waiting is None:
        return
    read = [0]

    def in_batch() -> bool:
        read[0] += 1
        if read[0] >= BATCH:
            read[0] = 0
            return False
        return bool(waiting())

    ws._frames_immediately_available = in_batch


def _close(ws: Any) -> None:
    """Close the exec's WebSocket, and its socket: websocket-client's `close`, once it has
    answered the server's close frame (how an API server ends every exec), returns without
    closing the socket."""
    with contextlib.suppress(Exception):
        ws.close()
    with contextlib.suppress(Exception):
        ws.sock.shutdown()


def _status(said: bytes) -> int:
    """The command's exit status from the error channel's Status (empty: the connection went
    before it ended, `SSH_FAILED`)."""
    try:
        found: Any = json.loads(said.decode("utf-8", "replace")) if said.strip() else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        return SSH_FAILED
    if found.get("status") == "Success":
        return 0
    causes = (found.get("details") or {}).get("causes") or []
    for cause in causes:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            text = str(cause.get("message", ""))
            if text.isdigit() and int(text) != SSH_FAILED:
                return int(text)
    return 127 if "not found" in str(found.get("message", "")) else 126


def _keep_tail(buffer: bytearray) -> None:
    """Keep the last lines of a streamed output (`STREAM_TAIL`, with room)."""
    if len(buffer) > 1 << 20:
        del buffer[: len(buffer) - (1 << 20)]


def _tar(local: Path, excludes: Sequence[str]) -> Iterator[bytes]:
    """`local` as a tar stream whose top is ``data`` (a folder: what a sync copies of it)."""
    pipe = io.BytesIO()

    def take() -> bytes:
        data = pipe.getvalue()
        pipe.seek(0)
        pipe.truncate()
        return data

    # what the user linked into the workdir goes as the file it names (as rsync -L would)
    with tarfile.open(fileobj=pipe, mode="w|", format=tarfile.PAX_FORMAT, dereference=True) as tar:
        if local.is_dir():
            for rel, path in sync_listing(local, excludes):
                name = "data" if str(rel) == "." else f"data/{rel.as_posix()}"
                tar.add(path if path is not None else local / rel, name, recursive=False)
                yield take()
        else:
            tar.add(local, "data", recursive=False)
    yield take()
