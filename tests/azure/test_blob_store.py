"""The Azure plugin's checkpoint store (``providers/azure/_store.py``) where the contract
(`tests/contract/test_checkpoint_stores.py`) does not look: a bearer token from the provider's
credential chain, over https, against Azurite's OAuth; deletes that fail; reads of a blob that
changed; its settings refused. Against Azurite (`tests/azure/blob.py`)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken

from cloudtrain.errors import AuthError, ConfigError, ProviderError
from cloudtrain.providers.azure import _store
from cloudtrain.providers.azure._client import Clients
from cloudtrain.provision import registry
from cloudtrain.provision.store import ObjectStore
from tests.azure.blob import ACCOUNT, CONTAINER, AzureBlobStandIn, Azurite
from tests.contract.stores import Seen
from tests.tls import certificate

STORAGE_SCOPE = "https://storage.azure.com/.default"


def store_of(url: str) -> ObjectStore:
    return registry.store(registry.bucket_url(url))


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


class Token:
    """A credential of the provider's kind (`TokenCredential`) whose tokens are JWTs of Entra
    ID's shape, which Azurite's ``--oauth basic`` checks (issuer, audience, lifetime)."""

    def __init__(self, audience: str = "https://storage.azure.com") -> None:
        self.audience = audience
        self.scopes: list[str] = []

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        self.scopes += scopes
        now = int(time.time())
        body = {"aud": self.audience, "iss": "https://sts.windows.net/test-tenant/",
                "iat": now, "nbf": now - 60, "exp": now + 3600}  # fmt: skip
        jwt = f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64(body)}.c2lnbmF0dXJl"
        return AccessToken(jwt, now + 3600)


@pytest.fixture
def azurite_oauth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Azurite]:
    """Azurite over https (a certificate made here, trusted through ``REQUESTS_CA_BUNDLE``)
    taking bearer tokens; the store pointed at it with no key, so it asks the provider's
    credential chain."""
    cert, key = certificate(tmp_path, "cloudtrain azure stand-in")
    with Azurite("--oauth", "basic", "--cert", str(cert), "--key", str(key)) as azurite:
        assert azurite.base.startswith("https://")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
        monkeypatch.setenv("CLOUDTRAIN_AZURE_BLOB_ENDPOINT", f"{azurite.base}/{{account}}")
        monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
        monkeypatch.setattr(_store, "RETRIES", 0)
        with azurite.client() as direct:
            direct.create_container(CONTAINER)
        yield azurite


def test_without_a_key_the_store_sends_the_provider_chains_bearer_token_over_https(
    azurite_oauth: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = Token()
    monkeypatch.setattr(Clients, "credential", lambda self: token)
    store = store_of(f"az://{ACCOUNT}/{CONTAINER}/runs")
    base = f"{CONTAINER}/runs"
    with store.errors():
        store.put(f"{base}/1/model.pt", b"epoch 1", "application/octet-stream")
        store.copy(f"{base}/1/model.pt", f"{base}/2/model.pt")
        assert store.listing(f"{base}/") == ([], [f"{base}/1", f"{base}/2"])
        assert store.open(f"{base}/2/model.pt").read(100) == b"epoch 1"
        assert store.delete([f"{base}/1/model.pt"]) == []
        assert list(store.keys(f"{base}/")) == [f"{base}/2/model.pt"]
    assert set(token.scopes) == {STORAGE_SCOPE}

    monkeypatch.setattr(Clients, "credential", lambda self: Token("https://management.azure.com"))
    url = f"az://{ACCOUNT}/{CONTAINER}/runs"
    store = store_of(url)
    with pytest.raises(AuthError) as caught, store.errors():
        store.listing(f"{base}/")
    said = str(caught.value)
    assert caught.value.code == "AuthenticationFailed"
    assert url in said
    assert "'Storage Blob Data Contributor' role on storage account devstoreaccount1" in said
    assert "\n" not in said


def test_a_delete_says_which_blobs_it_could_not_remove_and_why(
    azure_store: AzureBlobStandIn,
) -> None:
    from azure.storage.blob import BlobClient

    base = azure_store.prefix
    for name in ("free", "leased"):
        azure_store.put(f"{base}/{name}", name.encode())
    leased: BlobClient = azure_store._direct.get_blob_client(CONTAINER, "runs/bert/leased")
    leased.acquire_lease(-1)
    azure_store.seen.clear()
    store = store_of(azure_store.url)
    keys = [f"{base}/free", f"{base}/leased", f"{base}/never-there"]
    with store.errors():
        assert store.delete(keys) == [(f"{base}/leased", "HTTP 412, LeaseIdMissing")]
    assert azure_store.keys() == {f"{base}/leased"}
    assert [(s.action, s.key) for s in azure_store.seen] == [("delete", k) for k in keys]
    assert len({s.host for s in azure_store.seen}) == 1


def test_a_reader_reads_what_it_is_asked_of_the_version_it_began_with(
    azure_store: AzureBlobStandIn,
) -> None:
    base = azure_store.prefix
    azure_store.put(f"{base}/empty", b"")
    azure_store.put(f"{base}/model.pt", b"0123456789")
    store = store_of(azure_store.url)
    with store.errors():
        assert store.open(f"{base}/empty").read(1) == b""
        reader = store.open(f"{base}/model.pt")
        azure_store.seen.clear()
        assert reader.read(4) == b"0123"
        assert reader.read(100) == b"456789"
        assert reader.read(1) == b"", "its end is known: nothing is asked"
        assert [s.action for s in azure_store.seen] == ["read", "read"]
        reader = store.open(f"{base}/model.pt")
        assert reader.read(4) == b"0123"
        azure_store.put(f"{base}/model.pt", b"another version")
    with pytest.raises(ProviderError) as caught, store.errors():
        reader.read(4)
    assert caught.value.code == "ConditionNotMet"
    assert azure_store.url in str(caught.value)


def test_a_wrong_key_is_an_auth_error_naming_the_bucket(
    azure_store: AzureBlobStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_KEY", base64.b64encode(b"not the key").decode())
    store = store_of(azure_store.url)
    with pytest.raises(AuthError) as caught, store.errors():
        store.listing(f"{azure_store.prefix}/")
    said = str(caught.value)
    assert caught.value.code == "AuthorizationFailure"
    assert azure_store.url in said
    assert "Check AZURE_STORAGE_KEY: it must be a key of storage account devstoreaccount1" in said
    assert "\n" not in said
    assert [s.action for s in azure_store.seen] == ["list"]
    assert azure_store.seen == [Seen("list", "", None, azure_store.seen[0].host)]


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"CLOUDTRAIN_AZURE_BLOB_ENDPOINT": "http://127.0.0.1:10000/devstoreaccount1"},
         "is not an endpoint template: write an http(s) URL with {account} where"),
        ({"CLOUDTRAIN_AZURE_BLOB_ENDPOINT": "127.0.0.1:10000/{account}"},
         "is not an endpoint template"),
        ({"CLOUDTRAIN_AZURE_BLOB_ENDPOINT": "http://127.0.0.1:10000/{account}"},
         "is http, and azure-core sends bearer tokens over TLS only: use https, or set "
         "AZURE_STORAGE_KEY to a key of storage account devstoreaccount1"),
        ({"CLOUDTRAIN_AZURE_BLOB_ENDPOINT": "http://127.0.0.1:10000/{account}",
          "AZURE_STORAGE_KEY": "a2V5", "AZURE_STORAGE_ACCOUNT": "another"},
         "is http, and azure-core sends bearer tokens"),  # the key is another account's
    ],
)  # fmt: skip
def test_its_settings_are_refused_in_one_line_before_any_call(
    env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = store_of(f"az://{ACCOUNT}/{CONTAINER}/runs")
    with pytest.raises(ConfigError) as caught, store.errors():
        store.listing(f"{CONTAINER}/runs/")
    assert said in str(caught.value)
    assert str(caught.value).startswith(f"checkpoint az://{ACCOUNT}/{CONTAINER}/runs: ")
    assert "\n" not in str(caught.value)
