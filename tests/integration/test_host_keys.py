"""Host-key pinning against real sshd: the cluster's own host key is accepted, any other refused.

Two sshd processes on loopback addresses (127.0.0.2 and 127.0.0.3: all of 127/8 is loopback),
one presenting the host key cloudtrain made for the cluster (what cloud-init installs on its
nodes), one presenting another key, as a machine in the middle would."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import access
from tests.sshd import SshHost

pytestmark = pytest.mark.integration


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[Path, SshHost, SshHost]]:
    home = tmp_path / "home"
    _, user_public = access.cluster_key(home, "c1")
    host_private, _ = access.host_key(home, "c1")
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    good = SshHost(tmp_path / "good", "127.0.0.2", host_private, user_public)
    bad = SshHost(tmp_path / "bad", "127.0.0.3", other, user_public)
    yield home, good, bad
    good.stop()
    bad.stop()


def ssh(home: Path, server: SshHost) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", *access.ssh_options(home, "c1"), "-p", str(server.port),
         f"root@{server.host}", "echo", "pinned-ok"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_the_pinned_host_key_is_accepted_and_another_is_refused(
    servers: tuple[Path, SshHost, SshHost],
) -> None:
    home, good, bad = servers
    access.known_hosts(home, "c1", [good.address, bad.address])
    accepted = ssh(home, good)
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == "pinned-ok"
    refused = ssh(home, bad)
    assert refused.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr
    assert "Host key verification failed" in refused.stderr
    assert "pinned-ok" not in refused.stdout
