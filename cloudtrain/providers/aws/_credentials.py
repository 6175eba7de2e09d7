"""Offline: does boto3's credential chain find credentials, without asking a metadata server?

botocore's own resolver is used, with the two providers that make a network call removed (the
EC2 instance metadata and the container credentials endpoint): the environment, the shared
credentials and config files, SSO, assume-role and ``credential_process`` profiles are what a
laptop uses, and those are read (an assume-role or SSO profile is not refreshed here). A
``credential_process`` is run, as boto3 would run it.
"""

from __future__ import annotations

import os
from typing import Any

from cloudtrain.provision.credentials import Presence

FIX = "aws configure, AWS_PROFILE or --profile"
#: Providers of botocore's chain that call a metadata endpoint.
_NETWORK = ("iam-role", "container-role")
#: What botocore's provider method names say about where credentials came from.
_SOURCES = {
    "env": "the environment (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "the shared credentials file",
    "config-file": "the config file",
    "sso": "an SSO profile",
    "assume-role": "an assume-role profile",
    "custom-process": "a credential_process",
}


def present(options: dict[str, Any]) -> Presence:
    try:
        import botocore.session
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return Presence("aws", False, fix="pip install 'cloudtrain[aws]'")
    profile = options.get("profile") or os.environ.get("AWS_PROFILE") or None
    session = botocore.session.Session(profile=profile)
    try:
        resolver = session.get_component("credential_provider")
        for name in _NETWORK:
            resolver.remove(name)
        found = resolver.load_credentials()
    except BotoCoreError as exc:  # a profile that is not there, a config that does not parse
        return Presence("aws", False, fix=f"{exc}; {FIX}")
    if found is None:
        return Presence("aws", False, fix=FIX)
    source = _SOURCES.get(getattr(found, "method", ""), str(getattr(found, "method", "")))
    return Presence("aws", True, source + (f", profile {profile}" if profile else ""))
