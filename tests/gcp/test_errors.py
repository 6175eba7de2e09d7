"""Every failure under google-cloud-compute is one cloudtrain error of one line: the real client
against the stand-in answering what GCE never sends (a proxy's HTML page, a garbled or cut-short
body, a connection closed unanswered), on a listing, a mutation and an operation poll; and the
rest of google-api-core's, google-auth's and requests' exceptions mapped at the boundary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gx
from google.auth import exceptions as ax

from cloudtrain.errors import AuthError, ProviderError
from cloudtrain.providers.gcp import _resources
from cloudtrain.providers.gcp._client import Clients, gcp_errors
from cloudtrain.providers.gcp._errors import map_sdk_error
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.provision.provider import ProviderContext
from tests.gcp.standin import StandIn
from tests.integration.conftest import Shell
from tests.raw import BAD_GATEWAY, one_line

GARBLED = b'{"items": {"zones/us-central1-a": {"instances": [{"name": "cloudtrain-exp1-0'
JSON = "application/json; charset=UTF-8"
LISTING = "instances.aggregatedList"


@pytest.mark.parametrize(
    ("raw", "code", "retryable", "says"),
    [
        (
            {"status": 502, "body": BAD_GATEWAY},
            "HTTP_502",
            True,
            "aggregated/instances was answered HTTP 502, text/html, a page titled '502 Bad "
            "Gateway' (in instances.aggregatedList): not a Google API error; a proxy",
        ),
        (
            {"status": 403, "body": BAD_GATEWAY.replace(b"502", b"403")},
            "HTTP_403",
            False,
            "HTTP 403, text/html, a page titled '403 Bad Gateway'",
        ),
        (
            {"status": 502, "body": b'{"error": ', "content_type": JSON},
            "HTTP_502",
            True,
            "HTTP 502, application/json, starting '{\"error\":'",
        ),
        (
            {"status": 200, "body": GARBLED, "content_type": JSON},
            "ResponseParserError",
            True,
            "gcp: ResponseParserError: the answer (in instances.aggregatedList) is not the API's "
            "JSON, garbled or cut short (Failed to load JSON: Unterminated string",
        ),
        (
            {"status": 200, "body": GARBLED, "content_type": JSON, "length": 4096},
            "IncompleteResponse",
            True,
            "the answer (in instances.aggregatedList) was cut short: ('Connection broken: "
            "IncompleteRead(",
        ),
        ({"drop": True}, "EndpointConnectionError", True, "Remote end closed connection"),
    ],
    ids=["nginx-502", "nginx-403", "cut-json-502", "garbled", "cut", "closed"],
)
def test_a_listing_answered_with_no_gce_response_is_one_line(
    gcp: StandIn, raw: dict[str, Any], code: str, retryable: bool, says: str
) -> None:
    fault = gcp.add_raw_fault(LISTING, **raw)
    with pytest.raises(ProviderError) as caught:
        _resources.live_instances(Clients(), "cloudtrain-cluster", "exp1")
    assert type(caught.value) is ProviderError
    assert (caught.value.provider, caught.value.code) == ("gcp", code)
    assert caught.value.retryable is retryable
    assert says in one_line(caught.value)
    assert fault.hits == 1  # a 502 is not among the SDK's retried errors (503, 504)


def insert_and_wait(clients: Clients) -> None:
    """One firewall rule inserted through `Clients.mutate`, its operation through `wait`."""
    from google.cloud import compute_v1

    rule = compute_v1.Firewall(
        name="cloudtrain-exp1-ssh",
        network="global/networks/default",
        source_ranges=["203.0.113.7/32"],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
    )
    where = "firewall cloudtrain-exp1-ssh"
    insert = clients.firewalls().insert_unary
    op = clients.mutate(
        "firewalls.insert", insert, where, project=clients.project, firewall_resource=rule
    )
    clients.wait(op, where, timeout_s=10)


@pytest.mark.parametrize(
    ("call", "raw", "code"),
    [
        ("firewalls.insert", {"status": 502, "body": BAD_GATEWAY}, "HTTP_502"),
        ("firewalls.insert", {"drop": True}, "EndpointConnectionError"),
        (
            "globalOperations.wait",
            {"status": 200, "body": b"{", "content_type": JSON},
            "ResponseParserError",
        ),
        ("globalOperations.wait", {"status": 502, "body": BAD_GATEWAY}, "HTTP_502"),
    ],
)
def test_a_mutation_and_its_operation_poll_are_wrapped(
    gcp: StandIn, call: str, raw: dict[str, Any], code: str
) -> None:
    gcp.add_raw_fault(call, **raw)
    with pytest.raises(ProviderError) as caught:
        insert_and_wait(Clients())
    assert gcp.calls("firewalls.insert")
    assert caught.value.code == code
    assert caught.value.retryable
    assert "(in firewall cloudtrain-exp1-ssh)" in one_line(caught.value)


def test_the_provider_maps_a_proxy_page_at_its_boundary(gcp: StandIn, tmp_path: Path) -> None:
    gcp.add_raw_fault(LISTING, status=502, body=BAD_GATEWAY)
    provider = GcpProvider(ProviderContext(home=tmp_path / "home", options={"poll_s": 0.01}))
    with pytest.raises(ProviderError) as caught:
        provider.describe("exp1")
    assert one_line(caught.value).startswith("gcp: HTTP_502: GET http://127.0.0.1:")
    assert caught.value.retryable


def new(kind: type[Exception], *args: object) -> Exception:
    """An SDK exception (google-api-core's and google-auth's constructors are untyped)."""
    return kind(*args)


@pytest.mark.parametrize(
    ("exc", "kind", "code", "retryable", "says"),
    [
        (
            new(
                gx.RetryError,
                "Timeout of 600.0s exceeded",
                new(gx.ServiceUnavailable, "backend\ndown"),
            ),
            ProviderError,
            "HTTP_503",
            True,
            "backend down (in us-central1-a); the SDK gave up retrying (Timeout of 600.0s",
        ),
        (
            new(gx.RetryError, "Timeout of 600.0s exceeded", None),
            ProviderError,
            "RETRY_ERROR",
            True,
            "the SDK gave up retrying",
        ),
        (
            new(ax.RefreshError, "invalid_grant: Bad Request", {"error": "invalid_grant"}),
            AuthError,
            "NoCredentials",
            False,
            "gcloud auth application-default login",
        ),
        (
            new(ax.DefaultCredentialsError, "Your default credentials were not found.\nTo set up"),
            AuthError,
            "NoCredentials",
            False,
            "were not found. To set up",
        ),
        (
            new(ax.TransportError, "Failed to retrieve token\nconnection refused"),
            ProviderError,
            "EndpointConnectionError",
            True,
            "the token endpoint could not be reached",
        ),
        (
            requests.exceptions.ReadTimeout("Read timed out. (read timeout=60)"),
            ProviderError,
            "Timeout",
            True,
            "did not answer in time",
        ),
        (
            requests.exceptions.SSLError("certificate verify failed"),
            ProviderError,
            "SSLError",
            False,
            "REQUESTS_CA_BUNDLE",
        ),
        (
            requests.exceptions.InvalidURL("Invalid URL 'http://'"),
            ProviderError,
            "InvalidURL",
            False,
            "Invalid URL",
        ),
        (
            gx.DuplicateCredentialArgs("credentials and\ncredentials_file"),
            ProviderError,
            "DuplicateCredentialArgs",
            False,
            "credentials and credentials_file",
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)
def test_the_sdk_stacks_other_exceptions_are_one_line(
    exc: Exception, kind: type[ProviderError], code: str, retryable: bool, says: str
) -> None:
    mapped = map_sdk_error(exc, "us-central1-a")
    assert type(mapped) is kind
    assert (mapped.code, mapped.retryable) == (code, retryable)
    assert says in one_line(mapped)


def test_gcp_errors_lets_other_exceptions_through() -> None:
    with pytest.raises(KeyError), gcp_errors("us-central1-a"):
        raise KeyError("a bug of cloudtrain's is not an SDK error")


@pytest.mark.integration
def test_the_cli_prints_one_line_for_a_proxy_page(gcp: StandIn, tmp_path: Path) -> None:
    gcp.add_raw_fault(LISTING, status=502, body=BAD_GATEWAY)
    done = Shell(tmp_path / "home")("down", "exp1", "--provider", "gcp")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: gcp: HTTP_502: GET http://127.0.0.1:")
    assert "Traceback" not in done.stderr
