"""What a workdir sync copies: the local executor's walk and rsync (what the ssh executor runs)
read the ignore files the same way, and the size shown before a job is that walk's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cloudtrain.executors.base import ignore_patterns, sync_listing, sync_size
from cloudtrain.executors.local import LocalExecutor

TREE = {
    "train.py": "print('hi')\n",
    "lib/model.py": "x = 1\n",
    "lib/build/out.o": "binary",
    "build/big.bin": "0" * 1000,
    "data/raw/a.csv": "1,2\n",
    "data/keep.txt": "k",
    "notes.log": "log",
    "docs/notes.log": "log",
    ".env": "TOKEN=secret",
    "conf/.aws/credentials": "[default]",
    "!important": "a file whose name starts with '!'",
}
GITIGNORE = "# outputs\n/build/\n*.log\ndata/raw\n!data/raw/a.csv\n\n"
CLOUDTRAINIGNORE = "lib/build\n"


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


def test_the_gitignore_and_cloudtrainignore_keep_what_they_name_home(tree: Path) -> None:
    listed = {rel.as_posix() for rel, source in sync_listing(tree) if source is not None}
    assert listed == {
        "train.py", "lib/model.py", "data/keep.txt", "!important", ".gitignore",
        ".cloudtrainignore",
    }  # fmt: skip
    assert "!data/raw/a.csv" not in ignore_patterns(tree), "a negation is not an exclude"


def test_the_local_walk_copies_what_rsync_copies(tree: Path, tmp_path: Path) -> None:
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed")
    by_rsync = tmp_path / "rsync"
    excludes = [a for p in ignore_patterns(tree) for a in ("--exclude", p)]
    subprocess.run(["rsync", "-a", *excludes, "--", f"{tree}/", str(by_rsync)], check=True)
    by_local = tmp_path / "local"
    LocalExecutor().put(tree, str(by_local))
    assert files(by_local) == files(by_rsync)
    assert files(by_local) == {rel.as_posix() for rel, s in sync_listing(tree) if s}


def test_the_size_shown_is_what_is_copied(tree: Path) -> None:
    size = sync_size(tree)
    expected = [tree / "train.py", tree / "lib/model.py", tree / "data/keep.txt",
                tree / "!important", tree / ".gitignore", tree / ".cloudtrainignore"]  # fmt: skip
    assert size.files == len(expected)
    assert size.bytes == sum(p.stat().st_size for p in expected)
    assert str(size) == f"6 file(s), {size.bytes} B"
