"""The login node: where Slurm's commands run and where the clusters' folders live.

``--login local`` is this machine; ``--login user@host[:port]`` is reached over OpenSSH with
cloudtrain's SSH executor: the user's key (``--identity``, default ``~/.ssh/id_ed25519``) and
the login node's host key pinned in their known_hosts (``--known-hosts``), as the ssh provider
takes them, never trusted on first use; one multiplexed connection for every command.

Either way, every file of a cluster's folder is read and written by POSIX commands through that
executor (`Login`), so the two are one code path. The folder is shared with the nodes, whose jobs
may write into it: what is read back is bounded in size and parsed by its reader as untrusted.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import ipaddress
import posixpath
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from cloudtrain import access
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.executors.base import RunResult
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.executors.ssh import SshExecutor

#: The most of one file that is read back from the login node.
READ_LIMIT = 1 << 20
#: How long a login node that refuses or drops connections is retried before `up` gives up.
CONNECT_S = 3.0


class Shell(Protocol):
    """A shell of the login node: a `LocalExecutor` or an `SshExecutor`."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
        stdin: str | None = None,
    ) -> RunResult: ...

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None: ...

    def get(self, remote: str, local: Path) -> bool: ...

    def close(self) -> None: ...


class _Channel(SshExecutor):
    """An SSH executor whose `close` ends only its own commands: every node's shares the one
    connection to the login node, which ssh closes once idle (``ControlPersist``)."""

    HOST_KEY_MISMATCH = (
        "did not present the login node's host key pinned in --known-hosts. Either this is "
        "not the login node (check --login), or someone is in between; nothing was sent to it."
    )

    def close(self) -> None:
        self.stop()


class Login:
    """The login node named by `--login` (checked here: one clear line for a bad one)."""

    def __init__(self, value: object, identity: object = None, known_hosts: object = None) -> None:
        self.where = str(value or "local")
        self.local = self.where == "local"
        if self.local:
            for flag, given in (("--identity", identity), ("--known-hosts", known_hosts)):
                if given:
                    raise ConfigError(f"{flag}: only for a login node over SSH (--login user@host)")
            self._make: Callable[[], Shell] = LocalExecutor
            return
        user, host, port = access.parse_target(self.where, "--login")
        self.identity = Path(str(identity or "~/.ssh/id_ed25519")).expanduser()
        self.known_hosts = Path(str(known_hosts or "~/.ssh/known_hosts")).expanduser()
        options = access.client_options(self.identity, self.known_hosts)

        def make() -> Shell:
            return _Channel(
                host, user=user, port=port, options=options, connect_timeout_s=CONNECT_S
            )

        self._make = make

    def check(self) -> None:
        """`ConfigError` when a file the SSH login needs is missing (before anything runs)."""
        if self.local:
            return
        for path, flag in ((self.identity, "--identity"), (self.known_hosts, "--known-hosts")):
            if not path.is_file():
                raise ConfigError(f"{flag} {str(path)!r} is not a file (for --login {self.where})")

    def channel(self) -> Shell:
        """A shell of its own (a node's executor): closing it ends only its commands."""
        self.check()
        return self._make()

    @functools.cached_property
    def shell(self) -> Shell:
        return self.channel()

    def _sh(self, script: str, *args: str, stdin: str | None = None) -> RunResult:
        return self.shell.run(["sh", "-c", script, "sh", *args], stdin=stdin, timeout=60)

    @functools.cached_property
    def home(self) -> str:
        """The login user's home folder on the login node."""
        said = self._sh('printf "%s\\n" "$HOME"').stdout.strip()
        if not posixpath.isabs(said) or "\n" in said:
            raise ProviderError("slurm", "NoHome", f"{self.where}: no home folder ({said!r})")
        return said

    def folder(self, given: object, default: str) -> str:
        """The absolute folder `given` (``~/…`` in the login user's home), else `default`
        (relative: in that home)."""
        text = str(given or "") or default
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise ConfigError(f"--shared-dir {text!r}: no control characters")
        if text == "~" or text.startswith("~/"):
            text = self.home + text[1:]
        elif not posixpath.isabs(text):
            if given:
                raise ConfigError(f"--shared-dir {text!r}: give an absolute path (or ~/…)")
            text = posixpath.join(self.home, text)
        return posixpath.normpath(text)

    def read(self, path: str) -> str | None:
        """The file's text (its first `READ_LIMIT` bytes); None when it is not a file."""
        return self.read_all([path])[0]

    def read_all(self, paths: Sequence[str]) -> list[str | None]:
        """`read` of each of `paths`, in one command (each file as one line of base64, which no
        byte of a file can break)."""
        if not paths:
            return []
        script = (
            f'for f; do if [ -f "$f" ]; then head -c {READ_LIMIT} -- "$f" | base64 | tr -d "\\n"; '
            "echo; else echo -; fi; done"
        )
        lines = self._sh(script, *paths).stdout.splitlines()
        lines += ["-"] * (len(paths) - len(lines))
        return [_decoded(line) for line in lines[: len(paths)]]

    def addresses(self, names: Sequence[str]) -> dict[str, str]:
        """The IPv4 address that each of `names` (host names) has on the login node, for
        those that resolve there (the first that ``getent ahostsv4`` gives)."""
        if not names:
            return {}
        script = (
            "for n; do a=$(getent ahostsv4 -- \"$n\" | awk 'NR==1 {print $1}'); "
            'printf "%s %s\\n" "$n" "${a:--}"; done'
        )
        found = {}
        for line in self._sh(script, *names).stdout.splitlines():
            name, _, address = line.partition(" ")
            with contextlib.suppress(ValueError):
                if name in names and ipaddress.IPv4Address(address):
                    found[name] = address
        return found

    def write(self, path: str, text: str) -> None:
        """Write `text` (ending with a newline) to `path`, the user's alone, atomically."""
        if not text.endswith("\n"):
            text += "\n"
        script = (
            'umask 077 && mkdir -p -- "$(dirname -- "$1")" && cat > "$1.tmp.$$" '
            '&& mv -f -- "$1.tmp.$$" "$1"'
        )
        self._sh(script, path, stdin=text).check()

    def exists(self, path: str) -> bool:
        return self._sh('test -e "$1"', path).ok

    def remove(self, path: str) -> None:
        self._sh('rm -rf -- "$1"', path).check()

    def listing(self, folder: str, name: str) -> dict[str, str | None]:
        """The folders in `folder`, each with the text of its file `name` (None: none)."""
        script = 'cd "$1" 2>/dev/null || exit 0; for d in */; do printf "%s\\n" "${d%/}"; done'
        names = [n for n in self._sh(script, folder).stdout.splitlines() if n]
        texts = self.read_all([posixpath.join(folder, n, name) for n in names])
        return dict(zip(names, texts, strict=True))


def _decoded(line: str) -> str | None:
    if line == "-":
        return None
    try:
        return base64.b64decode(line, validate=True).decode(errors="replace")
    except ValueError:
        return None
