"""Checkpoints kept in an S3 bucket (`cloudtrain.jobs.buckets`), through real boto3 against
moto's S3 served on 127.0.0.1.

The suite's AWS stand-in (``standin.py``) reads every signed body as a query string, which an
S3 object's bytes are not; so this file serves moto's own server app behind a small recorder
of its own (method, key, copy source, host of every request), started once per session.
``AWS_ENDPOINT_URL_S3`` points boto3 at it while ``AWS_ENDPOINT_URL`` stays at the closed
loopback port of the autouse fixture: S3's own variable is honoured, and nothing else is
reached. Each test asserts the bucket's exact keys afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote
from wsgiref.types import StartResponse, WSGIEnvironment

import boto3
import pytest
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.test import Client

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

BUCKET = "ckpts"
URL = f"s3://{BUCKET}/runs/bert"
JOB = "c1-1"


@dataclass(frozen=True)
class Seen:
    """One request as the server got it: ``PUT ckpts/runs/...`` and where a copy came from."""

    method: str
    path: str
    copy_source: str | None
    host: str


class Recorder:
    """moto's server app, recording each request, and failing those `fail` picks (an S3 error
    document, HTTP 500: botocore makes it a `ClientError`; ``AWS_MAX_ATTEMPTS=1``)."""

    def __init__(self) -> None:
        self.inner = DomainDispatcherApplication(create_backend_app)
        self.seen: list[Seen] = []
        self.fail: Callable[[Seen], bool] | None = None
        self._lock = threading.Lock()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        source = environ.get("HTTP_X_AMZ_COPY_SOURCE")
        seen = Seen(
            environ["REQUEST_METHOD"],
            unquote(environ.get("PATH_INFO", "")).lstrip("/"),
            unquote(source) if source else None,
            environ.get("HTTP_HOST", ""),
        )
        with self._lock:
            self.seen.append(seen)
        if self.fail is not None and self.fail(seen):
            length = int(environ.get("CONTENT_LENGTH") or 0)
            environ["wsgi.input"].read(length)
            body = b"<Error><Code>InternalError</Code><Message>cut short</Message></Error>"
            start_response("500 Internal Server Error", [("Content-Type", "application/xml")])
            return [body]
        answer: Iterable[bytes] = self.inner(environ, start_response)
        return answer

    def writes(self) -> list[Seen]:
        return [s for s in self.seen if s.method in ("PUT", "POST", "DELETE")]


class _Quiet(MotoRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


@pytest.fixture(scope="session")
def s3_server() -> Iterator[tuple[Recorder, str]]:
    app = Recorder()
    server: BaseWSGIServer = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def s3(s3_server: tuple[Recorder, str], monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """moto's S3, emptied, with the bucket made; boto3 in this process pointed at it."""
    app, url = s3_server
    Client(app.inner).post("/moto-api/reset").close()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    app.seen.clear()
    app.fail = None
    return app


def keys() -> set[str]:
    """Every key of the bucket."""
    client = boto3.client("s3", region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def body(key: str) -> bytes:
    client = boto3.client("s3", region_name="us-east-1")
    data: bytes = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return data


def snapshot_keys(name: str, *files: str) -> set[str]:
    return {f"runs/bert/{JOB}/{name}/{f}" for f in files} | {f"runs/bert/{JOB}/{name}{MARKER}"}


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
    s3: Recorder, tmp_path: Path
) -> None:
    bucket = Bucket(URL)
    kept = checkpoints.Kept(tmp_path / "home", JOB, keep=2)
    head = Head(tmp_path)
    optimizer = os.urandom(9 * 1024 * 1024)  # past boto3's multipart threshold (8 MiB)

    head.save(b"epoch 1", optimizer)
    first = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=2, copied=0, removed=0)
    assert keys() == snapshot_keys(first.name, "model.pt", "opt/state.pt")
    assert kept.push(bucket) is None, "pushed already: nothing is called"

    s3.seen.clear()
    head.save(b"epoch 2")  # the optimizer's state is the same
    second = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=1, copied=1, removed=0)
    writes = s3.writes()
    uploads = {s.path for s in writes if s.method == "PUT" and s.copy_source is None}
    copies = {(s.path, s.copy_source) for s in writes if s.copy_source is not None}
    base = f"{BUCKET}/runs/bert/{JOB}"
    assert uploads == {f"{base}/{second.name}/model.pt", f"{base}/{second.name}{MARKER}"}
    assert {path for path, _ in copies} == {f"{base}/{second.name}/opt/state.pt"}
    assert {src.split("?")[0] for _, src in copies} == {f"{base}/{first.name}/opt/state.pt"}

    head.save(b"epoch 3", b"new optimizer state")
    third = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=2, copied=0, removed=1)
    files = ("model.pt", "opt/state.pt")
    assert keys() == snapshot_keys(second.name, *files) | snapshot_keys(third.name, *files)
    assert bucket.snapshots(JOB) == [second.name, third.name]
    assert body(f"runs/bert/{JOB}/{second.name}/opt/state.pt") == optimizer
    assert body(f"runs/bert/{JOB}/{third.name}/model.pt") == b"epoch 3"
    manifest = json.loads(body(f"runs/bert/{JOB}/{third.name}{MARKER}"))
    assert manifest["files"]["model.pt"]["size"] == len(b"epoch 3")
    assert {s.host for s in s3.seen} == {s3_host(s3)}


def s3_host(s3: Recorder) -> str:
    hosts = {s.host for s in s3.seen}
    assert all(h.startswith("127.0.0.1:") for h in hosts), hosts
    return next(iter(hosts))


def test_a_snapshot_whose_upload_was_cut_is_never_the_newest(s3: Recorder, tmp_path: Path) -> None:
    bucket = Bucket(URL)
    kept = checkpoints.Kept(tmp_path / "home", JOB, keep=2)
    head = Head(tmp_path)
    head.save(b"epoch 1", b"opt 1")
    first = head.pull(kept)
    kept.push(bucket)

    head.save(b"epoch 2", b"opt 2")
    second = head.pull(kept)
    s3.fail = lambda seen: seen.method == "PUT" and seen.path.endswith(MARKER)
    with pytest.raises(ProviderError) as caught:
        kept.push(bucket)
    assert caught.value.code == "InternalError"
    assert caught.value.retryable
    assert "\n" not in str(caught.value)
    assert URL in str(caught.value)
    cut = snapshot_keys(second.name, "model.pt", "opt/state.pt") - snapshot_keys(second.name)
    assert keys() == snapshot_keys(first.name, "model.pt", "opt/state.pt") | cut
    assert bucket.newest(JOB) == first.name, "files without their manifest: not complete"

    elsewhere = checkpoints.Kept(tmp_path / "other-home", JOB)
    restored = elsewhere.required(bucket)
    assert restored.name == first.name
    assert (restored / "model.pt").read_bytes() == b"epoch 1"

    s3.fail = None  # the next push completes, and the cut one goes
    head.save(b"epoch 3", b"opt 1")  # as in the newest complete one: copied there
    third = head.pull(kept)
    assert kept.push(bucket) == Pushed(uploaded=1, copied=1, removed=1)
    files = ("model.pt", "opt/state.pt")
    assert keys() == snapshot_keys(first.name, *files) | snapshot_keys(third.name, *files)


def test_restore_into_an_empty_home_takes_the_newest_complete_snapshot_whole(
    s3: Recorder, tmp_path: Path
) -> None:
    bucket = Bucket(URL)
    kept = checkpoints.Kept(tmp_path / "home", JOB, keep=3)
    head = Head(tmp_path)
    for epoch in (1, 2):
        head.save(f"epoch {epoch}".encode(), b"opt")
        head.pull(kept)
        kept.push(bucket)
    before = keys()

    home = tmp_path / "new-home"
    with pytest.raises(NotFoundError, match=f"job {JOB} has no checkpoint kept here"):
        checkpoints.Kept(home, JOB).required()
    restored = checkpoints.Kept(home, JOB).required(bucket)
    assert restored == home / "checkpoints" / JOB / kept.snapshots()[-1].name
    assert (restored / "model.pt").read_bytes() == b"epoch 2"
    assert (restored / "opt" / "state.pt").read_bytes() == b"opt"
    assert sorted(p.name for p in restored.parent.iterdir()) == [".pushed", restored.name]
    s3.seen.clear()
    assert checkpoints.Kept(home, JOB).required(bucket) == restored, "kept now: no download"
    assert s3.seen == []
    assert checkpoints.Kept(home, JOB).push(bucket) is None, "it came from there"
    assert keys() == before, "a restore writes nothing to the bucket"

    with pytest.raises(
        NotFoundError, match=f"job c1-9 has no checkpoint kept here .* nor in {URL}"
    ):
        checkpoints.Kept(home, "c1-9").required(bucket)


def test_a_file_that_does_not_match_its_manifest_is_never_restored(
    s3: Recorder, tmp_path: Path
) -> None:
    bucket = Bucket(URL)
    kept = checkpoints.Kept(tmp_path / "home", JOB)
    head = Head(tmp_path)
    head.save(b"epoch 1", b"opt")
    name = head.pull(kept).name
    kept.push(bucket)
    client = boto3.client("s3", region_name="us-east-1")
    client.put_object(Bucket=BUCKET, Key=f"runs/bert/{JOB}/{name}/model.pt", Body=b"epoch")

    home = tmp_path / "new-home"
    with pytest.raises(CheckpointError, match=r"model.pt \(5 bytes\) does not match"):
        checkpoints.Kept(home, JOB).required(bucket)
    assert list((home / "checkpoints" / JOB).iterdir()) == [], "nothing half-restored is left"

    client.put_object(
        Bucket=BUCKET,
        Key=f"runs/bert/{JOB}/{name}{MARKER}",
        Body=json.dumps({"files": {"../../escape": {"size": 1, "sha256": "x"}}}).encode(),
    )
    with pytest.raises(CheckpointError, match=r"its manifest names '../../escape'"):
        checkpoints.Kept(home, JOB).required(bucket)
    assert not (tmp_path / "escape").exists()


def test_an_object_longer_than_its_manifest_says_is_read_no_further(
    s3: Recorder, tmp_path: Path
) -> None:
    """A bucket is as untrusted as a node: a restore writes no more of a file than its
    manifest says, and one byte to know it was more."""
    bucket = Bucket(URL)
    kept = checkpoints.Kept(tmp_path / "home", JOB)
    head = Head(tmp_path)
    head.save(b"epoch 1", b"opt")
    name = head.pull(kept).name
    kept.push(bucket)
    client = boto3.client("s3", region_name="us-east-1")
    key = f"runs/bert/{JOB}/{name}/model.pt"
    client.put_object(Bucket=BUCKET, Key=key, Body=b"x" * (4 << 20))
    home = tmp_path / "new-home"
    with pytest.raises(CheckpointError, match=r"model.pt \(8 bytes\) does not match"):
        checkpoints.Kept(home, JOB).required(bucket)
    assert list((home / "checkpoints" / JOB).iterdir()) == [], "nothing half-restored is left"


def test_a_manifest_claiming_more_than_the_bound_downloads_nothing(
    s3: Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = boto3.client("s3", region_name="us-east-1")
    files = {"model.pt": {"size": 2 * 10**9, "sha256": "0" * 64}}
    client.put_object(Bucket=BUCKET, Key=f"runs/bert/{JOB}/5/model.pt", Body=b"x")
    manifest = json.dumps({"files": files}).encode()
    client.put_object(Bucket=BUCKET, Key=f"runs/bert/{JOB}/5{MARKER}", Body=manifest)
    monkeypatch.setenv("CLOUDTRAIN_MAX_PULL_GB", "1")
    s3.seen.clear()
    with pytest.raises(CheckpointError, match="more than the bound allows"):
        checkpoints.Kept(tmp_path / "home", JOB).required(Bucket(URL))
    assert not [s for s in s3.seen if s.method == "GET" and s.path.endswith("/5/model.pt")]


def test_bucket_errors_are_cloudtrains_one_line_naming_the_bucket(
    s3: Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ProviderError) as caught:
        Bucket("s3://no-such-bucket/x").snapshots(JOB)
    assert caught.value.code == "NoSuchBucket"
    assert "s3://no-such-bucket/x" in str(caught.value)

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # closed
    with pytest.raises(ProviderError) as refused:
        Bucket(URL).snapshots(JOB)
    assert refused.value.code == "EndpointConnectionError"
    assert refused.value.retryable
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
    s3: Recorder, tmp_path: Path
) -> None:
    head = tmp_path / "head"
    head.mkdir()
    coord, _ = coordinator(tmp_path / "laptop", head)
    job = JobSpec(("train.py",), checkpoint_url=URL, checkpoint_keep=1)
    rec = coord.submit("c1", job)
    assert (rec.detail["checkpoint_url"], rec.detail["checkpoint_keep"]) == (URL, 1)
    for epoch in (1, 2):
        (head / "model.pt").write_text(f"epoch {epoch}")
        newest = coord.pull_checkpoints(rec.id)
        assert newest is not None
    assert newest is not None
    prefix = f"runs/bert/{rec.id}"
    assert keys() == {f"{prefix}/{newest.name}/model.pt", f"{prefix}/{newest.name}{MARKER}"}
    coord.state.close()

    other, provider = coordinator(tmp_path / "other-laptop", tmp_path / "empty")
    resumed = other.submit("c1", JobSpec(("train.py",), resume_from=rec.id, checkpoint_url=URL))
    puts = [c for ex in provider.executors.values() for c in ex.calls if c.kind == "put"]
    restored = tmp_path / "other-laptop" / "checkpoints" / rec.id / newest.name
    assert [c.argv[0] for c in puts if c.argv[0] == str(restored)] == [str(restored)] * 2
    assert (restored / "model.pt").read_text() == "epoch 2"
    assert resumed.detail["checkpoint_keep"] == checkpoints.KEEP
    other.state.close()


def test_a_bucket_that_fails_leaves_the_local_snapshot_and_is_tried_again(
    s3: Recorder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    head = tmp_path / "head"
    head.mkdir()
    coord, _ = coordinator(tmp_path / "laptop", head)
    rec = coord.submit("c1", JobSpec(("train.py",), checkpoint_url=URL))
    (head / "model.pt").write_text("epoch 1")
    s3.fail = lambda seen: True
    newest = coord.pull_checkpoints(rec.id)
    assert newest is not None
    assert (newest / "model.pt").read_text() == "epoch 1"
    assert f"could not copy the checkpoints of {rec.id} to {URL}" in caplog.text
    s3.fail = None
    assert keys() == set()
    assert coord.pull_checkpoints(rec.id) == newest, "nothing new on the node"
    prefix = f"runs/bert/{rec.id}/{newest.name}"
    assert keys() == {f"{prefix}/model.pt", f"{prefix}{MARKER}"}, "but pushed now"
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
