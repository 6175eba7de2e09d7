"""Azure's rule for a checkpoint URL's account and container (``az://ACCOUNT/CONTAINER/PREFIX``),
as the Azure plugin's store gives it to the core, and the store opened without its SDK."""

from __future__ import annotations

import sys

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.azure._store import BlobStore, refused
from cloudtrain.provision import registry
from cloudtrain.spec import BucketURL

ACCOUNT = "3 to 24 lowercase letters and digits"
CONTAINER = "3 to 63 lowercase letters, digits and '-' (a letter or digit at each end, no '--')"


@pytest.mark.parametrize(
    ("account", "prefix"),
    [
        ("devstoreaccount1", "ckpts/runs/bert"),
        ("abc", "ckpts"),
        ("a1" * 12, "c" * 63),
        ("0acct", "0-runs-9/x"),
        ("acct", "a-b/Deeper/Parts_ok"),  # only the container has Azure's rule
    ],
)
def test_an_account_and_container_azure_allows_are_not_refused(account: str, prefix: str) -> None:
    assert refused(BucketURL(account, prefix, "az")) is None


@pytest.mark.parametrize(
    ("account", "prefix", "said"),
    [
        ("ab", "ckpts", f"'ab' is not an Azure storage account name: {ACCOUNT}"),
        ("a" * 25, "ckpts", f"{'a' * 25!r} is not an Azure storage account name: {ACCOUNT}"),
        ("Acct", "ckpts", f"'Acct' is not an Azure storage account name: {ACCOUNT}"),
        ("my-acct", "ckpts", f"'my-acct' is not an Azure storage account name: {ACCOUNT}"),
        ("my.acct", "ckpts", f"'my.acct' is not an Azure storage account name: {ACCOUNT}"),
        ("acct", "", "an Azure URL needs a container: write az://ACCOUNT/CONTAINER/PREFIX"),
        ("acct", "ab/x", f"'ab' is not an Azure container name: {CONTAINER}"),
        ("acct", "c" * 64, f"{'c' * 64!r} is not an Azure container name: {CONTAINER}"),
        ("acct", "-ckpts/x", f"'-ckpts' is not an Azure container name: {CONTAINER}"),
        ("acct", "ckpts-/x", f"'ckpts-' is not an Azure container name: {CONTAINER}"),
        ("acct", "ck--pts/x", f"'ck--pts' is not an Azure container name: {CONTAINER}"),
        ("acct", "Ckpts/x", f"'Ckpts' is not an Azure container name: {CONTAINER}"),
        ("acct", "ck_pts/x", f"'ck_pts' is not an Azure container name: {CONTAINER}"),
        ("acct", "ck.pts/x", f"'ck.pts' is not an Azure container name: {CONTAINER}"),
    ],
)
def test_a_name_azure_refuses_is_said_in_one_line(account: str, prefix: str, said: str) -> None:
    assert refused(BucketURL(account, prefix, "az")) == said
    assert "\n" not in said


def test_the_core_takes_an_az_url_through_the_azure_plugin() -> None:
    url = registry.bucket_url("az://devstoreaccount1/ckpts/runs/bert/")
    assert url == BucketURL("devstoreaccount1", "ckpts/runs/bert", "az")
    store = registry.store(url)
    assert type(store).__module__ == "cloudtrain.providers.azure._store"
    assert isinstance(store, BlobStore)
    assert store._service is None, "no client made before a call needs it"
    for bad, said in [
        ("az://acct/Ckpts/run", f"'Ckpts' is not an Azure container name: {CONTAINER}"),
        ("az://my-acct/ckpts", f"'my-acct' is not an Azure storage account name: {ACCOUNT}"),
        ("az://acct", "an Azure URL needs a container: write az://ACCOUNT/CONTAINER/PREFIX"),
    ]:
        with pytest.raises(ConfigError) as caught:
            registry.bucket_url(bad)
        assert str(caught.value) == f"checkpoint {bad!r}: {said}"
    with pytest.raises(ConfigError) as caught:
        registry.bucket_url("zz://ckpts/run")
    said = str(caught.value)  # each store's own form
    assert "no provider keeps checkpoints at zz://; write az://ACCOUNT/CONTAINER/PREFIX, " in said
    assert "s3://BUCKET/PREFIX" in said


def test_without_its_sdk_the_store_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.storage.blob", None)  # an import of it fails
    store = registry.store(registry.bucket_url("az://acct/ckpts/run"))
    with pytest.raises(ConfigError) as caught:
        store.check()
    assert str(caught.value) == (
        "checkpoint az://acct/ckpts/run: a container needs azure-storage-blob: "
        "pip install 'cloudtrain[azure]'"
    )


def test_the_store_imports_no_sdk_until_a_call_needs_it() -> None:
    import subprocess

    code = (
        "import sys; from cloudtrain.provision import registry\n"
        "store = registry.store(registry.bucket_url('az://acct/ckpts/run'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('azure')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
