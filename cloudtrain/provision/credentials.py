"""Are a cloud's credentials present? An offline answer, cheap enough to ask of every cloud.

The optimizer (`cloudtrain.plan.optimizer`) considers only the clouds whose credentials are
present, and `cloudtrain check` starts from this answer before it asks the cloud whether they
are valid. Nothing here calls a cloud or a metadata server: each cloud's plugin
(`cloudtrain.provision.plugin.Plugin.credentials`) looks where its SDK's default chain looks
first (environment, the CLI's files), so a machine whose only credentials come from an
instance's metadata server is "not present" here (name the provider to use them). A provider
without such a check (this machine, the user's hosts) is no cloud, and has nothing to present.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Presence", "present"]


@dataclass(frozen=True)
class Presence:
    """Whether `provider`'s credentials were found, where (`source`), or what to do (`fix`)."""

    provider: str
    found: bool
    source: str = ""
    fix: str = ""

    def text(self) -> str:
        """One line: ``aws: credentials from env AWS_ACCESS_KEY_ID`` or what to fix."""
        if self.found:
            return f"{self.provider}: credentials from {self.source}"
        return f"{self.provider}: no credentials ({self.fix})"


def present(provider: str, options: Mapping[str, Any] | None = None) -> Presence:
    """Where `provider`'s credentials would come from (its account `options`, e.g. an AWS
    profile, taken into account); offline."""
    from cloudtrain.provision.registry import plugin

    read = plugin(provider).credentials
    if read is None:
        return Presence(provider, False, fix=f"{provider} is not a cloud with credentials")
    return read(dict(options or {}))
