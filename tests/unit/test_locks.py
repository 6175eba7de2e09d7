"""One writer per cluster, between real processes; keys made by several processes at once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cloudtrain import locks
from cloudtrain.errors import ClusterBusyError, ConfigError

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from cloudtrain import locks
    with locks.cluster_lock(Path(sys.argv[1]), sys.argv[2], "up"):
        print("held", flush=True)
        time.sleep(60)
    """
)


def hold(home: Path, cluster: str) -> subprocess.Popen[str]:
    """Another process that holds `cluster`'s lock until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home), cluster], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_second_writer_waits_naming_the_holder_then_gives_up(tmp_path: Path) -> None:
    holder = hold(tmp_path, "c1")
    told: list[str] = []
    try:
        with (
            pytest.raises(ClusterBusyError, match=rf"pid {holder.pid} \(up\) holds it; gave up"),
            locks.cluster_lock(tmp_path, "c1", "down", wait_s=0.3, on_wait=told.append),
        ):
            pytest.fail("the lock was taken twice")
        assert told == [f"cluster 'c1' is busy: pid {holder.pid} (up) holds it; waiting up to 0 s"]
        with locks.cluster_lock(tmp_path, "c2", "up", wait_s=0):
            pass  # another cluster is not held up
    finally:
        stop(holder)
    with locks.cluster_lock(tmp_path, "c1", "down", wait_s=5):  # the kernel released it
        pass
    path = tmp_path / "locks" / "c1.lock"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_waiter_gets_the_lock_when_the_holder_lets_go(tmp_path: Path) -> None:
    holder = hold(tmp_path, "c1")
    waiter = subprocess.Popen(
        [sys.executable, "-c", HOLD.replace("time.sleep(60)", "pass"), str(tmp_path), "c1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, locks.TIMEOUT_ENV: "60"},
    )
    stop(holder)  # a holder that dies, however it dies, lets go
    out, _ = waiter.communicate(timeout=60)
    assert waiter.returncode == 0
    assert out.strip() == "held"


@pytest.mark.parametrize("name", ["../../victim", "a/b", "", "-x", "A"])
def test_a_name_that_is_not_a_cluster_name_never_becomes_a_path(tmp_path: Path, name: str) -> None:
    with (
        pytest.raises(ConfigError, match="not a valid cluster name"),
        locks.cluster_lock(tmp_path, name, "down"),
    ):
        pass
    assert not (tmp_path / "locks").exists() or list((tmp_path / "locks").iterdir()) == []


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_timeout_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(locks.TIMEOUT_ENV, value)
    with pytest.raises(ConfigError, match=f"{locks.TIMEOUT_ENV} '{value}'"):
        locks.timeout_s()


MAKE_KEY = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from cloudtrain import access
    _, user = access.cluster_key(Path(sys.argv[1]), "c1")
    _, host = access.host_key(Path(sys.argv[1]), "c1")
    print(user)
    print(host)
    """
)


@pytest.mark.parametrize("maker", ["ssh-keygen", "cryptography"])
def test_keys_made_by_several_processes_at_once_are_one_key(tmp_path: Path, maker: str) -> None:
    env = dict(os.environ)
    if maker == "cryptography":  # no ssh-keygen on the PATH
        env["PATH"] = str(tmp_path / "bin")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MAKE_KEY, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(6)
    ]
    outputs = {p.communicate(timeout=60)[0] for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outputs) == 1, "every process hands out the same user and host key"
    user, host = next(iter(outputs)).splitlines()
    folder = tmp_path / "keys" / "c1"
    assert (folder / "id_ed25519.pub").read_text().strip() == user
    assert (folder / "ssh_host_ed25519_key.pub").read_text().strip() == host
    assert stat.S_IMODE((folder / "id_ed25519").stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == [
        "id_ed25519",
        "id_ed25519.pub",
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
    ], "no temporary file is left"
    # what one maker made, the other reads as the same key
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key((folder / "id_ed25519").read_bytes(), password=None)
    line = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert user == f"{line.decode()} cloudtrain-c1"
    keygen = subprocess.run(["ssh-keygen", "-y", "-f", str(folder / "ssh_host_ed25519_key")],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert host == f"{keygen.stdout.strip()} cloudtrain-c1-host"
