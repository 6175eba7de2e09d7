"""Real sshd test hosts on loopback addresses (127.0.0.2, 127.0.0.3 …: all of 127/8 is loopback),
each with its own config, host key, port and authorized_keys, stopped by PID afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from cloudtrain import access
from tests.conftest import require_tool, unavailable


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class SshHost:
    """One sshd on `host` presenting `host_key`, letting `authorized` log in as root, whose
    sessions have `home` as their ~ (``FOLDER/home`` unless given) and `env` (no spaces) set.
    With `private_home`, sshd runs in a mount namespace of its own with an empty tmpfs on `home`:
    what its sessions keep there no other process sees (a login node whose home is its own)."""

    def __init__(
        self,
        folder: Path,
        host: str,
        host_key: Path,
        authorized: str,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        private_home: bool = False,
    ) -> None:
        sshd = require_tool("/usr/sbin/sshd")
        if os.geteuid() != 0:
            unavailable("sshd on a test address needs root (CI runs as root)")
        folder.mkdir(parents=True, exist_ok=True)
        self.home = home or folder / "home"
        self.home.mkdir(exist_ok=True)
        _pip_config(self.home)
        (folder / "authorized_keys").write_text(authorized + "\n")
        self.folder, self.host, self.port = folder, host, free_port(host)
        config = folder / "sshd_config"
        settings = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        config.write_text(
            f"ListenAddress {host}:{self.port}\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nMaxSessions 100\n"
            f"MaxStartups 100\nSetEnv HOME={self.home} {settings}\n"
            # A home of the test's own, as a fresh node's: what a provider keeps in ~ is no other
            # test's, so tests that list it can run at once; and no session of a lab host runs
            # the ~/.bashrc of this machine's own user (bash reads it in every ssh session:
            # pyenv's here, 0.14 s of CPU each time, in some 1,500 sessions a suite).
        )
        self._argv = [sshd, "-D", "-e", "-f", str(config)]
        if private_home:
            mount = 'mount -t tmpfs -o mode=0700 tmpfs "$0" && exec "$@"'
            apart = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount]
            self._argv = [*apart, str(self.home), *self._argv]
        self.start()

    def start(self) -> None:
        """Start (again, after `cut`) listening on the same address and port."""
        Path("/run/sshd").mkdir(exist_ok=True)
        self.proc = subprocess.Popen(self._argv, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((self.host, self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd on {self.host}:{self.port} did not start")

    def cut(self) -> None:
        """The host goes away: the listener and every connection's sshd die at once (what
        they started in a session of its own, like a detached job, lives on: the test kills
        it, as the host's death would)."""
        doomed = [self.proc.pid, *_descendants(self.proc.pid, comm="sshd")]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    @property
    def address(self) -> str:
        """How known_hosts names it."""
        return f"[{self.host}]:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _pip_config(home: Path) -> None:
    """This user's pip configuration in `home` too: a host's pip reaches packages the way this
    machine's does (an offline machine's mirror is in it)."""
    for name in (".config/pip/pip.conf", ".pip/pip.conf"):
        mine, theirs = Path.home() / name, home / name
        if mine.is_file() and mine != theirs and not theirs.exists():
            theirs.parent.mkdir(parents=True, exist_ok=True)
            theirs.write_bytes(mine.read_bytes())


def _descendants(root: int, comm: str) -> list[int]:
    """PIDs below `root` (any depth) whose command name is `comm`, from /proc."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            text = stat.read_text()
            pid, rest = int(text.split(" ", 1)[0]), text.rsplit(")", 1)[1].split()
            names[pid] = text[text.index("(") + 1 : text.rindex(")")]
            children.setdefault(int(rest[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            if names.get(child) == comm:
                found.append(child)
    return found


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


class Lab:
    """Two hosts, the user's key, a known_hosts pinning both host keys."""

    def __init__(self, folder: Path, addresses: tuple[int, ...] = (2, 3)) -> None:
        """Every host's sessions have `home` (``FOLDER/home``) as their ~."""
        folder.mkdir(parents=True)
        self.home = folder / "home"
        self.home.mkdir()
        self.identity = folder / "id_user"
        user_public = keygen(self.identity)
        self.hosts: list[SshHost] = []
        lines = []
        for i in addresses:
            host_key = folder / f"host{i}"
            public = keygen(host_key)
            host = SshHost(folder / f"h{i}", f"127.0.0.{i}", host_key, user_public, self.home)
            self.hosts.append(host)
            lines.append(f"{host.address} {' '.join(public.split()[:2])}\n")
        self.known_hosts = folder / "known_hosts"
        self.known_hosts.write_text("".join(lines))

    def host_list(self) -> list[str]:
        return [f"root@{h.host}:{h.port}" for h in self.hosts]

    def up_args(self, name: str, hosts: list[str] | None = None) -> list[str]:
        listed = hosts or self.host_list()
        return ["up", "--provider", "ssh", "--name", name, "--hosts", ",".join(listed),
                "--identity", str(self.identity), "--known-hosts", str(self.known_hosts),
                "--python", sys.executable]  # fmt: skip

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()


@contextlib.contextmanager
def cluster_hosts(folder: Path, *addresses: str) -> Iterator[tuple[Path, list[SshHost]]]:
    """sshd hosts on `addresses` presenting cluster ``c1``'s host key, with its key authorised
    and their keys pinned in the home it makes under `folder`: (that home, the hosts)."""
    home = folder / "home"
    _, user_public = access.cluster_key(home, "c1")
    host_private, _ = access.host_key(home, "c1")
    up = [SshHost(folder / f"h{i}", a, host_private, user_public) for i, a in enumerate(addresses)]
    access.known_hosts(home, "c1", [h.address for h in up])
    try:
        yield home, up
    finally:
        for host in up:
            host.stop()
