"""Every azure-core failure is one cloudtrain error of one line: the real SDK clients against the
ARM stand-in answering what ARM never sends (a proxy's HTML page, a garbled or cut-short body, a
connection closed unanswered), and azure-core's other exceptions mapped at the boundary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from azure.core import exceptions as zx

from cloudtrain.errors import AuthError, ProviderError
from cloudtrain.providers.azure._client import Clients, azure_errors
from cloudtrain.providers.azure._errors import map_azure_error
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.azure.standin import StandIn
from tests.integration.conftest import Shell
from tests.raw import BAD_GATEWAY, one_line

GARBLED = b'{"value": [{"resourceType": "virtualMachines", "name": "Standard_ND96a'
JSON = "application/json; charset=utf-8"


def list_skus(clients: Clients) -> list[Any]:
    with azure_errors("eastus"):
        return list(clients.compute().resource_skus.list(filter="location eq 'eastus'"))


@pytest.mark.parametrize(
    ("raw", "code", "retryable", "says"),
    [
        (
            {"status": 502, "body": BAD_GATEWAY},
            "HTTP502",
            True,
            "/providers/Microsoft.Compute/skus was answered HTTP 502, text/html, a page titled "
            "'502 Bad Gateway' (eastus): not an ARM error; a proxy",
        ),
        (
            {"status": 403, "body": BAD_GATEWAY.replace(b"502", b"403")},
            "HTTP403",
            False,
            "HTTP 403, text/html, a page titled '403 Bad Gateway' (eastus): not an ARM error",
        ),
        (
            {"status": 200, "body": GARBLED, "content_type": JSON},
            "DecodeError",
            True,
            "azure: DecodeError: the answer in eastus is not JSON (JSON is invalid: "
            "Unterminated string",
        ),
        (
            {"status": 200, "body": GARBLED, "content_type": JSON, "length": 4096},
            "IncompleteReadError",
            True,
            "azure: IncompleteReadError: the answer in eastus was cut short (('Connection broken",
        ),
        (
            {"status": 200, "body": b'{"value": 7}', "content_type": JSON},
            "DeserializationError",
            False,
            "the answer in eastus is JSON of a shape this SDK does not read (TypeError: 'int' "
            "object is not iterable)",
        ),
        ({"drop": True}, "ConnectionError", True, "Remote end closed connection without response"),
        (
            {"status": 200, "body": BAD_GATEWAY.replace(b"502 Bad Gateway", b"Sign in")},
            "DecodeError",
            True,
            "azure: DecodeError: the answer in eastus is not JSON (",
        ),
    ],
    ids=["nginx-502", "nginx-403", "garbled", "cut", "wrong-shape", "closed", "html-200"],
)
def test_an_answer_that_is_no_arm_response_is_one_line(
    azure: StandIn, raw: dict[str, Any], code: str, retryable: bool, says: str
) -> None:
    fault = azure.add_raw_fault(kind="skus", **raw)
    with pytest.raises(ProviderError) as caught:
        list_skus(Clients(poll_s=0, retries=0))
    assert type(caught.value) is ProviderError
    assert (caught.value.provider, caught.value.code) == ("azure", code)
    assert caught.value.retryable is retryable
    assert says in one_line(caught.value)
    assert fault.hits == 1


@pytest.mark.parametrize(
    ("raw", "attempts"),
    [({"status": 502, "body": BAD_GATEWAY}, 3), ({"drop": True}, 3), ({"status": 403}, 1)],
    ids=["502", "closed", "403"],
)
def test_retries_stay_with_azure_core(azure: StandIn, raw: dict[str, Any], attempts: int) -> None:
    """azure-core's RetryPolicy (2 retries here) retries a 5xx and a closed connection, not a
    4xx; what is left is mapped once."""
    fault = azure.add_raw_fault(kind="skus", **raw)
    with pytest.raises(ProviderError) as caught:
        list_skus(Clients(poll_s=0, retries=2))
    assert fault.hits == attempts
    one_line(caught.value)


def test_the_provider_maps_a_proxy_page_at_its_boundary(azure: StandIn, tmp_path: Path) -> None:
    azure.add_raw_fault(kind="skus", status=502, body=BAD_GATEWAY)
    options = {"clients": Clients(poll_s=0, retries=0), "owner": "tester"}
    provider = AzureProvider(ProviderContext(home=tmp_path / "home", options=options))
    spec = ClusterSpec(
        "exp1", "azure", 1, Resources(accelerator="A100", count=8), ssh_cidr="203.0.113.7/32"
    )
    with pytest.raises(ProviderError) as caught:
        provider.plan(spec)
    assert one_line(caught.value).startswith("azure: HTTP502: GET https://127.0.0.1:")
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("exc", "code", "retryable", "says"),
    [
        (
            zx.ServiceRequestTimeoutError("Connection timed out\nafter 300 s"),
            "Timeout",
            True,
            "azure: Timeout: Connection timed out after 300 s in eastus (endpoint "
            "https://arm.example); the endpoint did not answer in time",
        ),
        (
            zx.ServiceResponseError("Connection aborted."),
            "ConnectionError",
            True,
            "azure: ConnectionError: Connection aborted in eastus (endpoint https://arm.example)",
        ),
        (
            zx.ServiceRequestError("[Errno 111] Connection refused"),
            "ConnectionError",
            True,
            "azure: ConnectionError: [Errno 111] Connection refused in eastus (endpoint "
            "https://arm.example)",
        ),
        (
            zx.SerializationError("cannot\nserialize"),
            "SerializationError",
            False,
            "azure: SerializationError: the answer in eastus is JSON of a shape this SDK does "
            "not read (cannot serialize)",
        ),
        (
            zx.AzureError("something\nelse"),
            "AzureError",
            False,
            "azure: AzureError: something else in eastus",
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)
def test_azure_cores_other_exceptions_are_one_line(
    exc: Exception, code: str, retryable: bool, says: str
) -> None:
    mapped = map_azure_error(exc, "eastus", "https://arm.example")
    assert type(mapped) is ProviderError
    assert (mapped.code, mapped.retryable) == (code, retryable)
    assert one_line(mapped).startswith(says)


def test_azure_errors_maps_every_azure_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with an endpoint that would not be accepted for a client: the message is no place
    to fail again."""
    monkeypatch.setenv("CLOUDTRAIN_AZURE_ENDPOINT", "http://127.0.0.1:9")
    for exc in (zx.ServiceResponseError("closed"), zx.AzureError("x"), zx.HttpResponseError("y")):
        with pytest.raises(ProviderError) as caught, azure_errors("eastus"):
            raise exc
        one_line(caught.value)


def test_a_credential_that_got_no_token_is_one_auth_line() -> None:
    exc = zx.ClientAuthenticationError(
        "DefaultAzureCredential failed to retrieve a token.\nAttempted credentials:\n\tEnv..."
    )
    with pytest.raises(AuthError) as caught, azure_errors("eastus"):
        raise exc
    assert caught.value.code == "NoCredentials"
    assert "a token. Attempted credentials: Env. Check the" in one_line(caught.value)


def test_azure_errors_lets_other_exceptions_through() -> None:
    with pytest.raises(KeyError), azure_errors("eastus"):
        raise KeyError("a bug of cloudtrain's is not an SDK error")


@pytest.mark.integration
def test_the_cli_prints_one_line_for_a_proxy_page(azure: StandIn, tmp_path: Path) -> None:
    """One line: no SDK warning (azure-mgmt logs its failed read of the page's error body with a
    traceback) reaches stderr unless -v."""
    fault = azure.add_raw_fault(kind="resourceGroups", status=502, body=BAD_GATEWAY)
    done = Shell(tmp_path / "home")("down", "exp1", "--provider", "azure")
    assert done.returncode == 3, done.stdout + done.stderr
    assert fault.hits
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: azure: HTTP502: GET https://127.0.0.1:")
    assert "Traceback" not in done.stderr
