"""Offline: would the provider find a Kubernetes API server to talk to?

The same places `_api.Api` reads, without reading them: the kubeconfig file (``--kubeconfig``,
``$KUBECONFIG``, ``~/.kube/config``) or, inside a pod, its service account. Whether the file's
context exists and its credentials are accepted is `cloudtrain check`'s call to the server.
"""

from __future__ import annotations

from typing import Any

from cloudtrain.errors import ConfigError
from cloudtrain.providers.kubernetes._api import NAME, kubeconfig
from cloudtrain.provision.credentials import Presence

FIX = "a kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config), or run inside a pod"


def present(options: dict[str, Any]) -> Presence:
    try:
        found = kubeconfig(options.get("kubeconfig"))
    except ConfigError as exc:
        given = options.get("kubeconfig")
        return Presence(NAME, False, fix=str(exc) if given else FIX)
    return Presence(NAME, True, f"kubeconfig {found}" if found else "this pod's service account")
