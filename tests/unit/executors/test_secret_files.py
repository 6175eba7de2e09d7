"""What holds credentials never goes to a node: the files the secret scanners know, wherever
they are in the workdir, and cloudtrain's own home; the local walk and rsync (what the ssh
executor runs) agree, and `left_out` names what stayed home."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.executors.base import left_out, rsync_rules, sync_listing
from tests.conftest import unavailable

#: one file of each kind users were found to keep in a workdir (issue 27), and a few more
SECRETS = [
    ".huggingface/token",
    ".cache/huggingface/token",
    ".config/gh/hosts.yml",
    ".pypirc",
    ".npmrc",
    "certs/server.key",
    "terraform.tfstate",
    "infra/terraform.tfstate.backup",
    "prod.tfvars",
    ".vault-token",
    ".boto",
    ".s3cfg",
    "kubeconfig",
    "ops/dev.kubeconfig",
    ".envrc",
    ".dockercfg",
    ".kaggle/kaggle.json",
    "keys/deploy_ed25519",
    ".my.cnf",
    "backup.pfx",
    "store.jks",
    ".databrickscfg",
    ".config/rclone/rclone.conf",
    ".bash_history",
    ".git-credentials",
    ".env",
    ".aws/credentials",
    "id_rsa",
]
#: what is still copied: the job's own files, named close to the secrets
KEPT = [
    "train.py",
    "task.yaml",
    "config/model.yaml",
    "data/keys.txt",
    "hosts.yml",
    "tokenizer.json",
]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workdir that holds every secret file, the job's own files, and cloudtrain's home."""
    root = tmp_path / "work"
    for rel in [*SECRETS, *KEPT]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"contents of {rel}")
    home = root / "runs" / ".ct-home"
    (home / "keys" / "c1").mkdir(parents=True)
    (home / "keys" / "c1" / "ssh_host_ed25519_key").write_text("the host's private key")
    (home / "state.db").write_text("")
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    return root


def copied(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_no_secret_file_and_not_the_home_is_listed(work: Path) -> None:
    listed = {rel.as_posix() for rel, source in sync_listing(work) if source is not None}
    assert listed == set(KEPT)


def test_rsync_told_the_same_rules_copies_the_same(work: Path, tmp_path: Path) -> None:
    if shutil.which("rsync") is None:
        unavailable("rsync is not installed (.ci/run installs it)")
    target = tmp_path / "node"
    subprocess.run(["rsync", "-a", *rsync_rules(work), "--", f"{work}/", str(target)], check=True)
    assert copied(target) == set(KEPT)


def test_what_was_left_out_is_named_once_each(work: Path) -> None:
    named = left_out(work)
    assert "runs/.ct-home (cloudtrain's home)" in named
    folders = {".huggingface", ".config/gh", ".kaggle", ".config/rclone", ".aws"}
    assert set(named) == {
        "runs/.ct-home (cloudtrain's home)",
        ".cache/huggingface/token",
        *folders,
        *(s for s in SECRETS if not any(s.startswith(f + "/") for f in folders)),
    }


def test_a_home_whose_name_has_wildcards_is_still_left_out_by_rsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("rsync") is None:
        unavailable("rsync is not installed (.ci/run installs it)")
    work = tmp_path / "work"
    home = work / "h[1]*?"
    (home / "keys").mkdir(parents=True)
    (home / "keys" / "k").write_text("private")
    (work / "h1x").mkdir()
    (work / "h1x" / "kept").write_text("a folder the pattern would match unescaped")
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    target = tmp_path / "node"
    subprocess.run(["rsync", "-a", *rsync_rules(work), "--", f"{work}/", str(target)], check=True)
    assert copied(target) == {"h1x/kept"}


def test_the_home_itself_is_never_a_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="is cloudtrain's home"):
        list(sync_listing(tmp_path))
