"""azure-core's errors mapped to cloudtrain's, at the provider boundary.

The exception class misleads (``SkuNotAvailable`` and the cores-quota ``OperationNotAllowed`` are
409s raised as ``ResourceExistsError``; ``AllocationFailed`` arrives in the finished operation as
an ``HttpResponseError`` with status 200), so the mapping branches on ``error.code`` only, and on
the HTTP status for 401/403.

What azure-core raises, and what it becomes (every message one line):

    HttpResponseError           by ``error.code`` (above); an answer that was no ARM error (a
                                proxy's HTML page) is ``HTTP<status>``, retryable when 5xx
    ClientAuthenticationError   AuthError (``NoCredentials`` when no token could be had)
    DecodeError,                ProviderError named by the class, retryable: a body that is not
    IncompleteReadError         JSON, or was cut short
    DeserializationError        ProviderError, not retryable: JSON of the wrong shape
    ServiceRequestError,        ProviderError ``ConnectionError`` (``Timeout`` for the timeout
    ServiceResponseError        subclasses), retryable
    any other AzureError        ProviderError named by the class, not retryable

Retries of 5xx, 429 and connection errors are azure-core's (its RetryPolicy): what reaches here
is what is left after them.
"""

from __future__ import annotations

import re
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
    from azure.core.exceptions import DecodeError, HttpResponseError

#: "Not here, not now": the next zone or region may have it.
CAPACITY_CODES = frozenset(
    {
        "AllocationFailed",
        "ZonalAllocationFailed",
        "SkuNotAvailable",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
    }
)
QUOTA_CODES = frozenset({"QuotaExceeded", "SpotQuotaExceeded", "LowPriorityQuotaExceeded"})
AUTH_CODES = frozenset(
    {
        "AuthenticationFailed",
        "AuthorizationFailed",
        "InvalidAuthenticationToken",
        "InvalidAuthenticationTokenTenant",
        "ExpiredAuthenticationToken",
        "LinkedAuthorizationFailed",
        "SubscriptionNotFound",
    }
)
ENDPOINT_HINT = (
    "a proxy or load balancer in the way, or an endpoint that is not ARM "
    "(CLOUDTRAIN_AZURE_ENDPOINT)"
)
QUOTA_PORTAL = (
    "Request more in the Azure portal (Subscriptions > Usage + quotas, provider Compute, "
    "the region) or check with `az vm list-usage --location REGION`, or ask for fewer/smaller nodes"
)


def answered(exc: HttpResponseError) -> str:
    """``GET https://…/skus was answered HTTP 502, text/html, a page titled '…'``."""
    response: Any = exc.response  # a transport's response: requests', aiohttp's …
    if response is None:
        return f"the answer was HTTP {exc.status_code}"
    request = getattr(response, "request", None)
    asked = "the call"
    if request is not None:
        asked = f"{request.method} {str(request.url).split('?')[0]}"
    try:
        body = response.text()
    except Exception:  # the body could not be read: nothing more to say about it
        body = ""
    headers = getattr(response, "headers", None) or {}
    kind = str(headers.get("content-type") or "no content type").split(";")[0]
    return f"{asked} was answered HTTP {response.status_code}, {kind}, {body_summary(body)}"


def code_of(exc: HttpResponseError) -> str:
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    return str(code) if code else f"HTTP{exc.status_code or ''}"


def message_of(exc: HttpResponseError) -> str:
    error = getattr(exc, "error", None)
    message = getattr(error, "message", None)
    return one_line(str(message or exc.message or exc))


def quota_name(message: str) -> str:
    """The quota an ARM message names ("… exceeding approved standardNDASv4_A100Family Cores
    quota …" → ``standardNDASv4_A100Family Cores``), or a description when it names none."""
    found = re.search(r"approved (.+?) quota", message, re.IGNORECASE)
    return found.group(1) if found else "the regional vCPU quota of this VM family"


def is_quota(code: str, message: str) -> bool:
    return code in QUOTA_CODES or (code == "OperationNotAllowed" and "quota" in message.lower())


def map_http_error(exc: HttpResponseError, where: str = "") -> ProviderError:
    """The cloudtrain error for an azure-core `HttpResponseError` (`where`: a zone or region)."""
    code, message = code_of(exc), message_of(exc)
    place = f" in {where}" if where else ""
    if getattr(exc, "error", None) is None and exc.response is not None:
        # no ARM error document: a proxy's or load balancer's page, or an empty body
        status = exc.status_code or 0
        return ProviderError(
            "azure",
            f"HTTP{status}",
            f"{answered(exc)}{f' ({where})' if where else ''}: not an ARM error; {ENDPOINT_HINT}",
            retryable=status >= 500,
        )
    if code in CAPACITY_CODES:
        return CapacityError("azure", code, f"{message}{place}")
    if is_quota(code, message):
        return QuotaError(
            "azure", code, f"{message}{place}. The quota: {quota_name(message)}. {QUOTA_PORTAL}"
        )
    if code in AUTH_CODES or exc.status_code in (401, 403):
        return AuthError("azure", code, f"{message}{place}. {CREDENTIALS_HINT}")
    status = exc.status_code or 0
    return ProviderError("azure", code, f"{message}{place}", retryable=status >= 500)


CREDENTIALS_HINT = (
    "Check the credentials (`az login`, or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET) "
    "and that they may manage compute and network resources in the subscription "
    "(--subscription or AZURE_SUBSCRIPTION_ID)"
)


def map_decode_error(exc: DecodeError | ValueError, where: str = "") -> ProviderError:
    """A body azure-core could not decode: not JSON (garbled, or a page of 200 its pagers read
    with `json.loads`, which raises the bare ``JSONDecodeError``), or cut short (the connection
    closed early: ``IncompleteReadError``). Retryable: the next answer may be whole."""
    place = f" in {where}" if where else ""
    detail = one_line(str(getattr(exc, "message", None) or exc), 160).rstrip(".")
    name = type(exc).__name__
    what = "was cut short" if name == "IncompleteReadError" else "is not JSON"
    return ProviderError(
        "azure",
        "DecodeError" if name == "JSONDecodeError" else name,
        f"the answer{place} {what} ({detail}); retry later, or check for {ENDPOINT_HINT}",
        retryable=True,
    )


def map_azure_error(exc: Exception, where: str = "", endpoint: str = "") -> ProviderError:
    """Anything else of azure-core: connections, timeouts, bodies of the wrong shape, and a
    catch-all named by the exception's class (`endpoint`: the ARM URL, for the message)."""
    from azure.core import exceptions as zx

    place = f" in {where}" if where else ""
    at = f" (endpoint {endpoint})" if endpoint else ""
    cause = exc.__cause__
    text = one_line(str(exc) or (f"{type(cause).__name__}: {cause}" if cause else "")).rstrip(".")
    if isinstance(exc, zx.ServiceRequestTimeoutError | zx.ServiceResponseTimeoutError):
        return ProviderError(
            "azure",
            "Timeout",
            f"{text}{place}{at}; the endpoint did not answer in time",
            retryable=True,
        )
    if isinstance(exc, zx.ServiceRequestError | zx.ServiceResponseError):
        return ProviderError("azure", "ConnectionError", f"{text}{place}{at}", retryable=True)
    if isinstance(exc, zx.DeserializationError | zx.SerializationError):
        return ProviderError(
            "azure",
            type(exc).__name__,
            f"the answer{place} is JSON of a shape this SDK does not read ({text}); an API "
            f"version this SDK does not know, or {ENDPOINT_HINT}",
        )
    return ProviderError("azure", type(exc).__name__, f"{text}{place}")


def no_credentials(exc: Exception) -> AuthError:
    """A credential that could not get a token at all (nothing configured, or refused)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = " ".join(ln for ln in lines if not ln.startswith("To mitigate")).rstrip(".")
    return AuthError("azure", "NoCredentials", f"{text or type(exc).__name__}. {CREDENTIALS_HINT}")
