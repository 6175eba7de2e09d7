"""A tar that came back from a node is untrusted (`cloudtrain.executors.received.untar`): it
makes a folder the archive's copy with the guarantees of `copy_tree`, and refuses an archive
that names a path outside, is cut short, or holds more than the bound."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from cloudtrain.errors import NodeDataError
from cloudtrain.executors import received

Member = tuple[tarfile.TarInfo, bytes]


def file(name: str, data: bytes, mtime: float = 1_700_000_000) -> Member:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), mtime, 0o644
    return info, data


def folder(name: str) -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, b""


def special(name: str, kind: bytes, linkname: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.devmajor, info.devminor = 1, 3  # /dev/null's numbers, for a device
    return info, b""


def pack(path: Path, *members: Member) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def everything(tree: Path) -> list[str]:
    return sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*"))


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_tree_round_trips_with_its_nested_and_empty_folders_private(tmp_path: Path) -> None:
    archive = pack(
        tmp_path / "a.tar",
        folder("sub"),
        file("model.pt", b"weights"),
        file("sub/deep/opt.pt", b"state"),  # its folders come only by its name
        folder("empty"),
    )
    target = tmp_path / "home" / "copy"
    received.untar(archive, target)
    assert everything(target) == ["empty", "model.pt", "sub", "sub/deep", "sub/deep/opt.pt"]
    assert (target / "model.pt").read_bytes() == b"weights"
    assert (target / "sub" / "deep" / "opt.pt").read_bytes() == b"state"
    assert (target / "model.pt").stat().st_mtime_ns == 1_700_000_000 * 10**9
    for name in ("model.pt", "sub/deep/opt.pt"):
        assert mode(target / name) == 0o600, name
    for name in (".", "empty", "sub", "sub/deep"):
        assert mode(target / name) == 0o700, name


def test_an_archive_made_with_a_leading_dot_slash_round_trips(tmp_path: Path) -> None:
    """``tar -C dir -cf - .`` names the folder itself "./" and the rest "./name"."""
    archive = pack(tmp_path / "a.tar", folder("."), folder("./sub"), file("./sub/x.pt", b"x"))
    received.untar(archive, tmp_path / "copy")
    assert everything(tmp_path / "copy") == ["sub", "sub/x.pt"]


def test_a_second_untar_removes_what_is_gone_updates_what_changed_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    target = tmp_path / "copy"
    first = pack(
        tmp_path / "1.tar",
        file("same.pt", b"same"),
        file("changed.pt", b"old"),
        file("gone.pt", b"gone"),
        file("old/x.pt", b"x"),
    )
    received.untar(first, target)
    same_inode = (target / "same.pt").stat().st_ino
    changed = target / "changed.pt"
    os.link(changed, tmp_path / "snapshot.pt")  # a snapshot's hard link keeps the old bytes
    second = pack(
        tmp_path / "2.tar",
        file("same.pt", b"same"),
        file("changed.pt", b"new", mtime=1_700_000_001),
        file("new/y.pt", b"y"),
    )
    received.untar(second, target)
    assert everything(target) == ["changed.pt", "new", "new/y.pt", "same.pt"]
    assert changed.read_bytes() == b"new"
    assert (tmp_path / "snapshot.pt").read_bytes() == b"old"
    assert (target / "same.pt").stat().st_ino == same_inode  # unchanged: not written again


def test_a_file_that_became_a_folder_and_a_folder_that_became_a_file_are_replaced(
    tmp_path: Path,
) -> None:
    target = tmp_path / "copy"
    received.untar(pack(tmp_path / "1.tar", file("a", b"file"), file("b/x", b"x")), target)
    received.untar(pack(tmp_path / "2.tar", file("a/y", b"y"), file("b", b"file")), target)
    assert everything(target) == ["a", "a/y", "b"]
    assert (target / "b").read_bytes() == b"file"


def test_links_hard_links_fifos_and_devices_are_not_made(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE")
    archive = pack(
        tmp_path / "a.tar",
        file("model.pt", b"weights"),
        special("creds", tarfile.SYMTYPE, str(secret)),
        special("key.pt", tarfile.SYMTYPE, "../secret/id_rsa"),
        special("hard.pt", tarfile.LNKTYPE, "model.pt"),
        special("passwd", tarfile.LNKTYPE, "/etc/passwd"),
        special("pipe", tarfile.FIFOTYPE),
        special("null", tarfile.CHRTYPE),
        special("disk", tarfile.BLKTYPE),
        special("lonely/creds", tarfile.SYMTYPE, str(secret)),  # nor its folder
    )
    target = tmp_path / "copy"
    received.untar(archive, target)
    assert everything(target) == ["model.pt"]
    assert not any(p.is_symlink() for p in target.rglob("*"))


def test_a_link_then_a_file_below_its_name_does_not_reach_through_the_link(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = pack(
        tmp_path / "a.tar", special("d", tarfile.SYMTYPE, str(outside)), file("d/x", b"x")
    )
    target = tmp_path / "copy"
    received.untar(archive, target)
    assert everything(outside) == []
    assert not (target / "d").is_symlink()
    assert (target / "d" / "x").read_bytes() == b"x"


def test_a_link_already_in_the_target_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "id_rsa").write_text("PRIVATE")
    target = tmp_path / "copy"
    target.mkdir()
    os.symlink(outside / "id_rsa", target / "model.pt")  # left by an older version
    os.symlink(outside / "dir", target / "sub")
    archive = pack(tmp_path / "a.tar", file("model.pt", b"weights"), file("sub/x.pt", b"x"))
    received.untar(archive, target)
    assert (outside / "id_rsa").read_text() == "PRIVATE"
    assert everything(outside) == ["dir", "id_rsa"]
    assert not (target / "model.pt").is_symlink()
    assert (target / "model.pt").read_bytes() == b"weights"
    assert not (target / "sub").is_symlink()
    assert (target / "sub" / "x.pt").read_bytes() == b"x"


def test_what_an_older_version_left_is_made_private_and_its_links_removed(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = pack(tmp_path / "a.tar", file("model.pt", b"weights"))
    target = tmp_path / "copy"
    received.untar(archive, target)
    os.chmod(target / "model.pt", 0o644)
    os.chmod(target, 0o755)
    os.symlink(outside, target / "creds")  # a link to a folder the archive does not name
    received.untar(archive, target)
    assert everything(target) == ["model.pt"]
    assert (mode(target), mode(target / "model.pt")) == (0o700, 0o600)


@pytest.mark.parametrize(
    "name",
    ["../x", "a/../../x", "ABS/x", "", "a//b", "a/./b", "a/\nb", "a/\x00b", "./.."],
)
def test_a_name_that_is_no_plain_path_inside_refuses_the_archive_and_writes_nothing_outside(
    tmp_path: Path, name: str
) -> None:
    name = name.replace("ABS", str(tmp_path / "abs"))
    target = tmp_path / "home" / "copy"
    evil = file(name, b"evil")
    evil[0].pax_headers = {"path": name}  # as it is, NUL and all
    archive = pack(tmp_path / "a.tar", file("ok.pt", b"ok"), evil)
    with tarfile.open(archive) as tar:
        assert tar.getnames()[-1] == name  # the archive holds the name as meant
    with pytest.raises(NodeDataError, match="no plain path inside"):
        received.untar(archive, target)
    assert everything(tmp_path) == ["a.tar", "home", "home/copy", "home/copy/ok.pt"]


def test_a_member_below_a_name_that_came_as_a_file_refuses_the_archive(tmp_path: Path) -> None:
    archive = pack(tmp_path / "a.tar", file("a", b"file"), file("a/b", b"below"))
    with pytest.raises(NodeDataError, match="'a/b' is no plain path inside"):
        received.untar(archive, tmp_path / "copy")
    assert (tmp_path / "copy" / "a").read_bytes() == b"file"


def test_a_name_that_came_as_a_folder_and_then_as_a_file_refuses_the_archive(
    tmp_path: Path,
) -> None:
    archive = pack(tmp_path / "a.tar", folder("a"), file("a", b"file"))
    with pytest.raises(NodeDataError, match="both a file and a folder"):
        received.untar(archive, tmp_path / "copy")
    assert (tmp_path / "copy" / "a").is_dir()


def test_saves_in_progress_are_not_copied_and_an_old_one_is_removed(tmp_path: Path) -> None:
    target = tmp_path / "copy"
    (target / ".ckpt-1.tmp").mkdir(parents=True)
    archive = pack(
        tmp_path / "a.tar",
        file("model.pt", b"weights"),
        file(".00001.pt.ab12.tmp", b"half"),
        file("x.cloudtrain-tmp", b"half"),
        folder(".ckpt-2.tmp"),
        file(".ckpt-2.tmp/model.pt", b"half"),
    )
    received.untar(archive, target)
    assert everything(target) == ["model.pt"]


def test_more_than_the_limit_in_all_is_refused_before_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(received.LIMIT_ENV, "0.000002")  # 2000 bytes
    archive = pack(tmp_path / "a.tar", file("a.pt", b"a" * 1500), file("b.pt", b"b" * 1500))
    target = tmp_path / "copy"
    with pytest.raises(NodeDataError, match="passed"):
        received.untar(archive, target)
    assert everything(target) == ["a.pt"]  # nor a temp of b.pt


def test_files_already_copied_count_against_the_limit_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = pack(tmp_path / "a.tar", file("a.pt", b"a" * 1500), file("b.pt", b"b" * 1500))
    received.untar(archive, tmp_path / "copy")
    monkeypatch.setenv(received.LIMIT_ENV, "0.000002")  # 2000 bytes
    with pytest.raises(NodeDataError, match="passed"):
        received.untar(archive, tmp_path / "copy")


def test_a_header_claiming_more_than_the_limit_is_refused_for_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused at its header, before a byte of it is read: not as an archive cut short."""
    monkeypatch.setenv(received.LIMIT_ENV, "0.000002")  # 2000 bytes
    data = pack(tmp_path / "a.tar", file("huge.pt", b"h" * 4000)).read_bytes()
    archive = tmp_path / "cut.tar"
    archive.write_bytes(data[:1024])
    with pytest.raises(NodeDataError, match="passed"):
        received.untar(archive, tmp_path / "copy")
    assert everything(tmp_path / "copy") == []


def test_files_of_the_limit_in_all_are_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(received.LIMIT_ENV, "0.000002")  # 2000 bytes
    archive = pack(tmp_path / "a.tar", file("a.pt", b"a" * 1000), file("b.pt", b"b" * 1000))
    received.untar(archive, tmp_path / "copy")
    assert everything(tmp_path / "copy") == ["a.pt", "b.pt"]


def whole_and_cut(tmp_path: Path) -> tuple[Path, bytes]:
    """A target holding an earlier copy, and a new archive's bytes."""
    target = tmp_path / "copy"
    received.untar(pack(tmp_path / "old.tar", file("kept.pt", b"old"), file("z.pt", b"z")), target)
    data = pack(
        tmp_path / "new.tar", file("a.pt", b"A" * 700), file("b.pt", b"B" * 10)
    ).read_bytes()
    return target, data


@pytest.mark.parametrize(
    ("cut", "why"),
    [
        (0, "empty"),
        (512 + 100, "in a file's bytes"),  # a.pt's header, then its 2 blocks
        (512 * 3, "after a file's last block"),
        (512 * 3 + 200, "in a header"),  # b.pt's
        (512 * 5, "before the end block"),  # b.pt's header and block end there
    ],
)
def test_an_archive_cut_short_is_refused_and_removes_nothing(
    tmp_path: Path, cut: int, why: str
) -> None:
    target, data = whole_and_cut(tmp_path)
    archive = tmp_path / "cut.tar"
    archive.write_bytes(data[:cut])
    with pytest.raises(NodeDataError, match="cut short or corrupt"):
        received.untar(archive, target)
    names = everything(target)
    assert {"kept.pt", "z.pt"} <= set(names), why
    assert not [n for n in names if received.in_progress(n)], why  # no temp left


def test_a_garbled_header_within_the_archive_is_refused(tmp_path: Path) -> None:
    target, data = whole_and_cut(tmp_path)
    archive = tmp_path / "bad.tar"
    archive.write_bytes(data[: 512 * 3] + b"\xff" * 512 + data[512 * 4 :])  # b.pt's header
    with pytest.raises(NodeDataError, match="cut short or corrupt"):
        received.untar(archive, target)
    assert (target / "z.pt").read_bytes() == b"z"


def test_the_whole_archive_before_the_cuts_is_copied(tmp_path: Path) -> None:
    """The cut points above are where they say: the whole archive makes the copy."""
    target, data = whole_and_cut(tmp_path)
    assert data[512 * 3 : 512 * 3 + 4] == b"b.pt"
    assert data[512 * 4 : 512 * 4 + 10] == b"B" * 10
    assert data[512 * 5 : 512 * 6] == bytes(512)
    received.untar(tmp_path / "new.tar", target)
    assert everything(target) == ["a.pt", "b.pt"]
