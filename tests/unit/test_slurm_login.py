"""The Slurm login node's file commands (`cloudtrain.providers.slurm._login`), run here through
this machine's shell (the SSH login runs the same commands: tests/integration/test_slurm_flow.py):
what is written reads back as it was, byte for byte; what a node wrote is bounded; and bad
`--login` values are one clear line."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.slurm._login import READ_LIMIT, Login

ODD = "line one\n\x1e\x1f sep\n'q' \"d\" $(id) `id` ünï\n-\n\n"


def test_what_is_written_reads_back_as_it_was_and_is_private(tmp_path: Path) -> None:
    login = Login("local")
    path = str(tmp_path / "a" / "b" / "f.json")
    login.write(path, ODD)
    assert login.read(path) == ODD
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o700
    assert not [p for p in (tmp_path / "a" / "b").iterdir() if p.name != "f.json"], "no temp"
    assert login.exists(path)
    assert not login.exists(str(tmp_path / "none"))


def test_many_files_read_in_one_command_stay_apart_whatever_their_bytes(tmp_path: Path) -> None:
    (tmp_path / "one").write_bytes(b"\x1e-\n\n-\n")
    (tmp_path / "two").write_text("two")
    (tmp_path / "empty").write_text("")
    (tmp_path / "dir").mkdir()
    paths = [str(tmp_path / n) for n in ("one", "missing", "two", "empty", "dir")]
    assert Login("local").read_all(paths) == ["\x1e-\n\n-\n", None, "two", "", None]


def test_a_huge_file_is_read_only_to_the_limit(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * (READ_LIMIT + 4096))
    assert Login("local").read(str(tmp_path / "big")) == "x" * READ_LIMIT


def test_listing_and_removing(tmp_path: Path) -> None:
    login = Login("local")
    login.write(str(tmp_path / "c1" / "owner.json"), '{"owner": "me"}')
    (tmp_path / "c2").mkdir()
    (tmp_path / "file").write_text("not a folder")
    assert login.listing(str(tmp_path), "owner.json") == {"c1": '{"owner": "me"}\n', "c2": None}
    assert login.listing(str(tmp_path / "none"), "owner.json") == {}
    login.remove(str(tmp_path / "c1"))
    assert not (tmp_path / "c1").exists()


def test_the_folder_is_absolute_in_the_login_users_home() -> None:
    login = Login("local")
    home = os.environ["HOME"]
    assert login.folder(None, ".cloudtrain/slurm") == f"{home}/.cloudtrain/slurm"
    assert login.folder("~/x/../y", "unused") == f"{home}/y"
    assert login.folder("/lustre/me", "unused") == "/lustre/me"
    with pytest.raises(ConfigError, match="--shared-dir 'rel': give an absolute path"):
        login.folder("rel", "unused")
    with pytest.raises(ConfigError, match="--shared-dir '/a\\\\nb': no control characters"):
        login.folder("/a\nb", "unused")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("me@login:0", "port 0 is not 1 to 65535"),
        ("me@login:x", "write user@address or user@address:port"),
        ("@login", "write user@address"),
        ("me@-oProxyCommand=id", "is not an IP address or a host name"),
        ("-F/tmp/c@h", "is not a user name"),
        ("me@a b", "is not an IP address or a host name"),
    ],
)
def test_a_bad_login_is_one_line_naming_it(value: str, said: str) -> None:
    with pytest.raises(ConfigError, match=f"--login {value!r}.*{said}"):
        Login(value)


def test_keys_are_for_a_login_over_ssh_only() -> None:
    with pytest.raises(ConfigError, match="--known-hosts: only for a login node over SSH"):
        Login("local", known_hosts="/k")


def test_node_names_resolve_to_addresses_on_the_login_node() -> None:
    names = ["localhost", "no-such-host.invalid", "$(touch /tmp/ct-pwned)", "-x"]
    assert Login("local").addresses(names) == {"localhost": "127.0.0.1"}
    assert not Path("/tmp/ct-pwned").exists()
