"""The local executor: commands are subprocesses of this machine.

Used by the local provider, where a "node" is a folder. Detached processes are started through
the same small shell wrapper as on remote nodes (`DETACH_SCRIPT`), so a job's files
(``node.log``, ``pid``, ``exit_code``) look the same everywhere. Every command runs in a
process group of its own, as a remote node's would: the terminal's Ctrl-C reaches the CLI only
(which then says in one line what it stopped), never the node agents or ssh it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, cast

from cloudtrain.errors import CommandError
from cloudtrain.executors import base, received
from cloudtrain.executors.base import (
    DETACH_SCRIPT,
    STREAM_TAIL,
    RunResult,
    sync_listing,
    too_much,
)


class LocalExecutor:
    """Runs commands on this machine. `base_env` is added to this process's environment."""

    def __init__(self, base_env: Mapping[str, str] | None = None) -> None:
        self._base_env = dict(base_env or {})
        self._running: set[subprocess.Popen[str]] = set()  # `close` ends them
        self._lock = threading.Lock()

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**os.environ, **self._base_env, **(env or {})}

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
        stdin: str | None = None,
    ) -> RunResult:
        """As `Executor.run`; `stdin` is written to the command's input (else /dev/null)."""
        args = tuple(argv)
        try:
            if on_output is None:
                return self._capture(args, env, cwd, timeout, stdin)
            return self._stream(args, env, cwd, timeout, on_output, stdin)
        except subprocess.TimeoutExpired:
            raise CommandError(124, args, f"timed out after {timeout} s") from None
        except OSError as exc:
            raise CommandError(127, args, str(exc)) from None

    def _start(
        self,
        args: tuple[str, ...],
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: str | None,
        *,
        stderr: int,
        bufsize: int = -1,
    ) -> subprocess.Popen[str]:
        """Start `args` in a process group of its own (as a node's command: the terminal's
        Ctrl-C is not for it), its stdout piped, tracked for `close`."""
        proc = subprocess.Popen(
            args,
            env=self._env(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            text=True,
            bufsize=bufsize,
            process_group=0,
        )
        with self._lock:
            self._running.add(proc)
        return proc

    def _capture(
        self,
        args: tuple[str, ...],
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
        stdin: str | None,
    ) -> RunResult:
        proc = self._start(args, env, cwd, stdin, stderr=subprocess.PIPE)
        over: list[str] = []  # the stream that sent too much: the command is stopped
        readers = [
            _Reader(cast("IO[str]", pipe), name, proc, over)
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))
        ]
        try:
            if proc.stdin is not None:
                try:
                    with proc.stdin:
                        proc.stdin.write(stdin or "")
                except BrokenPipeError:  # it exited before reading it all
                    pass
            proc.wait(timeout=timeout)
            for reader in readers:
                reader.join()
        finally:
            if proc.poll() is None:  # timed out, or interrupted: do not leak it
                _kill(proc)
                proc.wait()
            for reader in readers:
                reader.join()
            with self._lock:
                self._running.discard(proc)
        if over:
            raise too_much(args, over[0])
        out, err = ("".join(r.parts) for r in readers)
        return RunResult(args, proc.returncode, out, err)

    def _stream(
        self,
        args: tuple[str, ...],
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
        on_output: Callable[[str], None],
        stdin: str | None = None,
    ) -> RunResult:
        proc = self._start(args, env, cwd, stdin, stderr=subprocess.STDOUT, bufsize=1)
        if proc.stdin is not None:
            try:
                with proc.stdin:
                    proc.stdin.write(stdin or "")
            except BrokenPipeError:  # it exited before reading it all: its exit code says why
                pass
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            _kill(proc)

        timer = threading.Timer(timeout, expire) if timeout else None
        if timer:
            timer.start()
        lines: deque[str] = deque(maxlen=STREAM_TAIL)  # what the caller saw: the tail
        try:
            out = cast("IO[str]", proc.stdout)
            while line := out.readline(_LONGEST):  # a line longer comes in pieces
                line = line.rstrip("\n")
                lines.append(line)
                on_output(line)
            code = proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:  # on_output raised (e.g. KeyboardInterrupt): do not leak it
                _kill(proc)
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            with self._lock:
                self._running.discard(proc)
        if timed_out.is_set():
            raise subprocess.TimeoutExpired(args, timeout or 0)
        return RunResult(args, code, "\n".join(lines) + ("\n" if lines else ""), "")

    def start_detached(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, job_dir: str
    ) -> int:
        try:
            Path(job_dir).mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                ["/bin/sh", "-c", DETACH_SCRIPT, "cloudtrain-detach", job_dir, *argv],
                env=self._env(env),
                cwd=cwd,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                check=False,
            )
        except OSError as exc:  # its folder gone (a node removed meanwhile), as `run` says it
            raise CommandError(127, argv, str(exc)) from None
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            raise CommandError(done.returncode, argv, done.stderr or done.stdout)
        return int(done.stdout.strip())

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None:
        target = Path(remote)
        if local.is_file():
            _copy(local, target)
            return
        wanted: set[str] = set()
        for rel, source in sync_listing(local, excludes):
            wanted.add(rel.as_posix())
            if source is None:
                (target / rel).mkdir(parents=True, exist_ok=True)
            else:
                _copy(source, target / rel)
        received.remove_stale(target, wanted)

    def get(self, remote: str, local: Path) -> bool:
        """As `Executor.get`, by `received.copy_tree`: what the node's folder holds is
        untrusted, so only its regular files and folders are copied, never through a link."""
        return received.copy_tree(Path(remote), local)

    def close(self) -> None:
        """End the commands still running (from other threads: a job's log followed, a setup
        when Ctrl-C left it; nothing reads what they say any more). Idempotent."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            if proc.poll() is None:
                _kill(proc)


class _Reader(threading.Thread):
    """Reads one of a command's pipes to its end, keeping at most `base.MAX_OUTPUT`: past it,
    the command is stopped and `over` names the pipe."""

    def __init__(
        self, pipe: IO[str], name: str, proc: subprocess.Popen[str], over: list[str]
    ) -> None:
        super().__init__(daemon=True)
        self.pipe, self.name, self.proc, self.over = pipe, name, proc, over
        self.parts: list[str] = []
        self.start()

    def run(self) -> None:
        kept = 0
        with self.pipe:
            while chunk := self.pipe.read(1 << 16):
                kept += len(chunk)
                if kept > base.MAX_OUTPUT:
                    self.over.append(self.name)
                    _kill(self.proc)
                    return
                self.parts.append(chunk)


def _kill(proc: subprocess.Popen[str]) -> None:
    """KILL `proc` and what it started in its process group (a shell's ``sleep`` would keep
    its output open, and whoever reads it waiting)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


#: The longest piece of a streamed command's output handed on at once (a node's line, however
#: long, is never all held here).
_LONGEST = 1 << 20
_UNBOUNDED = 1 << 62  # the user's own files: no bound but the disk


def _copy(src: Path, dst: Path) -> None:
    """`received.copy_if_changed` of the user's own file (a link in the workdir is followed,
    as the user made it), keeping its owner's mode bits only: the copy is the user's alone."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as f:
        st = os.fstat(f.fileno())
        mode = stat.S_IMODE(st.st_mode) & 0o700
        received.copy_if_changed(f, st, dst, budget=_UNBOUNDED, mode=mode)
