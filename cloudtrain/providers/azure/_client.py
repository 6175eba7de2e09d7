"""The azure SDK, imported lazily, and the clients the provider uses (built once, on first use).

Endpoint: ``CLOUDTRAIN_AZURE_ENDPOINT`` (the ARM base URL; default Azure's public cloud). It must
be https: azure-core sends bearer tokens over TLS only, and this code does not weaken that — a
local stand-in serves TLS with its own certificate, trusted through ``REQUESTS_CA_BUNDLE``.

Credentials: `DefaultAzureCredential` (environment, workload/managed identity, Azure CLI …).
With a custom endpoint or ``AZURE_AUTHORITY_HOST``, MSAL's instance discovery (a call to
Microsoft that an air-gapped or test authority cannot answer) is turned off.

Every call runs inside `azure_errors`, which maps whatever azure-core raises (``_errors.py``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import AccountError, ConfigError
from cloudtrain.providers.azure._errors import (
    map_azure_error,
    map_decode_error,
    map_http_error,
    no_credentials,
)

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.pipeline import PipelineRequest, PipelineResponse
    from azure.mgmt.authorization import AuthorizationManagementClient
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.network import NetworkManagementClient
    from azure.mgmt.resource.resources import ResourceManagementClient

ENDPOINT_ENV = "CLOUDTRAIN_AZURE_ENDPOINT"
PUBLIC_CLOUD = "https://management.azure.com"
#: Authority hosts MSAL knows without instance discovery being needed.
KNOWN_AUTHORITIES = ("https://login.microsoftonline.com", "login.microsoftonline.com")
EXTRA = "pip install 'cloudtrain[azure]'"


def import_sdk() -> None:
    """Fail with one line naming the extra when the SDK is missing."""
    try:
        import azure.identity
        import azure.mgmt.authorization
        import azure.mgmt.compute
        import azure.mgmt.network
        import azure.mgmt.resource.resources  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the azure provider needs azure-identity and "
            f"azure-mgmt-authorization/-compute/-network/-resource: "
            f"{EXTRA}"
        ) from None


def endpoint() -> str:
    """The ARM base URL; `ConfigError` when it is not https."""
    url = (os.environ.get(ENDPOINT_ENV) or PUBLIC_CLOUD).rstrip("/")
    if not url.startswith("https://"):
        raise ConfigError(
            f"{ENDPOINT_ENV}={url!r}: the Azure endpoint must be an https:// URL (azure-core "
            "sends bearer tokens over TLS only); unset it to use Azure's public cloud"
        )
    return url


class Clients:
    """The compute, network and resource clients of one subscription; thread-safe.

    `poll_s` is the LRO polling interval (None: the SDK's, honouring ``Retry-After``);
    `retries` how often azure-core retries a failed request (None: its default).
    `response_hooks` run on every HTTP response of every client (tests stop the process there).
    """

    def __init__(
        self,
        subscription: str | None = None,
        *,
        credential: TokenCredential | None = None,
        poll_s: float | None = None,
        retries: int | None = None,
    ) -> None:
        self._subscription = subscription
        self._credential = credential
        self.poll_s = poll_s
        self.retries = retries
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.response_hooks: list[Callable[[PipelineResponse[Any, Any]], None]] = []
        self.request_hooks: list[Callable[[PipelineRequest[Any]], None]] = []

    @property
    def subscription(self) -> str:
        found = self._subscription or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not found:
            raise AccountError(
                "azure needs a subscription: pass --subscription ID (or `subscription` in the "
                "task's provider options) or set AZURE_SUBSCRIPTION_ID"
            )
        return found

    def credential(self) -> TokenCredential:
        if self._credential is None:
            import_sdk()
            from azure.identity import DefaultAzureCredential

            authority = os.environ.get("AZURE_AUTHORITY_HOST", "")
            custom = endpoint() != PUBLIC_CLOUD or (
                bool(authority) and authority.rstrip("/") not in KNOWN_AUTHORITIES
            )
            self._credential = DefaultAzureCredential(disable_instance_discovery=custom)
        return self._credential

    def _build(self, name: str, factory: Callable[..., Any]) -> Any:
        with self._lock:
            if name not in self._clients:
                kwargs: dict[str, Any] = {
                    "base_url": endpoint(),
                    "raw_response_hook": self._on_response,
                    "raw_request_hook": self._on_request,
                }
                if self.poll_s is not None:
                    kwargs["polling_interval"] = self.poll_s
                if self.retries is not None:
                    kwargs["retry_total"] = self.retries
                subscription, credential = self.subscription, self.credential()
                with azure_errors():
                    self._clients[name] = factory(credential, subscription, **kwargs)
            return self._clients[name]

    def _on_response(self, response: PipelineResponse[Any, Any]) -> None:
        for hook in self.response_hooks:
            hook(response)

    def _on_request(self, request: PipelineRequest[Any]) -> None:
        for hook in self.request_hooks:
            hook(request)

    def authorization(self) -> AuthorizationManagementClient:
        import_sdk()
        from azure.mgmt.authorization import AuthorizationManagementClient

        client: AuthorizationManagementClient = self._build(
            "authorization", AuthorizationManagementClient
        )
        return client

    def compute(self) -> ComputeManagementClient:
        import_sdk()
        from azure.mgmt.compute import ComputeManagementClient

        client: ComputeManagementClient = self._build("compute", ComputeManagementClient)
        return client

    def network(self) -> NetworkManagementClient:
        import_sdk()
        from azure.mgmt.network import NetworkManagementClient

        client: NetworkManagementClient = self._build("network", NetworkManagementClient)
        return client

    def resources(self) -> ResourceManagementClient:
        import_sdk()
        from azure.mgmt.resource.resources import ResourceManagementClient

        client: ResourceManagementClient = self._build("resources", ResourceManagementClient)
        return client


@contextmanager
def azure_errors(where: str = "") -> Iterator[None]:
    """Turn azure-core's exceptions into cloudtrain's inside the block (`where`: a zone or
    region, for the message): every one of them, each as one line."""
    from azure.core.exceptions import (
        AzureError,
        ClientAuthenticationError,
        DecodeError,
        DeserializationError,
        HttpResponseError,
        SerializationError,
    )

    try:
        yield
    except ClientAuthenticationError as exc:
        if exc.response is None:  # the credential got no token: nothing reached ARM
            raise no_credentials(exc) from exc
        raise map_http_error(exc, where) from exc
    except DecodeError as exc:  # an HttpResponseError too, of a body that could not be read
        raise map_decode_error(exc, where) from exc
    except json.JSONDecodeError as exc:  # a pager's page of 200 that is no JSON (a login page)
        raise map_decode_error(exc, where) from exc
    except HttpResponseError as exc:
        raise map_http_error(exc, where) from exc
    except (AzureError, DeserializationError, SerializationError) as exc:
        shown = (os.environ.get(ENDPOINT_ENV) or PUBLIC_CLOUD).rstrip("/")  # unchecked here
        raise map_azure_error(exc, where, shown) from exc
