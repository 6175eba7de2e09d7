"""A home another user could have written is not trusted: the home, a cluster's key folder and
its keys must be this user's and writable by no one else, or the command stops with one line
naming the path (exit 2), before anything is made."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from pathlib import Path

import pytest

from cloudtrain import access
from cloudtrain.boot.bootstrap import NodeKeys
from cloudtrain.errors import ConfigError
from cloudtrain.state import State
from tests.conftest import Cli

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files to another user")


def nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


def give_away(*paths: Path) -> None:
    for path in paths:
        os.chown(path, nobody(), -1, follow_symlinks=False)


def planted_keys(home: Path, cluster: str) -> Path:
    """Another user's key pairs in ``keys/<cluster>/``, put there while the home was loose,
    the home tightened since: the folder and the keys are theirs."""
    folder = home / "keys" / cluster
    elsewhere = home.parent / "attacker"
    access.cluster_key(elsewhere, cluster)
    access.host_key(elsewhere, cluster)
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "keys").mkdir(mode=0o700, exist_ok=True)
    shutil.copytree(elsewhere / "keys" / cluster, folder)
    give_away(folder, *folder.iterdir())
    return folder


def one_line(result_output: str) -> str:
    lines = result_output.strip().splitlines()
    assert len(lines) == 1, result_output
    return lines[0]


@as_root
def test_a_home_of_another_user_is_refused_with_one_line(home: Path, run_cli: Cli) -> None:
    home.mkdir(mode=0o700)
    give_away(home)
    result = run_cli("status")
    assert result.exit_code == 2, result.output
    line = one_line(result.output)
    assert line.startswith(f"error: cloudtrain's home {home} is owned by nobody (uid ")
    assert "Traceback" not in result.output
    assert not (home / "state.db").exists()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_home_others_can_write_is_refused(home: Path, run_cli: Cli, mode: int) -> None:
    home.mkdir()
    home.chmod(mode)
    result = run_cli("status")
    assert result.exit_code == 2, result.output
    assert one_line(result.output).startswith(
        f"error: cloudtrain's home {home} is writable by other users (mode {mode:04o})"
    )
    assert stat.S_IMODE(home.stat().st_mode) == mode, "left as it is, for the user to look at"
    with pytest.raises(ConfigError, match="writable by other users"):
        State.open(home)


def test_a_home_others_could_only_read_is_tightened(home: Path) -> None:
    home.mkdir()
    home.chmod(0o755)
    State.open(home).close()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


@as_root
def test_keys_another_user_planted_are_refused_not_sent_to_a_node(home: Path) -> None:
    folder = planted_keys(home, "c1")
    with pytest.raises(ConfigError) as refused:
        NodeKeys.for_cluster(home, "c1")  # what goes into a node's user-data
    message = str(refused.value)
    assert message.startswith(f"key folder {folder} is owned by nobody (uid ")
    assert "\n" not in message
    with pytest.raises(ConfigError, match="is owned by nobody"):
        access.ssh_options(home, "c1")


@as_root
def test_a_key_another_user_planted_in_this_users_folder_is_refused(home: Path) -> None:
    folder = planted_keys(home, "c1")
    os.chown(folder, os.getuid(), -1)  # the folder is this user's again; the files are not
    with pytest.raises(ConfigError) as refused:
        access.host_key(home, "c1")
    assert str(refused.value).startswith(
        f"key file {folder / 'ssh_host_ed25519_key'} is owned by nobody (uid "
    )
    with pytest.raises(ConfigError, match=r"key file .*/id_ed25519 is owned by nobody"):
        access.ssh_options(home, "c1")


@pytest.mark.parametrize("where", ["keys", "keys/c1"])
def test_a_key_folder_others_can_write_is_refused(home: Path, where: str) -> None:
    access.cluster_key(home, "c1")
    (home / where).chmod(0o777)
    with pytest.raises(ConfigError, match=f"key folder {home / where} is writable by other"):
        access.cluster_key(home, "c1")
    with pytest.raises(ConfigError, match="is writable by other users"):
        access.ssh_options(home, "c1")


def test_a_private_key_others_can_read_is_refused(home: Path) -> None:
    private, _ = access.host_key(home, "c1")
    private.chmod(0o644)
    with pytest.raises(ConfigError, match=f"key file {private} is readable by other users"):
        access.host_key(home, "c1")


def test_a_symlink_in_place_of_a_key_is_refused(home: Path, tmp_path: Path) -> None:
    private, _ = access.cluster_key(home, "c1")
    theirs = tmp_path / "theirs"
    theirs.write_text(private.read_text())
    private.unlink()
    private.symlink_to(theirs)
    with pytest.raises(ConfigError, match="is not a regular file"):
        access.cluster_key(home, "c1")


def test_this_users_own_keys_are_used_as_before(home: Path) -> None:
    first = access.cluster_key(home, "c1"), access.host_key(home, "c1")
    assert (access.cluster_key(home, "c1"), access.host_key(home, "c1")) == first
    assert stat.S_IMODE((home / "keys" / "c1").stat().st_mode) == 0o700


@as_root
def test_a_state_file_another_user_planted_is_refused(home: Path, run_cli: Cli) -> None:
    home.mkdir(mode=0o700)
    (home / "state.db").write_bytes(b"")
    give_away(home / "state.db")
    result = run_cli("status")
    assert result.exit_code == 2, result.output
    assert one_line(result.output).startswith(
        f"error: the state file {home / 'state.db'} is owned by uid {nobody()}"
    )
