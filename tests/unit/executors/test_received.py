"""What comes back from a node is untrusted (`cloudtrain.executors.received`): through the local
executor's `get` (a node's folder on this machine) and `Kept`'s snapshots. Over real sshd in
``tests/integration/test_node_data.py``; a bucket that lies in ``tests/aws/``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudtrain.errors import NodeDataError
from cloudtrain.executors import received
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.jobs.checkpoints import Kept


def hostile_node(root: Path, secret: Path) -> Path:
    """A node's checkpoint folder as a hostile job leaves it: a real file, and links, a FIFO
    and a link to a folder reaching the user's `secret` folder."""
    secret.mkdir(parents=True)
    (secret / "id_rsa").write_text("PRIVATE")
    os.chmod(secret / "id_rsa", 0o600)
    node = root / "checkpoints"
    (node / "sub").mkdir(parents=True)
    (node / "model.pt").write_text("weights")
    (node / "sub" / "opt.pt").write_text("state")
    os.symlink(os.path.relpath(secret, node), node / "creds")  # creds -> ../../secret
    os.symlink(secret / "id_rsa", node / "sub" / "key.pt")
    os.symlink("/nonexistent", node / "dangling")
    os.mkfifo(node / "pipe")
    return node


def everything(tree: Path) -> list[str]:
    return sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*"))


def test_a_nodes_links_fifos_and_the_users_files_never_reach_a_snapshot(tmp_path: Path) -> None:
    node = hostile_node(tmp_path / "node", tmp_path / "secret")
    kept = Kept(tmp_path / "home", "j-1")
    snapshot = kept.pull(LocalExecutor(), str(node))
    assert snapshot is not None
    assert everything(snapshot) == ["model.pt", "sub", "sub/opt.pt"]
    for path in kept.folder.rglob("*"):
        assert not path.is_symlink(), path
        assert "PRIVATE" not in (path.read_text() if path.is_file() else ""), path
    assert oct((snapshot / "model.pt").stat().st_mode & 0o777) == "0o600"


def test_a_link_left_in_the_copy_by_an_older_version_is_not_followed_into_a_snapshot(
    tmp_path: Path,
) -> None:
    """`.incoming` made by a version that kept links: the snapshot takes regular files only."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE")
    kept = Kept(tmp_path / "home", "j-1")
    incoming = kept.folder / ".incoming"
    incoming.mkdir(parents=True)
    (incoming / "model.pt").write_text("weights")
    os.symlink(secret, incoming / "creds")
    snapshot = kept._keep(incoming)
    assert everything(snapshot) == ["model.pt"]


def test_a_sharded_union_takes_no_link_of_any_part(tmp_path: Path) -> None:
    parts = [hostile_node(tmp_path / f"n{i}", tmp_path / f"secret{i}") for i in (0, 1)]
    (parts[1] / "rank1.distcp").write_text("shard 1")
    kept = Kept(tmp_path / "home", "j-1")
    sources = [(i, LocalExecutor(), str(p)) for i, p in enumerate(parts)]
    snapshot = kept.pull_sharded(sources, lambda i, e: pytest.fail(f"node {i}: {e}"))
    assert snapshot is not None
    assert everything(snapshot) == ["model.pt", "rank1.distcp", "sub", "sub/opt.pt"]


def test_a_node_folder_that_is_itself_a_link_is_no_folder(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE")
    os.symlink(secret, tmp_path / "checkpoints")
    assert LocalExecutor().get(str(tmp_path / "checkpoints"), tmp_path / "back") is False
    assert not (tmp_path / "back").exists()


def test_a_copy_past_the_bound_is_refused_and_the_snapshot_before_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = tmp_path / "node"
    node.mkdir()
    (node / "a.pt").write_bytes(b"x" * 1000)
    kept = Kept(tmp_path / "home", "j-1")
    first = kept.pull(LocalExecutor(), str(node))
    monkeypatch.setenv(received.LIMIT_ENV, "0.000002")  # 2000 bytes
    (node / "b.pt").write_bytes(b"y" * 1500)
    with pytest.raises(NodeDataError, match=r"passed 2e-06 GB; refused"):
        kept.pull(LocalExecutor(), str(node))
    assert first is not None
    assert kept.newest() == first
    assert everything(first) == ["a.pt"]
    assert not (kept.folder / ".incoming").exists(), "nothing of the refused copy is kept"


@pytest.mark.parametrize("value", ["0", "-1", "lots", "inf", "nan"])
def test_a_bad_bound_is_one_line_naming_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(received.LIMIT_ENV, value)
    with pytest.raises(Exception, match=rf"CLOUDTRAIN_MAX_PULL_GB={value!r}: use a positive"):
        received.limit()


def test_a_log_that_never_ends_is_copied_to_its_bound_and_its_command_stopped(
    tmp_path: Path,
) -> None:
    """`yes` is a node whose log never ends: the copy stops at the bound, says where it was
    cut, and the command is killed (else this test would never end)."""
    copy = tmp_path / "node-0.log"
    with received.log_copy(copy, limit=1 << 20) as write:
        LocalExecutor().run(["yes", "a line of a log"], on_output=write)
    lines = copy.read_text().splitlines()
    assert lines[-1] == "[cloudtrain: the copy of this log was cut here, at 1 MB]"
    assert set(lines[:-1]) == {"a line of a log"}
    assert copy.stat().st_size <= (1 << 20) + 100
    assert oct(copy.stat().st_mode & 0o777) == "0o600"


def test_a_streamed_run_keeps_only_the_tail_of_what_it_said(tmp_path: Path) -> None:
    seen: list[str] = []
    done = LocalExecutor().run(["seq", "1", "100000"], on_output=seen.append)
    assert len(seen) == 100000
    assert done.stdout.splitlines() == [str(i) for i in range(99801, 100001)]
    huge = LocalExecutor().run(["head", "-c", str(5 << 20), "/dev/zero"], on_output=seen.append)
    assert huge.returncode == 0
    assert max(len(s) for s in seen) <= 1 << 20, "a line without end comes in pieces"


def test_a_checkpoint_saved_again_within_the_second_at_the_same_size_is_copied_again(
    tmp_path: Path,
) -> None:
    """The quick check compares mtimes to the nanosecond: epochs 4 and 5 of a small job were
    saved 0.46 s apart at the same size, and a check by the second kept epoch 3's copy home."""
    node, home = tmp_path / "node", tmp_path / "home"
    node.mkdir()
    second = 1_796_000_000 * 10**9
    for content, ns in (("epoch 3", 100_000_000), ("epoch 5", 900_000_000)):
        (node / "digits.pt").write_text(content)
        os.utime(node / "digits.pt", ns=(second, second + ns))
        newest = Kept(home, "j-1").pull(LocalExecutor(), str(node))
        assert newest is not None
        assert (newest / "digits.pt").read_text() == content
    assert len(Kept(home, "j-1").snapshots()) == 2
