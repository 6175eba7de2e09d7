"""google-cloud-compute's errors mapped to cloudtrain's, at the provider boundary.

GCE reports a failure in two places: the HTTP error of the call itself (``errors[].reason``,
e.g. ``quotaExceeded``), or — for capacity, and often for quota — the ``error`` field of the
**finished operation** (``errors[].code``, e.g. ``ZONE_RESOURCE_POOL_EXHAUSTED``), while the
insert call itself succeeded. Both are normalised to the operation's UPPER_SNAKE code and
mapped by it, never by message text (the quota's name is the one fact read from the text when
no ``quotaInfo`` detail carries it).

Everything else the SDK stack raises is mapped too (`map_sdk_error`; every message one line):

    GoogleAPICallError          by its code (above); an answer that was no Google API error (a
                                proxy's HTML page) is ``HTTP_<status>``, retryable when 5xx
    RetryError                  the last error retried, retryable (the SDK gave up on it)
    DefaultCredentialsError,    AuthError ``NoCredentials``
    RefreshError, other
    GoogleAuthError
    google-auth TransportError, ProviderError ``EndpointConnectionError`` / ``Timeout`` /
    requests' ConnectionError,  ``IncompleteResponse``, retryable; SSLError is not retryable
    Timeout, ChunkedEncoding…
    protobuf ParseError,        ProviderError ``ResponseParserError``, retryable: an answer that
    JSONDecodeError             is not the JSON the API sends (garbled, cut short)
    any other GoogleAPIError,   ProviderError named by the class, not retryable
    RequestException
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterable, Mapping
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
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud.compute_v1 import Operation

#: "Not here, not now": the next zone may have it.
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "UNSUPPORTED_OPERATION",
    }
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED"})
#: Reasons of a 403 that mean "these credentials may not": anything else of a 403 (quota,
#: rate limits) is not an auth problem.
AUTH_REASONS = frozenset(
    {
        "FORBIDDEN",
        "ACCESS_NOT_CONFIGURED",
        "INSUFFICIENT_PERMISSIONS",
        "SERVICE_DISABLED",
        "IAM_PERMISSION_DENIED",
        "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
        "AUTH_ERROR",
        "UNAUTHORIZED",
    }
)
QUOTA_CONSOLE = "https://console.cloud.google.com/iam-admin/quotas"
_QUOTA_NAME = re.compile(r"Quota '([A-Za-z0-9_]+)'")
ENDPOINT_HINT = (
    "a proxy or load balancer in the way, or an endpoint that is not Compute Engine "
    "(CLOUDTRAIN_GCP_ENDPOINT)"
)


def normalise(code: str) -> str:
    """``quotaExceeded`` → ``QUOTA_EXCEEDED``; UPPER_SNAKE codes stay as they are."""
    if code != code.upper():
        code = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", code)
    return code.upper()


def quota_name(message: str, names: Iterable[str] = ()) -> str:
    """The quota's metric (e.g. ``GPUS_ALL_REGIONS``) from its ``quotaInfo`` or its message."""
    for name in names:
        if name:
            return name
    found = _QUOTA_NAME.search(message)
    return found.group(1) if found else "the quota named in the message"


def classify(
    code: str, message: str, where: str, status: int, quotas: Iterable[str] = ()
) -> ProviderError:
    """The cloudtrain error for one GCE error `code` (normalised) seen in `where`."""
    message = one_line(message).rstrip(".")
    place = f" (in {where})" if where else ""
    if code in CAPACITY_CODES:
        return CapacityError("gcp", code, f"{message}{place}")
    if code in QUOTA_CODES:
        name = quota_name(message, quotas)
        return QuotaError(
            "gcp",
            code,
            f"{message}{place}. Raise the {name} quota ({QUOTA_CONSOLE}) or ask for "
            "fewer/smaller nodes",
        )
    if status == 401 or (status == 403 and code in AUTH_REASONS):
        return AuthError(
            "gcp",
            code,
            f"{message}{place}. Check the credentials (gcloud auth application-default "
            "login, or GOOGLE_APPLICATION_CREDENTIALS) and that they may use Compute Engine "
            "in this project",
        )
    return ProviderError("gcp", code, f"{message}{place}", retryable=status >= 500)


def map_call_error(exc: GoogleAPICallError, where: str = "") -> ProviderError:
    """The cloudtrain error for an HTTP error of a call (`where`: a zone, region or resource)."""
    status = int(exc.code or 0)
    raw = _not_json(exc)
    if raw is not None:
        return ProviderError(
            "gcp",
            f"HTTP_{status}",
            f"{raw}{f' (in {where})' if where else ''}: not a Google API error; {ENDPOINT_HINT}",
            retryable=status >= 500,
        )
    details: list[Mapping[str, Any]] = [e for e in exc.errors if isinstance(e, Mapping)]
    raw = exc.reason or next((str(e.get("reason", "")) for e in details if e.get("reason")), "")
    code = normalise(raw) if raw else f"HTTP_{status}"
    if status == 403 and code not in QUOTA_CODES and code not in AUTH_REASONS:
        code = code if code.startswith(("RATE_LIMIT", "USER_RATE")) else "FORBIDDEN"
    message = str(exc.message or exc).strip()
    return classify(code, message, where, status)


def map_operation_error(op: Operation, where: str = "") -> ProviderError:
    """The cloudtrain error of a finished operation whose ``error`` is set (the first entry
    decides; the others are kept in the message)."""
    errors = list(op.error.errors)
    first = errors[0]
    quotas = [
        d.quota_info.metric_name or d.quota_info.limit_name
        for d in first.error_details
        if "quota_info" in d
    ]
    message = "; ".join(e.message for e in errors if e.message) or first.code
    status = int(op.http_error_status_code or 0)
    return classify(normalise(first.code or "UNKNOWN"), message, where, status, quotas)


def _not_json(exc: GoogleAPICallError) -> str | None:
    """For an error whose body was no Google API error document (an HTML page of a proxy, or
    nothing): what was asked and answered, in a line; else None."""
    response: Any = exc.response
    if response is None or not hasattr(response, "json"):
        return None
    try:
        response.json()
    except ValueError:
        pass
    else:
        return None
    request = getattr(response, "request", None)
    asked = "a call"
    if request is not None:
        asked = f"{request.method} {str(request.url).split('?')[0]}"
    kind = str(response.headers.get("content-type") or "no content type").split(";")[0]
    seen = body_summary(str(response.text or ""))
    return f"{asked} was answered HTTP {exc.code}, {kind}, {seen}"


def protobuf_json_format() -> Any:
    """``google.protobuf.json_format`` (protobuf ships no type stubs): its ``Error`` is what a
    garbled answer raises in the REST transport."""
    return importlib.import_module("google.protobuf.json_format")


def map_sdk_error(exc: Exception, where: str = "") -> ProviderError:
    """The cloudtrain error for anything google-api-core, google-auth, requests or protobuf
    raised below a call (see the table above); any other exception by its class name."""
    from google.api_core import exceptions as gx
    from google.auth import exceptions as ax
    from requests import exceptions as rx

    place = f" (in {where})" if where else ""
    name, text = type(exc).__name__, one_line(str(exc)).rstrip(".")
    if isinstance(exc, gx.GoogleAPICallError):
        return map_call_error(exc, where)
    if isinstance(exc, gx.RetryError):
        # the SDK retried (reads, on 503/504) until its deadline: the last error, retryable
        cause = exc.cause
        gave_up = f"the SDK gave up retrying ({one_line(str(exc.message), 80).rstrip('.')})"
        if not isinstance(cause, Exception):
            return ProviderError("gcp", "RETRY_ERROR", f"{gave_up}{place}", retryable=True)
        found = map_sdk_error(cause, where)
        if isinstance(found, AuthError | QuotaError | CapacityError):
            return found
        detail = str(found).removeprefix(f"gcp: {found.code}: ")
        return ProviderError("gcp", found.code, f"{detail}; {gave_up}", retryable=True)
    if isinstance(exc, ax.TransportError):
        return ProviderError(
            "gcp",
            "EndpointConnectionError",
            f"{text}{place}; the token endpoint could not be reached",
            retryable=True,
        )
    if isinstance(exc, ax.GoogleAuthError):
        return no_credentials(exc)
    if isinstance(exc, rx.SSLError):
        return ProviderError(
            "gcp",
            name,
            f"{text}{place}; the endpoint's TLS certificate was refused (a proxy that "
            "intercepts TLS needs REQUESTS_CA_BUNDLE)",
        )
    if isinstance(exc, rx.Timeout):
        return ProviderError(
            "gcp", "Timeout", f"{text}{place}; the endpoint did not answer in time", retryable=True
        )
    if isinstance(exc, rx.ConnectionError):
        return ProviderError("gcp", "EndpointConnectionError", f"{text}{place}", retryable=True)
    if isinstance(exc, rx.ChunkedEncodingError | rx.ContentDecodingError):
        return ProviderError(
            "gcp",
            "IncompleteResponse",
            f"the answer{place} was cut short: {text}",
            retryable=True,
        )
    if isinstance(exc, protobuf_json_format().Error | json.JSONDecodeError):
        return ProviderError(
            "gcp",
            "ResponseParserError",
            f"the answer{place} is not the API's JSON, garbled or cut short ({text}); retry "
            f"later, or check for {ENDPOINT_HINT}",
            retryable=True,
        )
    return ProviderError("gcp", name, f"{text}{place}")


def no_credentials(exc: Exception) -> AuthError:
    return AuthError(
        "gcp",
        "NoCredentials",
        f"{one_line(str(exc)).rstrip('.')}. Run `gcloud auth application-default login` or set "
        "GOOGLE_APPLICATION_CREDENTIALS to a credentials file",
    )
