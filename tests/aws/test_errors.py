"""Every botocore failure is one cloudtrain error of one line: real boto3 against the stand-in
answering what AWS never sends (a proxy's HTML page, a garbled or cut-short body, a connection
closed unanswered), and botocore's other exceptions mapped at the boundary."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore import exceptions as bx
from botocore.parsers import ResponseParserError

from cloudtrain.errors import AuthError, ProviderError
from cloudtrain.providers.aws._client import Clients, aws_errors
from cloudtrain.providers.aws._errors import map_botocore_error, not_an_aws_response
from cloudtrain.providers.aws.provider import AwsProvider
from cloudtrain.provision.provider import ProviderContext
from tests.aws.standin import Raw, StandIn
from tests.integration.conftest import Shell
from tests.raw import BAD_GATEWAY, one_line

#: a page that happens to be well-formed XML: botocore reads it as an error with no code
XHTML_BAD_GATEWAY = b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head></html>"
#: werkzeug's page, as moto's server answers an action it lacks (placement groups)
MOTO_500 = (
    b"<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
    b"<h1>Internal Server Error</h1>\n<p>The server encountered an internal error and was "
    b"unable to complete your request.</p>\n"
)
#: what a load balancer answers with no backend (botocore's "generic" error page)
UNAVAILABLE = b"<html><body><b>Http/1.1 Service Unavailable</b></body></html>"
GARBLED = b"<DescribeInstancesResponse xmlns='http://ec2.amazonaws.com/doc/2016-11-15/'><reserv"


@pytest.mark.parametrize(
    ("raw", "code", "retryable", "says"),
    [
        (
            Raw(502, BAD_GATEWAY),
            "ResponseParserError",
            True,
            "aws: ResponseParserError: the EC2 endpoint answered DescribeInstances in us-east-1 "
            "with something that is not an AWS response (HTTP 502, text/html, a page titled "
            "'502 Bad Gateway'; the parser: mismatched tag",
        ),
        (
            Raw(502, XHTML_BAD_GATEWAY),
            "HTTP502",
            True,
            "aws: HTTP502: DescribeInstances in us-east-1 was answered HTTP 502, text/html, a "
            "page titled '502 Bad Gateway': not an AWS error;",
        ),
        (Raw(503, UNAVAILABLE), "HTTP503", True, "HTTP 503, text/html, starting '<html><body>"),
        (Raw(403, BAD_GATEWAY.replace(b"502", b"403")), "ResponseParserError", False, "HTTP 403"),
        (Raw(500, MOTO_500), "ResponseParserError", True, "'500 Internal Server Error'"),
        (
            Raw(200, GARBLED, "text/xml"),
            "ResponseParserError",
            True,
            '(HTTP 200, text/xml, starting "<DescribeInstancesResponse',
        ),
        (
            Raw(200, GARBLED, "text/xml", length=4096),  # cut short: botocore does not check
            "ResponseParserError",
            True,
            "the parser: unclosed token",
        ),
        (Raw(drop=True), "ConnectionClosedError", True, "Connection was closed before we"),
    ],
    ids=["nginx-502", "xhtml-502", "lb-503", "nginx-403", "moto-500", "garbled", "cut", "closed"],
)
def test_an_answer_that_is_no_aws_response_is_one_line(
    aws: StandIn, raw: Raw, code: str, retryable: bool, says: str
) -> None:
    fault = aws.app.add_raw_fault("DescribeInstances", raw)
    with pytest.raises(ProviderError) as caught, aws_errors("us-east-1"):
        Clients().ec2("us-east-1").describe_instances()
    assert type(caught.value) is ProviderError
    assert (caught.value.provider, caught.value.code) == ("aws", code)
    assert caught.value.retryable is retryable
    assert says in one_line(caught.value)
    assert fault.hits == 1


def test_the_provider_maps_a_proxy_page_at_its_boundary(aws: StandIn, tmp_path: Path) -> None:
    aws.app.add_raw_fault("DescribeInstances", Raw(502, BAD_GATEWAY), region="us-west-2")
    options = {"regions": ("us-east-1", "us-west-2"), "poll_s": 0.01}
    provider = AwsProvider(ProviderContext(home=tmp_path / "home", options=options))
    with pytest.raises(ProviderError) as caught:
        provider.describe("exp1")
    text = one_line(caught.value)
    assert text.startswith(
        "aws: ResponseParserError: the EC2 endpoint answered DescribeInstances in us-west-2 "
    )
    assert caught.value.retryable


@pytest.mark.parametrize(("page", "attempts"), [(XHTML_BAD_GATEWAY, 2), (BAD_GATEWAY, 1)])
def test_retries_stay_with_botocore(
    aws: StandIn, monkeypatch: pytest.MonkeyPatch, page: bytes, attempts: int
) -> None:
    """Standard mode (2 attempts in all here) retries a 502 it could parse; a page it cannot
    parse (``ResponseParserError``) it does not retry, and neither does cloudtrain: either is
    mapped once, retryable, for the caller to decide."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    fault = aws.app.add_raw_fault("DescribeInstances", Raw(502, page))
    with pytest.raises(ProviderError) as caught, aws_errors():
        Clients().ec2("us-east-1").describe_instances()
    assert fault.hits == attempts
    assert caught.value.retryable
    assert "HTTP 502, text/html, a page titled '502 Bad Gateway'" in one_line(caught.value)


def test_a_refused_connection_is_one_line(aws: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(ProviderError) as caught, aws_errors("us-east-1"):
        Clients().ec2("us-east-1").describe_instances()
    assert caught.value.code == "EndpointConnectionError"
    assert caught.value.retryable
    assert one_line(caught.value) == (
        "aws: EndpointConnectionError: Could not connect to the endpoint URL: "
        '"http://127.0.0.1:9/" in us-east-1'
    )


@pytest.mark.parametrize(
    ("exc", "kind", "code", "retryable"),
    [
        (bx.ReadTimeoutError(endpoint_url="https://ec2"), ProviderError, "ReadTimeoutError", True),
        (
            bx.ConnectTimeoutError(endpoint_url="https://ec2"),
            ProviderError,
            "ConnectTimeoutError",
            True,
        ),
        (
            bx.ConnectionClosedError(endpoint_url="https://ec2"),
            ProviderError,
            "ConnectionClosedError",
            True,
        ),
        (
            bx.SSLError(endpoint_url="https://ec2", error="bad cert"),
            ProviderError,
            "SSLError",
            False,
        ),
        (bx.NoCredentialsError(), AuthError, "NoCredentials", False),
        (
            bx.CredentialRetrievalError(provider="sso", error_msg="token\nexpired"),
            AuthError,
            "CredentialRetrievalError",
            False,
        ),
        (bx.NoRegionError(), ProviderError, "NoRegionError", False),
        (
            bx.WaiterError(
                name="InstanceRunning", reason="Max attempts\nexceeded", last_response={}
            ),
            ProviderError,
            "WaiterError",
            False,
        ),
    ],
)
def test_botocores_other_exceptions_are_one_line(
    exc: bx.BotoCoreError, kind: type[ProviderError], code: str, retryable: bool
) -> None:
    mapped = map_botocore_error(exc, "us-east-1")
    assert type(mapped) is kind
    assert (mapped.code, mapped.retryable) == (code, retryable)
    assert " in us-east-1" in one_line(mapped) or code == "NoCredentials"


def test_a_parser_error_without_a_recorded_answer_is_one_line() -> None:
    exc = ResponseParserError("Unable to parse response (syntax error), invalid XML:\nb'<html>'")
    mapped = not_an_aws_response(exc, "eu-west-1")
    assert mapped.code == "ResponseParserError"
    assert mapped.retryable
    assert "in eu-west-1 with something that is not an AWS response" in one_line(mapped)


@pytest.mark.integration
def test_the_cli_prints_one_line_for_a_proxy_page(aws: StandIn, tmp_path: Path) -> None:
    aws.app.add_raw_fault("DescribeInstances", Raw(502, BAD_GATEWAY))
    done = Shell(tmp_path / "home")("down", "exp1", "--provider", "aws")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: aws: ResponseParserError: the EC2 endpoint answered ")
    assert "Traceback" not in done.stderr
