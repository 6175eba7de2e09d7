"""The ssh control-socket folder in the shared temp folder: this user's own, 0700, or refused."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.executors.ssh import control_dir


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path / f"cloudtrain-ssh-{os.getuid()}"


def test_it_is_made_0700_and_a_looser_one_is_tightened(tmp: Path) -> None:
    assert control_dir() == tmp
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o700
    tmp.chmod(0o777)
    control_dir()
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o700


def test_a_symlink_planted_in_its_place_is_refused(tmp: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    tmp.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="is a symlink, not this user's own folder"):
        control_dir()


def test_a_file_in_its_place_is_refused(tmp: Path) -> None:
    tmp.write_text("")
    with pytest.raises(ConfigError, match="is not a folder"):
        control_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a folder to another user")
def test_another_users_folder_is_refused(tmp: Path) -> None:
    tmp.mkdir(mode=0o700)
    os.chown(tmp, 12345, 12345)
    with pytest.raises(ConfigError, match="owned by uid 12345"):
        control_dir()
