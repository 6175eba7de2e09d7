"""botocore's errors mapped to cloudtrain's, at the provider boundary.

Capacity errors are worth another zone or region; quota and auth errors stop at once with a
message that says what to do. Branch on the error code, never on the message.

What botocore raises, and what it becomes (every message one line):

    ClientError                 by its code: CapacityError, QuotaError, AuthError, ProviderError
                                (retryable when HTTP 5xx); an answer that was no AWS error
                                document (a proxy's HTML page) is ``HTTP<status>``
    ResponseParserError         ProviderError ``ResponseParserError``, retryable unless 4xx: a
                                body that is not an AWS response (an HTML 502/500 page that is
                                not well-formed XML, moto's page for what it lacks, a body cut
                                short: botocore does not check the length)
    NoCredentialsError …        AuthError (credentials missing, or their provider failed)
    ConnectionError,            ProviderError named by the class, retryable (connection refused,
    HTTPClientError …           closed, timed out); SSLError is not retryable
    any other BotoCoreError     ProviderError named by the class, not retryable

Retries of throttling, 5xx and connection errors are botocore's (standard mode, `Clients.get`):
what reaches here is what is left after them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import (
    AuthError,
    CapacityError,
    ProviderError,
    QuotaError,
    body_summary,
    one_line,
)

if TYPE_CHECKING:
    from botocore.exceptions import BotoCoreError, ClientError

#: Codes that mean "not here, not now": the next zone or region may have it.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "Unsupported",
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",
    }
)

#: Codes of account limits, with the quota to raise (Service Quotas console, "EC2").
QUOTA_CODES = {
    "VcpuLimitExceeded": "the vCPU quota for this instance family ('Running On-Demand P "
    "instances', L-417A185B, counts vCPUs)",
    "MaxSpotInstanceCountExceeded": "the spot quota ('All P Spot Instance Requests', "
    "L-7212CCBC, counts vCPUs)",
    "InstanceLimitExceeded": "the instance count quota of this region",
    "AddressLimitExceeded": "the Elastic IP quota of this region",
    "RulesPerSecurityGroupLimitExceeded": "the rules-per-security-group quota",
    "SecurityGroupLimitExceeded": "the security-groups-per-VPC quota",
    "PlacementGroupLimitExceeded": "the placement-group quota of this region",
}

AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "ExpiredToken",
        "RequestExpired",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "AccessDeniedException",
        "OptInRequired",
        "UnrecognizedClientException",
    }
)


def code_of(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


#: botocore's exceptions (by name: some are newer than the oldest botocore supported) that mean
#: a credential provider failed: an SSO token expired, a role could not be assumed …
CREDENTIAL_ERRORS = (
    "NoAuthTokenError",
    "TokenRetrievalError",
    "CredentialRetrievalError",
    "UnknownCredentialError",
    "RefreshWithMFAUnsupportedError",
    "SSOError",
    "LoginError",
)
#: … and that the next try may not meet: a connection refused, closed or cut short, botocore's
#: own retry quota spent
TRANSIENT_ERRORS = (
    "ConnectionError",
    "HTTPClientError",
    "IncompleteReadError",
    "CapacityNotAvailableError",
)
CREDENTIALS_HINT = "Check the credentials (aws sts get-caller-identity) and that they may call EC2"
_PARSE_REASON = re.compile(r"^Unable to parse response \((.*?)\)")


def answered(last: Mapping[str, Any] | None) -> str:
    """``HTTP 502, text/html, a page titled '502 Bad Gateway'`` from the answer botocore was
    given (`Clients` records it before parsing), or ``""`` when none was recorded."""
    if not last:
        return ""
    kind = str(last.get("content_type") or "no content type").split(";")[0]
    return f"HTTP {last.get('status')}, {kind}, {body_summary(last.get('body') or b'')}"


def map_client_error(
    exc: ClientError, where: str = "", last: Mapping[str, Any] | None = None
) -> ProviderError:
    """The cloudtrain error for a botocore `ClientError` (`where`: a zone or region; `last`: the
    answer as recorded by `Clients`, for an error that was not an AWS error document)."""
    code = code_of(exc)
    message = one_line(str(exc.response.get("Error", {}).get("Message", "")) or str(exc))
    place = f" in {where}" if where else ""
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in ("Unknown", str(status)) and status:
        # botocore found no error code: the body was an HTML page or nothing (a proxy, a load
        # balancer, an endpoint that is not AWS), not an AWS error document
        seen = answered(last) or f"HTTP {status}"
        return ProviderError(
            "aws",
            f"HTTP{status}",
            f"{exc.operation_name}{place} was answered {seen}: not an AWS error; a proxy or "
            "load balancer in the way, or an endpoint that is not AWS (AWS_ENDPOINT_URL)",
            retryable=status >= 500,
        )
    if code in CAPACITY_CODES:
        return CapacityError("aws", code, f"{message}{place}")
    if code in QUOTA_CODES:
        return QuotaError(
            "aws",
            code,
            f"{message}{place}. Raise {QUOTA_CODES[code]} in the Service Quotas console "
            "(https://console.aws.amazon.com/servicequotas/) or ask for fewer/smaller nodes",
        )
    if code in AUTH_CODES:
        return AuthError("aws", code, f"{message}{place}. {CREDENTIALS_HINT}")
    return ProviderError("aws", code, f"{message}{place}", retryable=status >= 500)


def not_an_aws_response(
    exc: Exception, where: str = "", last: Mapping[str, Any] | None = None
) -> ProviderError:
    """botocore's ``ResponseParserError``: an answer it could not parse (an HTML 502/500 page
    of a proxy, moto's page for an action it lacks, a body cut short). Retryable unless its
    status was a 4xx: the next answer may be a real one."""
    place = f" in {where}" if where else ""
    status = int((last or {}).get("status") or 0)
    reason = _PARSE_REASON.search(str(exc))
    why = f"; the parser: {one_line(reason.group(1), 120)}" if reason else ""
    if last:
        call = f"the {last.get('service') or 'AWS'} endpoint answered {last.get('operation')}"
        seen = f" ({answered(last)}{why})"
    else:
        call, seen = "the AWS endpoint answered", f" ({one_line(str(exc), 160)})"
    return ProviderError(
        "aws",
        "ResponseParserError",
        f"{call}{place} with something that is not an AWS response{seen}; retry later, or "
        "check the endpoint (AWS_ENDPOINT_URL) and any proxy (HTTPS_PROXY) in the way",
        retryable=not 400 <= status < 500,
    )


def map_botocore_error(exc: BotoCoreError, where: str = "") -> ProviderError:
    """The cloudtrain error for any other botocore exception: credentials, connections,
    timeouts, and a catch-all named by the exception's class."""
    from botocore import exceptions as bx

    name, text = type(exc).__name__, one_line(str(exc)).rstrip(".")
    place = f" in {where}" if where else ""
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return no_credentials(exc)
    if isinstance(exc, _classes(*CREDENTIAL_ERRORS)):
        return AuthError("aws", name, f"{text}{place}. {CREDENTIALS_HINT}")
    if isinstance(exc, bx.SSLError):
        return ProviderError(
            "aws",
            name,
            f"{text}{place}; the endpoint's TLS certificate was refused (a proxy that "
            "intercepts TLS needs AWS_CA_BUNDLE)",
        )
    if isinstance(exc, bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return ProviderError(
            "aws", name, f"{text}{place}; the endpoint did not answer in time", retryable=True
        )
    if isinstance(exc, _classes(*TRANSIENT_ERRORS)):
        return ProviderError("aws", name, f"{text}{place}", retryable=True)
    return ProviderError("aws", name, f"{text}{place}")


def _classes(*names: str) -> tuple[type[Exception], ...]:
    """botocore's exception classes of these names that this botocore has."""
    from botocore import exceptions as bx

    found = (getattr(bx, n, None) for n in names)
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, Exception))


def no_credentials(exc: Exception) -> AuthError:
    return AuthError(
        "aws",
        "NoCredentials",
        f"{one_line(str(exc))}. Configure credentials (aws configure, AWS_PROFILE, or --profile)",
    )
