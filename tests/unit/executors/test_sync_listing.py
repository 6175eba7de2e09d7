"""What a workdir sync copies: the local executor's walk and rsync (what the ssh executor runs)
read the ignore files the same way, and the size shown before a job is that walk's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from cloudtrain.executors.base import (
    GITIGNORE_FILTER,
    ignore_patterns,
    sync_listing,
    sync_size,
)
from cloudtrain.executors.local import LocalExecutor
from tests.conftest import unavailable

TREE = {
    "train.py": "print('hi')\n",
    "lib/model.py": "x = 1\n",
    "lib/build/out.o": "binary",
    "build/big.bin": "0" * 1000,
    "src/build": "a file named like the folder pattern build/",
    "data/raw/a.csv": "1,2\n",
    "data/keep.txt": "k",
    "data/cache/x.npy": "0",
    "data/.gitignore": "/cache\n*.tmp\n",
    "data/sub/y.tmp": "t",
    "data/sub/z.txt": "z",
    "notes.log": "log",
    "docs/notes.log": "log",
    "docs/.gitignore": "ignored.md\n!kept.md\n",
    "docs/ignored.md": "stays home",
    "docs/kept.md": "never ignored: the '!' line is a name, not a negation",
    ".env": "TOKEN=secret",
    "conf/.aws/credentials": "[default]",
    "!important": "a file whose name starts with '!'",
}
GITIGNORE = "# outputs\nbuild/\n*.log\ndata/raw\n!data/raw/a.csv\n\n"
CLOUDTRAINIGNORE = "lib/build\n"
#: what is copied of TREE and the two ignore files
COPIED = {
    "train.py", "lib/model.py", "src/build", "data/keep.txt", "data/.gitignore", "data/sub/z.txt",
    "docs/.gitignore", "docs/kept.md", "!important", ".gitignore", ".cloudtrainignore",
}  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ".gitignore").write_text(GITIGNORE)
    (root / ".cloudtrainignore").write_text(CLOUDTRAINIGNORE)
    return root


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_every_folders_gitignore_and_the_cloudtrainignore_keep_what_they_name_home(
    tree: Path,
) -> None:
    listed = {rel.as_posix() for rel, source in sync_listing(tree) if source is not None}
    assert listed == COPIED


def test_the_local_walk_copies_what_rsync_copies(tree: Path, tmp_path: Path) -> None:
    if shutil.which("rsync") is None:
        unavailable("rsync is not installed (.ci/run installs it)")
    by_rsync = tmp_path / "rsync"
    rules = [a for p in ignore_patterns(tree) for a in ("--exclude", p)]
    rules += ["--filter", GITIGNORE_FILTER]  # as the ssh executor tells it
    subprocess.run(["rsync", "-a", *rules, "--", f"{tree}/", str(by_rsync)], check=True)
    by_local = tmp_path / "local"
    LocalExecutor().put(tree, str(by_local))
    assert files(by_local) == files(by_rsync)
    assert files(by_local) == {rel.as_posix() for rel, s in sync_listing(tree) if s}


def test_the_size_shown_is_what_is_copied(tree: Path) -> None:
    size = sync_size(tree)
    assert size.files == len(COPIED)
    assert size.bytes == sum((tree / rel).stat().st_size for rel in COPIED)
    assert str(size) == f"{len(COPIED)} file(s), {size.bytes} B"


def test_a_socket_or_fifo_in_the_workdir_is_left_home(tree: Path, tmp_path: Path) -> None:
    """A dev server's socket or a named pipe in the project folder: opening the one fails and
    the other waits for a writer forever; neither is a file to copy (nor is a dead link)."""
    if shutil.which("rsync") is None:
        unavailable("rsync is not installed (.ci/run installs it)")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tree / "lib" / "dev.sock"))
    os.mkfifo(tree / "data" / "pipe")
    (tree / "dead").symlink_to(tmp_path / "nothing")
    try:
        by_local = tmp_path / "local"
        LocalExecutor().put(tree, str(by_local))
        assert files(by_local) == COPIED
        assert {rel.as_posix() for rel, s in sync_listing(tree) if s} == COPIED
        by_rsync = tmp_path / "rsync"  # with the ssh executor's options for special files
        subprocess.run(["rsync", "-a", "--no-specials", "--no-devices", "--exclude", "dead",
                        "--", f"{tree}/lib/", str(by_rsync)], check=True)  # fmt: skip
        assert not (by_rsync / "dev.sock").exists()
    finally:
        listener.close()
