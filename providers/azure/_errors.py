"""azure-core's errors mapped to cloudtrain's, at the provider boundary.

The exception class misleads (``SkuNotAvailable`` and the cores-quota ``OperationNotAllowed`` are
409s raised as ``ResourceExistsError``; ``AllocationFailed`` arrives in the finished operation as
an ``HttpResponseError`` with status 200), so the mapping branches on ``error.code`` only, and on
the HTTP status for 401/403.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from cloudtrain.errors import AuthError, CapacityError, ProviderError, QuotaError

if TYPE_CHECKING:
    from azure.core.exceptions import HttpResponseError

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
QUOTA_PORTAL = (
    "Request more in the Azure portal (Subscriptions > Usage + quotas, provider Compute, "
    "the region) or check with `az vm list-usage --location REGION`, or ask for fewer/smaller nodes"
)


def code_of(exc: HttpResponseError) -> str:
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    return str(code) if code else f"HTTP{exc.status_code or ''}"


def message_of(exc: HttpResponseError) -> str:
    error = getattr(exc, "error", None)
    message = getattr(error, "message", None)
    return str(message or exc.message or exc).strip()


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


def no_credentials(exc: Exception) -> AuthError:
    """A credential that could not get a token at all (nothing configured, or refused)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = " ".join(ln for ln in lines if not ln.startswith("To mitigate")).rstrip(".")
    return AuthError("azure", "NoCredentials", f"{text or type(exc).__name__}. {CREDENTIALS_HINT}")
