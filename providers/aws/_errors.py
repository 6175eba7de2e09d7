"""botocore's errors mapped to cloudtrain's, at the provider boundary.

Capacity errors are worth another zone or region; quota and auth errors stop at once with a
message that says what to do. Branch on the error code, never on the message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain.errors import AuthError, CapacityError, ProviderError, QuotaError

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

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


def map_client_error(exc: ClientError, where: str = "") -> ProviderError:
    """The cloudtrain error for a botocore `ClientError` (`where`: a zone or region)."""
    code = code_of(exc)
    message = str(exc.response.get("Error", {}).get("Message", "")).strip() or str(exc)
    place = f" in {where}" if where else ""
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
        return AuthError(
            "aws",
            code,
            f"{message}{place}. Check the credentials (aws sts get-caller-identity) and that "
            "they may call EC2",
        )
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return ProviderError("aws", code, f"{message}{place}", retryable=int(status) >= 500)


def no_credentials(exc: Exception) -> AuthError:
    return AuthError(
        "aws",
        "NoCredentials",
        f"{exc}. Configure credentials (aws configure, AWS_PROFILE, or --profile)",
    )
