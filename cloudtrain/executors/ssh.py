"""The SSH executor: one node reached with the OpenSSH client, over one multiplexed connection.

Why OpenSSH and not asyncssh or paramiko: it is on every machine that has SSH at all, it speaks
every key type, agent and jump-host setup the user's own ``ssh`` does, ``ControlMaster``
multiplexing makes every command after the first a new channel on one connection (no new
handshake), and ``rsync -e ssh`` reuses that connection for incremental syncs. Each command is
one subprocess, so hundreds of nodes fan out over threads (`fan_out`) without an event loop,
and tests run it against real ``sshd`` processes.

Security: the cluster's own key only, its pinned host key only (`cloudtrain.access.ssh_options`:
``StrictHostKeyChecking=yes`` against the cluster's known_hosts, never trust-on-first-use).
Every value placed in a remote command (argv, env, paths) is shell-quoted.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shlex
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from cloudtrain import access
from cloudtrain.errors import CommandError, ConfigError, ProviderError
from cloudtrain.executors import received
from cloudtrain.executors.base import DETACH_SCRIPT, RunResult, rsync_rules
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.spec import ENV_NAME_RE

log = logging.getLogger(__name__)

HOST_KEY_CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed")
UNREACHABLE = ("Connection refused", "Connection timed out", "No route to host",
               "Connection reset", "Could not resolve hostname", "Connection closed")  # fmt: skip


def control_dir() -> Path:
    """A short folder for ControlMaster sockets (a socket path must stay under 108 bytes), in
    the shared temp folder: made 0700, and refused (`ConfigError`) when it is a symlink or
    another user's, since whoever controls it could put a socket there that ssh would
    reuse as a connection to the nodes."""
    folder = Path(tempfile.gettempdir()) / f"cloudtrain-ssh-{os.getuid()}"
    with contextlib.suppress(FileExistsError):  # whatever it is, it is looked at next
        folder.mkdir(mode=0o700)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        what = (
            "a symlink"
            if stat.S_ISLNK(found.st_mode)
            else (
                "not a folder"
                if not stat.S_ISDIR(found.st_mode)
                else f"owned by uid {found.st_uid}"
            )
        )
        raise ConfigError(
            f"ssh control folder {folder} is {what}, not this user's own folder: remove it, or "
            "set TMPDIR to a folder only you can write"
        )
    if stat.S_IMODE(found.st_mode) & 0o077:
        folder.chmod(0o700)
    return folder


def remote_script(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: str | None = None,
) -> str:
    """The script ``sh -s`` on the node reads from ssh's stdin: umask 077 (what the command
    and all it starts write is the node user's alone), `env` exported, into `cwd`, then
    `argv` in the shell's place, every value quoted, its input `stdin` (a here-document: text,
    a last newline added where it has none) or else /dev/null. Carried on stdin, not in the
    command line, so no value shows in any process list: not in the local ssh's argv, not in
    the node's shell's."""
    lines = ["umask 077"]  # what it writes on the node is the node user's alone
    for key, value in (env or {}).items():
        if not ENV_NAME_RE.fullmatch(key):  # the shell would read it as code
            raise ConfigError(f"{key!r} is not a valid environment variable name")
        lines.append(f"export {key}={shlex.quote(value)}")
    if cwd:
        lines.append(f"cd {shlex.quote(cwd)} || exit 1")
    if stdin is None:
        lines.append(f"exec {shlex.join(argv)} < /dev/null")
        return "\n".join(lines) + "\n"
    end = _here_end(stdin)
    body = stdin if stdin.endswith("\n") or not stdin else stdin + "\n"
    lines.append(f"exec {shlex.join(argv)} <<'{end}'")
    return "\n".join(lines) + "\n" + body + end + "\n"


def _here_end(text: str) -> str:
    """A here-document's end word that is no line of `text` (random: a text cannot plan it)."""
    lines = set(text.splitlines())
    while True:
        end = f"CLOUDTRAIN_STDIN_{secrets.token_hex(8)}"
        if end not in lines:
            return end


#: rsync's ``--modify-window`` that compares mtimes to the nanosecond, not the second (rsync
#: 3.1.3 and later; an older one's window of -1 never matches, so it copies: never stale).
NANOSECONDS = -1
#: The command line every command runs under: the script comes on stdin.
REMOTE_SHELL = "sh -s"


class SshExecutor:
    """Runs commands on `host` as `user` through OpenSSH with `options` (keys, known_hosts).

    `connect_timeout_s` bounds the retries while a node boots (connection refused/timed out);
    a changed host key or a refused login fails at once."""

    #: What a host that presents another key is told to be (after its address).
    HOST_KEY_MISMATCH: ClassVar[str] = (
        "did not present the cluster's pinned host key. Either this is not the node cloudtrain "
        "made (check the address), or someone is in between; nothing was sent to it."
    )

    def __init__(
        self,
        host: str,
        *,
        user: str,
        options: Sequence[str],
        port: int = 22,
        connect_timeout_s: float = 300,
        retry_s: float = 2.0,
        loopback_only: bool = False,
    ) -> None:
        access.check_login(user, host, "ssh target")  # never an option to ssh or rsync
        self.host, self.user, self.port = host, user, port
        #: refuse to connect unless `host` is on this machine's loopback (a provider pointed
        #: at a local stand-in sets it; so does ``CLOUDTRAIN_SSH_LOOPBACK_ONLY=1``)
        self.loopback_only = loopback_only
        # One master per (target, options): a connection made under another key or another
        # known_hosts must never be reused (ssh's own %C hashes only host, port and user).
        digest = hashlib.sha256("\0".join([*options, user, host, str(port)]).encode())
        self._options = [
            *options,
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={control_dir()}/{digest.hexdigest()[:32]}",
            "-o", "ControlPersist=120",
            "-o", "ServerAliveInterval=15",
            "-p", str(port),
        ]  # fmt: skip
        self.connect_timeout_s = connect_timeout_s
        self.retry_s = retry_s
        self._local = LocalExecutor()
        self._connected = False

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}"

    def _ssh(self, command: str) -> list[str]:
        return ["ssh", *self._options, "--", self.target, command]

    def _connect(self) -> None:
        """Open the master connection, retrying (bounded) while the host is not up yet."""
        if self._connected:
            return
        by_env = os.environ.get("CLOUDTRAIN_SSH_LOOPBACK_ONLY") == "1"
        if (by_env or self.loopback_only) and not access.is_loopback(self.host):
            why = (
                "CLOUDTRAIN_SSH_LOOPBACK_ONLY=1 (set by test suites so that no packet leaves "
                "the machine)"
                if by_env
                else "its provider's endpoint is a local stand-in, "
                "whose node addresses are invented"
            )
            raise ProviderError(
                "ssh", "Blocked", f"{self.host} is not a loopback address and {why}"
            )
        check = self._local.run(
            ["ssh", *self._options, "-O", "check", "--", self.target], timeout=30
        )
        if check.returncode == 0:  # a master from an earlier command is still up: reuse it
            self._connected = True
            return
        deadline = time.monotonic() + self.connect_timeout_s
        delay = self.retry_s
        while True:
            done = self._local.run(self._ssh("true"), timeout=60)
            if done.returncode == 0:
                self._connected = True
                return
            message = done.stderr.strip()
            if any(m in message for m in HOST_KEY_CHANGED):
                raise ProviderError(
                    "ssh",
                    "HostKeyMismatch",
                    f"{self.host}:{self.port} {self.HOST_KEY_MISMATCH}",
                )
            unreachable = any(m in message for m in UNREACHABLE)
            expired = time.monotonic() > deadline
            if not unreachable or expired:
                last = message.splitlines()[-1] if message else f"ssh exited {done.returncode}"
                waited = f" after {self.connect_timeout_s:.0f} s" if expired else ""
                raise ProviderError(
                    "ssh",
                    "Unreachable" if unreachable else "Refused",
                    f"cannot reach {self.target}:{self.port}{waited}: {last}",
                )
            log.info("%s not reachable yet (%s); retrying in %.0f s", self.host, message, delay)
            time.sleep(delay)
            delay = min(delay * 1.5, 15)

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
        """As `Executor.run`; `stdin` is the command's input (text), else /dev/null."""
        self._connect()
        done = self._local.run(
            self._ssh(REMOTE_SHELL),
            timeout=timeout,
            on_output=on_output,
            stdin=remote_script(argv, env, cwd, stdin),
        )
        return RunResult(tuple(argv), done.returncode, done.stdout, done.stderr)

    def start_detached(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, job_dir: str
    ) -> int:
        self._connect()
        inner = ["setsid", "sh", "-c", DETACH_SCRIPT, "cloudtrain-detach", job_dir, *argv]
        script = f"umask 077\nmkdir -p {shlex.quote(job_dir)} || exit 1\n"
        script += remote_script(inner, env, cwd)
        done = self._local.run(self._ssh(REMOTE_SHELL), timeout=120, stdin=script)
        pid = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0 or not pid.isdigit():
            raise CommandError(done.returncode, argv, done.stderr or done.stdout)
        return int(pid)

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None:
        """rsync over the same connection: only what changed moves; a directory's copy is
        made equal to the source (--delete), minus what the ignores name (`rsync_rules`, the
        rules `sync_listing` walks by). What arrives is the node user's alone (group and
        others lose every bit, as at home)."""
        self._connect()
        ssh = shlex.join(["ssh", *self._options])
        argv = ["rsync", "-az", "--no-specials", "--no-devices", "--chmod=go-rwx", "--delete",
                f"--modify-window={NANOSECONDS}", "-e", ssh]  # fmt: skip
        if local.is_dir():
            argv += rsync_rules(local, excludes)
            source, parent = f"{local}/", remote
        else:
            source, parent = str(local), str(Path(remote).parent)
        mkdir = self.run(["mkdir", "-p", parent])
        mkdir.check()
        argv += ["--", source, f"{self.target}:{shlex.quote(remote)}"]
        self._local.run(argv, timeout=3600).check()

    def get(self, remote: str, local: Path) -> bool:
        """rsync from the node over the same connection (its temp-file-then-rename writes
        leave hard links to the old files as they were). What the node sends is untrusted
        (`cloudtrain.executors.received`): regular files and folders only (rsync is asked for
        no links, devices, owners or modes; what arrives anyway is removed), private, no
        save in progress (`received.IN_PROGRESS`), and at most ``received.limit()`` bytes
        (`NodeDataError`)."""
        if not self.run(["test", "-d", remote]).ok:
            return False
        local.mkdir(mode=0o700, parents=True, exist_ok=True)
        received.scrub(local)  # a copy made before these rules held may keep a link
        ssh = shlex.join(["ssh", *self._options])
        source = f"{self.target}:{shlex.quote(remote.rstrip('/') + '/')}"
        argv = ["rsync", "-rt", "--perms", "--chmod=D700,F600", "--delete", "-e", ssh]
        argv += [f"--modify-window={NANOSECONDS}"]  # a save again within the second: new
        argv += [f"--exclude={p}" for p in received.IN_PROGRESS]  # only whole checkpoints
        argv += ["--delete-excluded", "--", source, f"{local}/"]
        try:
            code, output = received.run_bounded(argv, local, timeout=3600)
        except subprocess.TimeoutExpired:
            raise CommandError(124, argv, "timed out after 3600 s") from None
        if code != 0:
            raise CommandError(code, argv, output)
        received.scrub(local)
        return True

    def close(self) -> None:
        """Close the master connection, also one left by an interrupted first connect (ssh
        backgrounds the master before `_connect` knows it succeeded). Idempotent. Without it
        the master lingers ``ControlPersist`` seconds, for the next command to reuse."""
        self._local.run(["ssh", *self._options, "-O", "exit", "--", self.target], timeout=30)
        self._connected = False

    def stop(self) -> None:
        """End this object's commands still running (as `LocalExecutor.close`), and keep the
        master connection, which other executors of the same target may be using."""
        self._local.close()

    def release(self) -> None:
        """Forget this object but keep the master connection for the next one (it closes
        itself after ``ControlPersist`` idle seconds)."""
        self._connected = False
