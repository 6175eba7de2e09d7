"""google-cloud-compute's errors mapped to cloudtrain's, at the provider boundary.

GCE reports a failure in two places: the HTTP error of the call itself (``errors[].reason``,
e.g. ``quotaExceeded``), or — for capacity, and often for quota — the ``error`` field of the
**finished operation** (``errors[].code``, e.g. ``ZONE_RESOURCE_POOL_EXHAUSTED``), while the
insert call itself succeeded. Both are normalised to the operation's UPPER_SNAKE code and
mapped by it, never by message text (the quota's name is the one fact read from the text when
no ``quotaInfo`` detail carries it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import AuthError, CapacityError, ProviderError, QuotaError

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
    message = message.strip().rstrip(".")
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


def no_credentials(exc: Exception) -> AuthError:
    return AuthError(
        "gcp",
        "NoCredentials",
        f"{exc}. Run `gcloud auth application-default login` or set "
        "GOOGLE_APPLICATION_CREDENTIALS to a credentials file",
    )
