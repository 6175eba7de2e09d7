"""GCS's rule for a checkpoint bucket's name (``gs://BUCKET/PREFIX``), as the GCP plugin's store
gives it to the core, and the store opened without its SDK."""

from __future__ import annotations

import importlib
import sys

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.gcp._store import refused
from cloudtrain.provision import registry
from cloudtrain.spec import BucketURL

ALLOWED = "3 to 63 lowercase letters, digits, '-', '_' and '.'"


@pytest.mark.parametrize(
    "name",
    [
        "ckpts",
        "abc",
        "my_team-ckpts.2",
        "0-runs",
        "a" * 63,
        "example.com",
        ".".join(["a" * 63] * 3) + ".b" * 15,  # 221 characters with dots, each part 63 at most
        "ggl-runs",
        "my-goog-ckpts",  # only a name that starts with it is refused
    ],
)
def test_a_name_gcs_allows_is_not_refused(name: str) -> None:
    assert refused(BucketURL(name, "runs", "gs")) is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ab", ALLOWED),
        ("a" * 64, ALLOWED),
        ("-ckpts", ALLOWED),
        ("ckpts_", ALLOWED),
        ("Ckpts", ALLOWED),
        ("ck pts", ALLOWED),
        ("ck..pts", ALLOWED),
        ("a" * 64 + ".com", ALLOWED),  # each dot-separated part 63 at most
        (".".join(["a" * 63] * 3) + ".bb" * 11, ALLOWED),  # 222 at most
        ("192.168.5.4", "it reads as an IP address"),
        ("goog-ckpts", "it may not start with 'goog'"),
        ("my-google-ckpts", "it may not contain 'google'"),
        ("g00gle-ckpts", "it may not contain 'google' or a close misspelling"),
        ("runs.goog1e", "close misspelling"),
    ],
)
def test_a_name_gcs_refuses_is_said_in_one_line(name: str, why: str) -> None:
    said = refused(BucketURL(name, "runs", "gs"))
    assert said is not None
    assert said.startswith(f"{name!r} is not a GCS bucket name: ")
    assert why in said
    assert "\n" not in said


def test_the_core_takes_a_gs_url_through_the_gcp_plugin() -> None:
    url = registry.bucket_url("gs://ckpts/team/run/")
    assert url == BucketURL("ckpts", "team/run", "gs")
    store = registry.store(url)
    assert type(store).__module__ == "cloudtrain.providers.gcp._store"
    assert vars(store) == {"url": url, "_client": None, "_session": None}, "nothing made yet"
    with pytest.raises(ConfigError) as caught:
        registry.bucket_url("gs://my-google-ckpts/run")
    said = str(caught.value)
    assert said.startswith(
        "checkpoint 'gs://my-google-ckpts/run': 'my-google-ckpts' is not a GCS bucket name: "
    )
    assert "\n" not in said
    with pytest.raises(ConfigError, match=r"no provider keeps checkpoints at zz://; write .*"
                       r"gs://BUCKET/PREFIX, .*s3://BUCKET/PREFIX"):  # fmt: skip
        registry.bucket_url("zz://ckpts/run")


def test_the_store_needs_its_sdk_only_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported and opened without google-cloud-storage; `check` says how to install it."""
    package = importlib.import_module("cloudtrain.providers.gcp")
    monkeypatch.setattr(package, "_store", package._store)  # put back as it was, afterwards
    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "cloudtrain.providers.gcp._store")
    module = importlib.import_module("cloudtrain.providers.gcp._store")
    store = module.open_store(BucketURL("ckpts", "runs", "gs"))
    with pytest.raises(ConfigError, match=r"pip install 'cloudtrain\[gcp\]'") as caught:
        store.check()
    assert str(caught.value).startswith("checkpoint gs://ckpts/runs: ")
