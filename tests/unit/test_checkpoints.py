"""Checkpoints kept on the user's machine: whole snapshots only, the newest few, each left as
it was when a later copy changes a file (the local executor's copy, as rsync's, writes new
files)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError, NotFoundError
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.jobs import buckets, checkpoints
from cloudtrain.spec import parse_bucket_url


def test_a_snapshot_per_change_the_newest_kept_and_each_left_as_it_was(tmp_path: Path) -> None:
    node = tmp_path / "node" / "checkpoints"
    kept = checkpoints.Kept(tmp_path / "home", "c1-1")
    ex = LocalExecutor()
    assert kept.pull(ex, str(node)) is None, "no folder on the node yet"
    node.mkdir(parents=True)
    assert kept.pull(ex, str(node)) is None, "an empty folder is no checkpoint"
    (node / "model.pt").write_text("epoch 1")
    first = kept.pull(ex, str(node))
    assert first is not None
    assert kept.pull(ex, str(node)) == first, "nothing changed: no new snapshot"
    for epoch in (2, 3):
        (node / "model.pt").write_text(f"epoch {epoch}")
        os.utime(node / "model.pt", (epoch * 1000, epoch * 1000))
        newest = kept.pull(ex, str(node))
        assert newest is not None
        assert (newest / "model.pt").read_text() == f"epoch {epoch}"
    assert len(kept.snapshots()) == checkpoints.KEEP
    assert not first.exists(), "the oldest went"
    older = kept.snapshots()[0]
    assert (older / "model.pt").read_text() == "epoch 2", "a later copy left it as it was"
    assert kept.required() == kept.newest()


def test_a_checkpoints_age_is_from_when_the_node_wrote_it_not_when_it_came_home(
    tmp_path: Path,
) -> None:
    """A snapshot taken after a recovery began (pulled from a node that survived) is named
    after it: its age is from its files' times, which the copy keeps, and never below 0."""
    node = tmp_path / "node"
    (node / "sub").mkdir(parents=True)
    for name, written in (("model.pt", 1_000.0), ("sub/optim.pt", 1_010.0)):
        (node / name).write_text(name)
        os.utime(node / name, (written, written))
    snapshot = checkpoints.Kept(tmp_path / "home", "c1-1").pull(LocalExecutor(), str(node))
    assert snapshot is not None
    assert int(snapshot.name) / 1000 > 1_010
    assert checkpoints.age(snapshot, 1_030.0) == 20.0
    assert checkpoints.age(snapshot, 1_005.0) == 0.0, "a node's clock ahead: no negative age"
    empty = tmp_path / "home" / "1500000"
    empty.mkdir()
    assert checkpoints.age(empty, 1_600.0) == 100.0, "no file: from when it was kept"


def test_a_job_with_nothing_kept_is_named(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="job c1-9 has no checkpoint kept here"):
        checkpoints.Kept(tmp_path, "c1-9").required()


def test_a_node_folder_is_the_jobs_override_or_its_roots() -> None:
    assert checkpoints.node_folder("/n/root", "c-2", None) == "/n/root/checkpoints/c-2"
    assert checkpoints.node_folder("/n/root", "c-2", "/data/ckpt") == "/data/ckpt"


def test_keep_is_how_many_snapshots_stay(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    kept = checkpoints.Kept(tmp_path / "home", "c1-1", keep=3)
    ex = LocalExecutor()
    for epoch in range(1, 6):
        (node / "model.pt").write_text(f"epoch {epoch}")
        os.utime(node / "model.pt", (epoch * 1000, epoch * 1000))
        assert kept.pull(ex, str(node)) is not None
    assert [(s / "model.pt").read_text() for s in kept.snapshots()] == [
        "epoch 3",
        "epoch 4",
        "epoch 5",
    ]
    one = checkpoints.Kept(tmp_path / "home", "c1-1", keep=1)
    (node / "model.pt").write_text("epoch 6")
    assert one.pull(ex, str(node)) is not None
    assert [(s / "model.pt").read_text() for s in one.snapshots()] == ["epoch 6"]


@pytest.mark.parametrize("keep", [0, -1, True, 1.5, "2"])
def test_keep_is_a_whole_number_of_one_or_more(tmp_path: Path, keep: object) -> None:
    with pytest.raises(ConfigError, match=r"^checkpoint_keep .* is not allowed; use a whole "):
        checkpoints.Kept(tmp_path, "c1-1", keep=keep)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://ckpts", "ckpts", ""),
        ("s3://ckpts/", "ckpts", ""),
        ("s3://my.ckpts-1/runs/bert", "my.ckpts-1", "runs/bert"),
        ("s3://abc/runs/bert/", "abc", "runs/bert"),
        ("s3://abc/Team_A/(v2)!*'.x-y", "abc", "Team_A/(v2)!*'.x-y"),
    ],
)
def test_a_bucket_url_is_split_and_normalized(url: str, bucket: str, prefix: str) -> None:
    parsed = parse_bucket_url(url)
    assert (parsed.bucket, parsed.prefix) == (bucket, prefix)
    assert str(parsed) == f"s3://{bucket}/{prefix}".rstrip("/")
    assert str(buckets.Bucket(url)) == str(parsed)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("zz://ckpts/x", "no provider keeps checkpoints at zz://"),
        ("https://ckpts.s3.amazonaws.com/x", "no provider keeps checkpoints at https://"),
        ("/data/ckpts", "is not a bucket URL"),
        ("S3://ckpts", "is not a bucket URL"),
        ("s3://", "'' is not a bucket name"),
        ("s3://Ckpts", "'Ckpts' is not a bucket name"),
        ("s3://ck pts", "'ck pts' is not a bucket name"),
        ("s3://-ckpts", "'-ckpts' is not a bucket name"),
        ("s3://ab", "'ab' is not an S3 bucket name"),
        ("s3://" + "a" * 64, "is not an S3 bucket name"),
        ("s3://ck_pts", "'ck_pts' is not an S3 bucket name"),
        ("s3://ckpts-", "is not an S3 bucket name"),
        ("s3://ck..pts", "is not an S3 bucket name"),
        ("s3://192.168.1.1", "is not an S3 bucket name"),
        ("s3://xn--ckpts", "is not an S3 bucket name"),
        ("s3://ckpts-s3alias", "is not an S3 bucket name"),
        ("s3://ckpts/a//b", "the prefix part '' is not allowed"),
        ("s3://ckpts/a/../b", "the prefix part '..' is not allowed"),
        ("s3://ckpts/a b", "the prefix part 'a b' is not allowed"),
        ("s3://ckpts/a?versionId=1", "the prefix part 'a?versionId=1' is not allowed"),
        ("s3://ckpts/a\nb", "is not allowed"),
        ("s3://ckpts/" + "a" * 513, "the prefix is longer than 512 characters"),
    ],
)
def test_a_bad_bucket_url_is_one_line_naming_field_value_and_rule(url: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        buckets.Bucket(url)
    message = str(caught.value)
    assert message.startswith(f"checkpoint {url!r}")
    assert why in message
    assert "\n" not in message
    if "an S3 bucket name" in why:
        assert "3 to 63 lowercase letters" in message
    elif "prefix is longer" not in why:
        assert "s3://BUCKET/PREFIX" in message


def test_a_bucket_url_that_is_no_string_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^checkpoint 3 is not a bucket URL"):
        parse_bucket_url(3)


def test_no_bucket_is_none_and_a_bucket_needs_boto3(monkeypatch: pytest.MonkeyPatch) -> None:
    assert checkpoints.bucket_of(None) is None
    assert str(checkpoints.bucket_of("s3://ckpts/p")) == "s3://ckpts/p"
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` raises ImportError
    monkeypatch.setitem(sys.modules, "boto3.exceptions", None)
    with pytest.raises(ConfigError) as caught:
        checkpoints.bucket_of("s3://ckpts/p")
    assert str(caught.value) == (
        "checkpoint s3://ckpts/p: a bucket needs boto3: pip install 'cloudtrain[aws]'"
    )
