"""Host-key pinning against real sshd: the cluster's own host key is accepted, any other refused.

Two sshd processes on loopback addresses (127.0.0.2 and 127.0.0.3: all of 127/8 is loopback),
one presenting the host key cloudtrain made for the cluster (what cloud-init installs on its
nodes), one presenting another key, as a machine in the middle would."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import access
from tests.conftest import require_tool

pytestmark = pytest.mark.integration


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Sshd:
    def __init__(self, folder: Path, host: str, host_key: Path, authorized: str) -> None:
        sshd = require_tool("/usr/sbin/sshd")
        if os.geteuid() != 0:
            pytest.skip("sshd on a test address needs root (CI runs as root)")
        folder.mkdir(parents=True)
        (folder / "authorized_keys").write_text(authorized + "\n")
        self.host, self.port = host, free_port(host)
        config = folder / "sshd_config"
        config.write_text(
            f"ListenAddress {host}:{self.port}\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)],
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((host, self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("sshd did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=10)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[Path, Sshd, Sshd]]:
    home = tmp_path / "home"
    _, user_public = access.cluster_key(home, "c1")
    host_private, _ = access.host_key(home, "c1")
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    good = Sshd(tmp_path / "good", "127.0.0.2", host_private, user_public)
    bad = Sshd(tmp_path / "bad", "127.0.0.3", other, user_public)
    yield home, good, bad
    good.stop()
    bad.stop()


def ssh(home: Path, server: Sshd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", *access.ssh_options(home, "c1"), "-p", str(server.port),
         f"root@{server.host}", "echo", "pinned-ok"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_the_pinned_host_key_is_accepted_and_another_is_refused(
    servers: tuple[Path, Sshd, Sshd],
) -> None:
    home, good, bad = servers
    access.known_hosts(home, "c1", [f"[{good.host}]:{good.port}", f"[{bad.host}]:{bad.port}"])
    accepted = ssh(home, good)
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == "pinned-ok"
    refused = ssh(home, bad)
    assert refused.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr
    assert "Host key verification failed" in refused.stderr
    assert "pinned-ok" not in refused.stdout
