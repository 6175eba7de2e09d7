"""The Slurm lab (tests/slurmlab.py) as a fixture for every test tier (tests/conftest.py names
this module): a running two-node cluster per test."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import Shell
from tests.slurmlab import SlurmLab, lab
from tests.sshd import SshHost, keygen


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmLab]:
    """Nodes n1 and n2 with 8 a100 GPUs each, idle; stopped afterwards, and the test fails
    if any of its processes (a job's included) outlives it."""
    with lab(tmp_path / "slurm") as running:
        yield running


@pytest.fixture
def slurm_sh(slurm: SlurmLab, tmp_path: Path) -> Shell:
    """The CLI as a user on the lab's login node runs it: Slurm's commands reach the lab."""
    shell = Shell(tmp_path / "home")
    shell.env.update(slurm.client_env)
    return shell


@dataclass(frozen=True)
class LoginNode:
    """The lab's login node over SSH: an sshd on a loopback address of its own whose sessions
    reach the lab (its SLURM_CONF), the user's key and the host key pinned."""

    host: SshHost
    identity: Path
    known_hosts: Path

    def args(self) -> list[str]:
        login = f"root@{self.host.host}:{self.host.port}"
        keys = ["--identity", str(self.identity), "--known-hosts", str(self.known_hosts)]
        return ["--login", login, *keys]

    def shell(self, command: str) -> str:
        """`command` run on the login node (over ssh): its output."""
        keys = ["-i", str(self.identity), "-o", f"UserKnownHostsFile={self.known_hosts}"]
        argv = ["ssh", *keys, "-o", "BatchMode=yes", "-p", str(self.host.port)]
        argv += [f"root@{self.host.host}", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout


@pytest.fixture
def slurm_login(slurm: SlurmLab, tmp_path: Path) -> Iterator[LoginNode]:
    yield from _login(slurm, tmp_path)


@pytest.fixture
def slurm_login_apart(slurm: SlurmLab, tmp_path: Path) -> Iterator[LoginNode]:
    """A login node whose home no node sees (a site without a shared home)."""
    yield from _login(slurm, tmp_path, private_home=True)


def _login(slurm: SlurmLab, tmp_path: Path, private_home: bool = False) -> Iterator[LoginNode]:
    folder = tmp_path / "login"
    folder.mkdir()
    identity = folder / "id_user"
    host_key = folder / "host_key"
    public = keygen(host_key)
    user = keygen(identity)
    env = slurm.client_env
    host = SshHost(folder / "sshd", "127.0.0.4", host_key, user, env=env, private_home=private_home)
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(f"{host.address} {' '.join(public.split()[:2])}\n")
    try:
        yield LoginNode(host, identity, known_hosts)
    finally:
        host.cut()  # its connections too: a client's lingering master goes with them
