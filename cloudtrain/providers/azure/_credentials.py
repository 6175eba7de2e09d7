"""Offline: would azure-identity's `DefaultAzureCredential` find credentials, and is there a
subscription?

Looks where it looks, without a token request: a service principal or workload identity in the
environment (``AZURE_CLIENT_ID`` and ``AZURE_TENANT_ID`` with ``AZURE_CLIENT_SECRET``,
``AZURE_CLIENT_CERTIFICATE_PATH`` or ``AZURE_FEDERATED_TOKEN_FILE``), a managed identity's
endpoint in the environment (``IDENTITY_ENDPOINT``/``MSI_ENDPOINT``), or the Azure CLI's login
(``azureProfile.json`` under ``AZURE_CONFIG_DIR`` or ``~/.azure``). The provider needs the
subscription named (``--subscription`` or ``AZURE_SUBSCRIPTION_ID``), so that is asked too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cloudtrain.provision.credentials import Presence

FIX = "az login or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET"
_SECRETS = ("AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_FEDERATED_TOKEN_FILE")


def _cli_logged_in() -> bool:
    folder = Path(os.environ.get("AZURE_CONFIG_DIR") or Path.home() / ".azure")
    try:
        profile = json.loads((folder / "azureProfile.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return False
    return isinstance(profile, dict) and bool(profile.get("subscriptions"))


def _source() -> str | None:
    env = os.environ
    if env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID"):
        secret = next((name for name in _SECRETS if env.get(name)), None)
        if secret:
            return f"the environment ({secret})"
    if env.get("IDENTITY_ENDPOINT") or env.get("MSI_ENDPOINT"):
        return "a managed identity"
    if _cli_logged_in():
        return "the Azure CLI's login"
    return None


def present(options: dict[str, Any]) -> Presence:
    source = _source()
    if source is None:
        return Presence("azure", False, fix=FIX)
    subscription = options.get("subscription") or os.environ.get("AZURE_SUBSCRIPTION_ID")
    if not subscription:
        return Presence(
            "azure", False, fix="no subscription: --subscription or AZURE_SUBSCRIPTION_ID"
        )
    return Presence("azure", True, f"{source}, subscription {subscription}")
