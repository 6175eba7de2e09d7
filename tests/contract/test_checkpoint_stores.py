"""Checkpoints kept in a bucket (`cloudtrain.jobs.buckets`), the same guarantees on every
store: each cloud's SDK, for real, against its stand-in on 127.0.0.1 (`stores.py` says what a
stand-in gives; `STORES` names them). Each test asserts the bucket's exact keys afterwards."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cloudtrain.errors import CheckpointError, ConfigError, NotFoundError, ProviderError
from cloudtrain.executors.base import RunResult
from cloudtrain.executors.fake import Call
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.jobs import checkpoints
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.buckets import MARKER, Bucket, Pushed
from cloudtrain.jobs.coordinator import Coordinator
from cloudtrain.providers.fake.provider import FakeCloud, FakeProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State
from tests.contract.stores import STORES, StoreStandIn

JOB = "c1-1"


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest) -> StoreStandIn:
    stand_in: StoreStandIn = request.getfixturevalue(STORES[request.param])
    return stand_in


def snapshot_keys(store: StoreStandIn, name: str, *files: str) -> set[str]:
    base = f"{store.prefix}/{JOB}/{name}"
    return {f"{base}/{f}" for f in files} | {f"{base}{MARKER}"}


class Head:
    """The head node's checkpoint folder, and the local copy `Kept` pulls from it."""

    def __init__(self, root: Path) -> None:
        self.folder = root / "node" / "checkpoints"
        (self.folder / "opt").mkdir(parents=True)
        self.epoch = 0

    def save(self, model: bytes, optimizer: bytes | None = None) -> None:
        self.epoch += 1
        (self.folder / "model.pt").write_bytes(model)
        os.utime(self.folder / "model.pt", (self.epoch * 1000, self.epoch * 1000))
        if optimizer is not None:  # (a new mtime: the copy's quick check is by the second)
            (self.folder / "opt" / "state.pt").write_bytes(optimizer)
            os.utime(self.folder / "opt" / "state.pt", (self.epoch * 1000, self.epoch * 1000))

    def pull(self, kept: checkpoints.Kept) -> Path:
        snapshot = kept.pull(LocalExecutor(), str(self.folder))
        assert snapshot is not None
        return snapshot


def test_each_snapshot_is_pushed_with_only_what_changed_and_the_newest_n_kept(
    store: StoreStandIn, tmp_path: Path
) -> None:
    bucket = Bucket(store.url)
    kept = checkpoints.Kept(tmp_path / "home", JOB, keep=2)
    head = Head(tmp_path)
    optimizer = os.urandom(9 * 1024 * 1024)  # past the SDKs' one-request uploads (boto3's 8 MiB)

    head.save(b"epoch 1", optimizer)
    first = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=2, copied=0, removed=0)
    assert store.keys() == snapshot_keys(store, first.name, "model.pt", "opt/state.pt")
    assert kept.push(bucket) is None, "pushed already: nothing is called"

    store.seen.clear()
    head.save(b"epoch 2")  # the optimizer's state is the same
    second = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=1, copied=1, removed=0)
    written = {s.key for s in store.seen if s.action == "write"}
    copies = {(s.key, s.source) for s in store.seen if s.action == "copy"}
    base = f"{store.prefix}/{JOB}"
    assert written == {f"{base}/{second.name}/model.pt", f"{base}/{second.name}{MARKER}"}
    assert copies == {(f"{base}/{second.name}/opt/state.pt", f"{base}/{first.name}/opt/state.pt")}

    head.save(b"epoch 3", b"new optimizer state")
    third = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=2, copied=0, removed=1)
    files = ("model.pt", "opt/state.pt")
    assert store.keys() == snapshot_keys(store, second.name, *files) | snapshot_keys(
        store, third.name, *files
    )
    assert bucket.snapshots(JOB) == [second.name, third.name]
    assert store.body(f"{store.prefix}/{JOB}/{second.name}/opt/state.pt") == optimizer
    assert store.body(f"{store.prefix}/{JOB}/{third.name}/model.pt") == b"epoch 3"
    manifest = json.loads(store.body(f"{store.prefix}/{JOB}/{third.name}{MARKER}"))
    assert manifest["files"]["model.pt"]["size"] == len(b"epoch 3")
    hosts = {s.host for s in store.seen}
    assert len(hosts) == 1, hosts
    assert next(iter(hosts)).startswith("127.0.0.1:"), hosts


def test_a_snapshot_whose_upload_was_cut_is_never_the_newest(
    store: StoreStandIn, tmp_path: Path
) -> None:
    bucket = Bucket(store.url)
    kept = checkpoints.Kept(tmp_path / "home", JOB, keep=2)
    head = Head(tmp_path)
    head.save(b"epoch 1", b"opt 1")
    first = head.pull(kept)
    kept.push(bucket)

    head.save(b"epoch 2", b"opt 2")
    second = head.pull(kept)
    store.fail = lambda seen: seen.action == "write" and seen.key.endswith(MARKER)
    with pytest.raises(ProviderError) as caught:
        kept.push(bucket)
    assert caught.value.retryable
    assert "\n" not in str(caught.value)
    assert store.url in str(caught.value)
    cut = snapshot_keys(store, second.name, "model.pt", "opt/state.pt") - snapshot_keys(
        store, second.name
    )
    assert store.keys() == snapshot_keys(store, first.name, "model.pt", "opt/state.pt") | cut
    assert bucket.newest(JOB) == first.name, "files without their manifest: not complete"

    elsewhere = checkpoints.Kept(tmp_path / "other-home", JOB)
    restored = elsewhere.required(bucket)
    assert restored.name == first.name
    assert (restored / "model.pt").read_bytes() == b"epoch 1"

    store.fail = None  # the next push completes, and the cut one goes
    head.save(b"epoch 3", b"opt 1")  # as in the newest complete one: copied there
    third = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=1, copied=1, removed=1)
    files = ("model.pt", "opt/state.pt")
    assert store.keys() == snapshot_keys(store, first.name, *files) | snapshot_keys(
        store, third.name, *files
    )


def test_restore_into_an_empty_home_takes_the_newest_complete_snapshot_whole(
    store: StoreStandIn, tmp_path: Path
) -> None:
    bucket = Bucket(store.url)
    kept = checkpoints.Kept(tmp_path / "home", JOB, keep=3)
    head = Head(tmp_path)
    for epoch in (1, 2):
        head.save(f"epoch {epoch}".encode(), b"opt")
        head.pull(kept)
        kept.push(bucket)
    before = store.keys()

    home = tmp_path / "new-home"
    with pytest.raises(NotFoundError, match=f"job {JOB} has no checkpoint kept here"):
        checkpoints.Kept(home, JOB).required()
    restored = checkpoints.Kept(home, JOB).required(bucket)
    assert restored == home / "checkpoints" / JOB / kept.snapshots()[-1].name
    assert (restored / "model.pt").read_bytes() == b"epoch 2"
    assert (restored / "opt" / "state.pt").read_bytes() == b"opt"
    assert sorted(p.name for p in restored.parent.iterdir()) == [".pushed", restored.name]
    store.seen.clear()
    assert checkpoints.Kept(home, JOB).required(bucket) == restored, "kept now: no download"
    assert store.seen == []
    assert checkpoints.Kept(home, JOB).push(bucket) is None, "it came from there"
    assert store.keys() == before, "a restore writes nothing to the bucket"

    with pytest.raises(
        NotFoundError, match=f"job c1-9 has no checkpoint kept here .* nor in {store.url}"
    ):
        checkpoints.Kept(home, "c1-9").required(bucket)


def test_a_file_that_does_not_match_its_manifest_is_never_restored(
    store: StoreStandIn, tmp_path: Path
) -> None:
    bucket = Bucket(store.url)
    kept = checkpoints.Kept(tmp_path / "home", JOB)
    head = Head(tmp_path)
    head.save(b"epoch 1", b"opt")
    name = head.pull(kept).name
    kept.push(bucket)
    store.put(f"{store.prefix}/{JOB}/{name}/model.pt", b"epoch")

    home = tmp_path / "new-home"
    with pytest.raises(CheckpointError, match=r"model.pt \(5 bytes\) does not match"):
        checkpoints.Kept(home, JOB).required(bucket)
    assert list((home / "checkpoints" / JOB).iterdir()) == [], "nothing half-restored is left"

    store.put(
        f"{store.prefix}/{JOB}/{name}{MARKER}",
        json.dumps({"files": {"../../escape": {"size": 1, "sha256": "x"}}}).encode(),
    )
    with pytest.raises(CheckpointError, match=r"its manifest names '../../escape'"):
        checkpoints.Kept(home, JOB).required(bucket)
    assert not (tmp_path / "escape").exists()


def test_an_object_longer_than_its_manifest_says_is_read_no_further(
    store: StoreStandIn, tmp_path: Path
) -> None:
    """A bucket is as untrusted as a node: a restore writes no more of a file than its
    manifest says, and one byte to know it was more."""
    bucket = Bucket(store.url)
    kept = checkpoints.Kept(tmp_path / "home", JOB)
    head = Head(tmp_path)
    head.save(b"epoch 1", b"opt")
    name = head.pull(kept).name
    kept.push(bucket)
    store.put(f"{store.prefix}/{JOB}/{name}/model.pt", b"x" * (4 << 20))
    home = tmp_path / "new-home"
    with pytest.raises(CheckpointError, match=r"model.pt \(8 bytes\) does not match"):
        checkpoints.Kept(home, JOB).required(bucket)
    assert list((home / "checkpoints" / JOB).iterdir()) == [], "nothing half-restored is left"


def test_a_manifest_claiming_more_than_the_bound_downloads_nothing(
    store: StoreStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"model.pt": {"size": 2 * 10**9, "sha256": "0" * 64}}
    store.put(f"{store.prefix}/{JOB}/5/model.pt", b"x")
    store.put(f"{store.prefix}/{JOB}/5{MARKER}", json.dumps({"files": files}).encode())
    monkeypatch.setenv("CLOUDTRAIN_MAX_PULL_GB", "1")
    store.seen.clear()
    with pytest.raises(CheckpointError, match="more than the bound allows"):
        checkpoints.Kept(tmp_path / "home", JOB).required(Bucket(store.url))
    assert not [s for s in store.seen if s.action == "read" and s.key.endswith("/5/model.pt")]


def test_bucket_errors_are_cloudtrains_one_line_naming_the_bucket(store: StoreStandIn) -> None:
    missing, code = store.missing()
    with pytest.raises(ProviderError) as caught:
        Bucket(missing).snapshots(JOB)
    assert caught.value.code == code
    assert missing in str(caught.value)
    assert "\n" not in str(caught.value)

    code = store.unreachable()
    with pytest.raises(ProviderError) as refused:
        Bucket(store.url).snapshots(JOB)
    assert refused.value.code == code
    assert refused.value.retryable
    assert store.url in str(refused.value)
    assert "\n" not in str(refused.value)


class Head2Node:
    """The fake nodes' answers: a port, and the head's checkpoint folder copied by `get` as
    a real node's would be."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, call: Call) -> RunResult:
        argv = call.argv
        if call.kind == "get":
            local = Path(argv[1])
            for path in self.folder.rglob("*"):
                if path.is_file():
                    dest = local / path.relative_to(self.folder)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    part = dest.with_name(dest.name + ".part")  # a new file, as rsync makes
                    shutil.copy2(path, part)  # with its mtime
                    part.replace(dest)
            return RunResult(argv, 0, "", "")
        if argv[1:4] == ("-m", "cloudtrain.node", "port"):
            return RunResult(argv, 0, "29555\n", "")
        return RunResult(argv, 0, "", "")


def coordinator(home: Path, head: Path) -> tuple[Coordinator, FakeProvider]:
    provider = FakeProvider(
        ProviderContext(home=home, options={"cloud": FakeCloud(), "handler": Head2Node(head)})
    )
    state = State.open(home)
    spec = ClusterSpec("c1", "fake", 2, Resources(accelerator="A100", count=8))
    state.put_cluster(spec, status=ClusterStatus.UP)
    state.set_nodes("c1", provider.apply(provider.plan(spec)))
    return Coordinator(state, provider, home=home), provider


def test_a_jobs_snapshots_go_to_its_bucket_and_a_job_elsewhere_resumes_from_it(
    store: StoreStandIn, tmp_path: Path
) -> None:
    head = tmp_path / "head"
    head.mkdir()
    coord, _ = coordinator(tmp_path / "laptop", head)
    job = JobSpec(("train.py",), checkpoint_url=store.url, checkpoint_keep=1)
    rec = coord.submit("c1", job)
    assert (rec.detail["checkpoint_url"], rec.detail["checkpoint_keep"]) == (store.url, 1)
    for epoch in (1, 2):
        (head / "model.pt").write_text(f"epoch {epoch}")
        newest = coord.pull_checkpoints(rec.id)
        assert newest is not None
    assert newest is not None
    prefix = f"{store.prefix}/{rec.id}"
    assert store.keys() == {f"{prefix}/{newest.name}/model.pt", f"{prefix}/{newest.name}{MARKER}"}
    coord.state.close()

    other, provider = coordinator(tmp_path / "other-laptop", tmp_path / "empty")
    resumed = other.submit(
        "c1", JobSpec(("train.py",), resume_from=rec.id, checkpoint_url=store.url)
    )
    puts = [c for ex in provider.executors.values() for c in ex.calls if c.kind == "put"]
    restored = tmp_path / "other-laptop" / "checkpoints" / rec.id / newest.name
    assert [c.argv[0] for c in puts if c.argv[0] == str(restored)] == [str(restored)] * 2
    assert (restored / "model.pt").read_text() == "epoch 2"
    assert resumed.detail["checkpoint_keep"] == checkpoints.KEEP
    other.state.close()


def test_a_bucket_that_fails_leaves_the_local_snapshot_and_is_tried_again(
    store: StoreStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    head = tmp_path / "head"
    head.mkdir()
    coord, _ = coordinator(tmp_path / "laptop", head)
    rec = coord.submit("c1", JobSpec(("train.py",), checkpoint_url=store.url))
    (head / "model.pt").write_text("epoch 1")
    store.fail = lambda seen: True
    newest = coord.pull_checkpoints(rec.id)
    assert newest is not None
    assert (newest / "model.pt").read_text() == "epoch 1"
    assert f"could not copy the checkpoints of {rec.id} to {store.url}" in caplog.text
    store.fail = None
    assert store.keys() == set()
    assert coord.pull_checkpoints(rec.id) == newest, "nothing new on the node"
    prefix = f"{store.prefix}/{rec.id}/{newest.name}"
    assert store.keys() == {f"{prefix}/model.pt", f"{prefix}{MARKER}"}, "but pushed now"
    coord.state.close()


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (JobSpec(("train.py",), checkpoint_keep=0), "checkpoint_keep 0 is not allowed"),
        (JobSpec(("train.py",), checkpoint_url="zz://x/y"), "checkpoint 'zz://x/y': no provider"),
    ],
)
def test_submit_refuses_a_bad_bucket_or_keep_before_anything_is_made(
    tmp_path: Path, job: JobSpec, message: str
) -> None:
    coord, provider = coordinator(tmp_path, tmp_path / "head")
    with pytest.raises(ConfigError, match=message):
        coord.submit("c1", job)
    assert coord.state.jobs("c1") == []
    assert [c for ex in provider.executors.values() for c in ex.calls] == []
    coord.state.close()
