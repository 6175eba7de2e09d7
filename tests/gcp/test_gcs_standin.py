"""The GCS stand-in itself (`gcs.py`), driven by google-cloud-storage: what the checkpoint
contract does not reach (pages, ranged reads, a rewrite in steps the caller asks for, the
SDK's own reader, a chunk the server keeps part of), so that the store passing against it
means something."""

from __future__ import annotations

import io
from typing import Any

import pytest
from google.api_core import exceptions

from tests.gcp.gcs import REWRITE_STEP
from tests.gcp.storage import BUCKET, GcsStandIn


@pytest.fixture
def bucket(gcs_store: GcsStandIn) -> Any:
    import google.cloud.storage  # type: ignore[import-untyped]

    client = google.cloud.storage.Client(project=None)  # STORAGE_EMULATOR_HOST: anonymous
    client._bucket_metadata_cache = None  # no GET of the bucket from a thread of its own
    return client.bucket(BUCKET)


def test_a_listing_comes_in_pages_of_names_and_prefixes(gcs_store: GcsStandIn, bucket: Any) -> None:
    for key in ("a/1", "a/2", "b", "c/x/y", "d"):
        gcs_store.put(key, b"x")
    found = bucket.client.list_blobs(bucket, delimiter="/", page_size=2)
    pages = [([b.name for b in page], sorted(page.prefixes)) for page in found.pages]
    assert pages == [(["b"], ["a/"]), (["d"], ["c/"])]  # a prefix takes a place in a page
    assert [b.name for b in bucket.client.list_blobs(bucket, prefix="a/")] == ["a/1", "a/2"]
    assert [s.action for s in gcs_store.seen] == ["list"] * 3


def test_reads_take_a_range_and_the_sdks_reader_goes_on_from_there(
    gcs_store: GcsStandIn, bucket: Any
) -> None:
    gcs_store.put("k", bytes(range(100)))
    blob = bucket.blob("k")
    assert blob.download_as_bytes(start=10, end=19) == bytes(range(10, 20))
    assert blob.download_as_bytes(start=95) == bytes(range(95, 100))
    with pytest.raises(exceptions.RequestRangeNotSatisfiable):
        blob.download_as_bytes(start=100)
    with blob.open("rb", chunk_size=30) as reader:
        assert reader.read(40) + reader.read() == bytes(range(100))
    assert blob.download_as_bytes() == bytes(range(100)), "checked against X-Goog-Hash"


def test_a_rewrite_goes_on_from_its_token_in_steps(gcs_store: GcsStandIn, bucket: Any) -> None:
    data = bytes(2 * REWRITE_STEP) + b"end"
    gcs_store.put("src", data)
    dest, token, steps = bucket.blob("dst"), None, list[tuple[int, int, bool]]()
    while token is not None or not steps:
        token, done, total = dest.rewrite(bucket.blob("src"), token=token)
        steps.append((done, total, "dst" in gcs_store.buckets[BUCKET]))
    step, size = REWRITE_STEP, len(data)
    assert steps == [(step, size, False), (2 * step, size, False), (size, size, True)]
    assert gcs_store.body("dst") == data
    assert [s.action for s in gcs_store.seen] == ["copy"] * 3
    with pytest.raises(exceptions.NotFound, match="No such object: ckpts/nope"):
        dest.rewrite(bucket.blob("nope"))
    with pytest.raises(exceptions.BadRequest, match="Invalid rewrite token"):
        dest.rewrite(bucket.blob("src"), token="made-up")


def test_a_resumable_upload_keeps_whole_quanta_of_each_chunk(
    gcs_store: GcsStandIn, bucket: Any
) -> None:
    import requests

    blob = bucket.blob("big", chunk_size=256 << 10)
    data = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and 4 bytes: 5 chunks
    blob.upload_from_file(io.BytesIO(data), content_type="application/octet-stream")
    assert gcs_store.body("big") == data
    assert [s.action for s in gcs_store.seen if s.key == "big"] == ["other"] + ["write"] * 5

    data = bytes(range(100)) * 3000
    session = bucket.blob("odd").create_resumable_upload_session(size=len(data))
    first = requests.put(session, data=data, headers={"Content-Range": "bytes 0-299999/*"})
    assert (first.status_code, first.headers["Range"]) == (308, "bytes=0-262143")
    rest = {"Content-Range": "bytes 262144-299999/300000"}
    last = requests.put(session, data=data[262144:], headers=rest)
    assert (last.status_code, last.json()["size"]) == (200, "300000")
    assert gcs_store.body("odd") == data
