"""What a node sends home is untrusted, over real sshd: a checkpoint folder with links reaching
the user's files, one larger than the bound, and a metrics file written to make its copy grow."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import access
from cloudtrain.errors import NodeDataError
from cloudtrain.executors import received
from cloudtrain.executors.ssh import SshExecutor
from cloudtrain.jobs import metrics
from cloudtrain.jobs.checkpoints import Kept
from tests.sshd import SshHost, cluster_hosts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, SshHost]]:
    with cluster_hosts(tmp_path_factory.mktemp("ssh"), "127.0.0.2") as (home, (host,)):
        yield home, host


def executor(home: Path, host: SshHost) -> SshExecutor:
    return SshExecutor(
        host.host, user="root", port=host.port, options=access.ssh_options(home, "c1")
    )


def test_links_from_a_node_never_bring_the_users_files_home_or_back_out(
    node: tuple[Path, SshHost], tmp_path: Path
) -> None:
    """The attack seen: ``creds -> ../../../../secretdir`` planted in the checkpoint folder, a
    snapshot that followed it, and a resume that uploaded the user's files to the nodes."""
    home, host = node
    secret = tmp_path / "secretdir"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE")
    os.chmod(secret / "id_rsa", 0o600)
    folder = tmp_path / "node" / "checkpoints" / "j-1"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.pt").write_text("weights")
    kept = Kept(tmp_path / "home", "j-1")
    # from the copy at home, this reaches the user's secretdir
    os.symlink(os.path.relpath(secret, kept.folder / ".incoming"), folder / "creds")
    os.symlink(secret / "id_rsa", folder / "sub" / "key.pt")
    os.mkfifo(folder / "sub" / "pipe")
    ex = executor(home, host)
    try:
        snapshot = kept.pull(ex, str(folder))
        assert snapshot is not None
        assert sorted(p.relative_to(kept.folder).as_posix() for p in kept.folder.rglob("*")) == [
            ".incoming", ".incoming/model.pt", ".incoming/sub",
            snapshot.name, f"{snapshot.name}/model.pt", f"{snapshot.name}/sub",
        ]  # fmt: skip
        assert oct((snapshot / "model.pt").stat().st_mode & 0o777) == "0o600"
        # --resume-from on another cluster: the snapshot goes to a new node's folder
        out = tmp_path / "node2" / "checkpoints" / "j-2"
        ex.put(snapshot, str(out))
        found = {p.relative_to(out).as_posix(): p for p in out.rglob("*")}
        assert sorted(found) == ["model.pt", "sub"]
        assert all("PRIVATE" not in p.read_text() for p in found.values() if p.is_file())
    finally:
        ex.close()


def test_a_copy_past_the_bound_is_stopped_and_the_snapshot_before_stands(
    node: tuple[Path, SshHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, host = node
    folder = tmp_path / "node" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"w" * 1000)
    kept = Kept(tmp_path / "home", "j-1")
    ex = executor(home, host)
    try:
        first = kept.pull(ex, str(folder))
        monkeypatch.setenv(received.LIMIT_ENV, "0.001")  # 1 MB
        with (folder / "huge.pt").open("wb") as f:
            f.truncate(64 << 20)
        with pytest.raises(NodeDataError, match=r"passed 0.001 GB; refused"):
            kept.pull(ex, str(folder))
        assert kept.newest() == first
        assert not (kept.folder / ".incoming").exists(), "what came past the bound is gone"
        (folder / "huge.pt").unlink()  # the node's folder fits again: so does the next copy
        (folder / "model.pt").write_bytes(b"v" * 1001)
        assert kept.pull(ex, str(folder)) != first
    finally:
        ex.close()


def test_metrics_a_node_writes_to_make_its_copy_grow_stay_their_own_size(
    node: tuple[Path, SshHost], tmp_path: Path
) -> None:
    """Carriage returns (read as line ends on the way) once made the copy's offset trail the
    node's file, each call adding again what the last had: 1.6 MB became 400 MB."""
    home, host = node
    job_dir = tmp_path / "node" / "jobs" / "j-1"
    job_dir.mkdir(parents=True)
    lines = [
        json.dumps({"step": i, "at": i, "rank": 0, "loss": 1.0 / (i + 1)}) for i in range(20000)
    ]
    junk = ["\r\n".join(["garbage"] * 50), "x" * 100_000, '{"step": "no"}']
    (job_dir / "metrics.jsonl").write_text("\r\n".join([*junk, *lines]) + "\r\n")
    node_size = (job_dir / "metrics.jsonl").stat().st_size
    copy = metrics.copy_path(tmp_path / "home", "j-1", 0, 0)
    ex = executor(home, host)
    try:
        agent = [sys.executable, "-m", "cloudtrain.node", "metrics", str(job_dir), "--offset"]
        added = metrics.pull(copy, lambda offset: ex.run([*agent, str(offset)]).check().stdout)
    finally:
        ex.close()
    assert added == len(lines)
    assert copy.stat().st_size < node_size
    read = metrics.read(tmp_path / "home", "j-1")
    assert [ln["step"] for ln in read] == list(range(20000))
