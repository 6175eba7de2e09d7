"""google-cloud-compute, imported lazily, and the clients the provider uses (built once).

Credentials come from ``google.auth.default()`` (gcloud's application-default login,
``GOOGLE_APPLICATION_CREDENTIALS``, or the metadata server). ``CLOUDTRAIN_GCP_ENDPOINT``
replaces the API's address for **every** client, the operation pollers included: the SDK's own
``ExtendedOperation.result()`` polls through a client built without our ``client_options``
(i.e. the real Google endpoint), so this module never calls it; mutating calls use the
``*_unary`` methods and operations are waited on with our own ``*OperationsClient``.

Every call runs inside `gcp_errors` (`mutate`, `wait`, and the listings of ``_resources.py``),
which maps whatever the SDK stack raises (``_errors.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import AccountError, ConfigError, ProviderError
from cloudtrain.providers.gcp._credentials import PROJECT_ENVS
from cloudtrain.providers.gcp._errors import (
    map_operation_error,
    map_sdk_error,
    no_credentials,
    protobuf_json_format,
)

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import compute_v1

ENDPOINT_ENV = "CLOUDTRAIN_GCP_ENDPOINT"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def import_compute() -> Any:
    try:
        from google.cloud import compute_v1
    except ImportError:
        raise ConfigError(
            "the gcp provider needs google-cloud-compute: pip install 'cloudtrain[gcp]'"
        ) from None
    return compute_v1


def last(url: str) -> str:
    """``https://…/zones/us-central1-a`` → ``us-central1-a``."""
    return url.rstrip("/").rsplit("/", 1)[-1]


class Clients:
    """Compute Engine clients of one project, sharing one set of credentials; thread-safe.

    `hooks` are called with a call's name right after each mutating call returns (before its
    operation is waited on): tests use them to stand for a crash at that point."""

    def __init__(
        self,
        project: str | None = None,
        credentials: Credentials | None = None,
        endpoint: str | None = None,
        call_timeout_s: float = 60.0,
    ) -> None:
        self._project = project
        self._credentials = credentials
        self._default_project: str | None = None
        self.endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or None
        self.call_timeout_s = call_timeout_s
        self._clients: dict[str, Any] = {}
        self._lock = threading.RLock()
        self.hooks: list[Callable[[str], None]] = []

    def credentials(self) -> Credentials:
        with self._lock:
            if self._credentials is None:
                import google.auth
                from google.auth.exceptions import GoogleAuthError

                try:
                    found, project = google.auth.default(scopes=SCOPES)
                except GoogleAuthError as exc:
                    raise no_credentials(exc) from None
                self._credentials, self._default_project = found, project
            return self._credentials

    @property
    def project(self) -> str:
        """``project`` option, else ``CLOUDSDK_CORE_PROJECT``/``GOOGLE_CLOUD_PROJECT``, else
        the credentials' own project."""
        found = self._project or next(
            (os.environ[e] for e in PROJECT_ENVS if os.environ.get(e)), None
        )
        if not found:
            self.credentials()
            found = self._default_project
        if not found:
            raise AccountError(
                "no GCP project: pass --project, set CLOUDSDK_CORE_PROJECT (gcloud config set "
                "project …) or use credentials that name one"
            )
        return found

    def _get(self, name: str) -> Any:
        with self._lock:
            if name not in self._clients:
                compute = import_compute()
                options = {"api_endpoint": self.endpoint} if self.endpoint else None
                credentials = self.credentials()
                with gcp_errors(name):
                    self._clients[name] = getattr(compute, name)(
                        credentials=credentials, transport="rest", client_options=options
                    )
            return self._clients[name]

    def projects(self) -> compute_v1.ProjectsClient:
        client: compute_v1.ProjectsClient = self._get("ProjectsClient")
        return client

    def regions(self) -> compute_v1.RegionsClient:
        client: compute_v1.RegionsClient = self._get("RegionsClient")
        return client

    def instances(self) -> compute_v1.InstancesClient:
        client: compute_v1.InstancesClient = self._get("InstancesClient")
        return client

    def firewalls(self) -> compute_v1.FirewallsClient:
        client: compute_v1.FirewallsClient = self._get("FirewallsClient")
        return client

    def resource_policies(self) -> compute_v1.ResourcePoliciesClient:
        client: compute_v1.ResourcePoliciesClient = self._get("ResourcePoliciesClient")
        return client

    def accelerator_types(self) -> compute_v1.AcceleratorTypesClient:
        client: compute_v1.AcceleratorTypesClient = self._get("AcceleratorTypesClient")
        return client

    def mutate(
        self, what: str, call: Callable[..., compute_v1.Operation], where: str, **request: Any
    ) -> compute_v1.Operation:
        """One mutating call (`what`, e.g. ``instances.bulkInsert``); its operation, unwaited."""
        with gcp_errors(where):
            op = call(request=request, timeout=self.call_timeout_s)
        for hook in self.hooks:
            hook(what)
        return op

    def wait(self, op: compute_v1.Operation, where: str, timeout_s: float) -> None:
        """Block until `op` is DONE, polling through our own operations clients (the configured
        endpoint); raise the mapped error when it finished with one."""
        compute = import_compute()
        deadline = time.monotonic() + timeout_s
        while op.status != compute.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise ProviderError(
                    "gcp",
                    "WaitTimeout",
                    f"operation {op.name} ({op.operation_type}) in "
                    f"{where} not done after {timeout_s:.0f} s",
                )
            scope: dict[str, str] = {"project": self.project, "operation": op.name}
            with gcp_errors(where):
                if op.zone:
                    client = self._get("ZoneOperationsClient")
                    scope["zone"] = last(op.zone)
                elif op.region:
                    client = self._get("RegionOperationsClient")
                    scope["region"] = last(op.region)
                else:
                    client = self._get("GlobalOperationsClient")
                op = client.wait(request=scope, timeout=self.call_timeout_s + 120)
        if op.error.errors:
            raise map_operation_error(op, where)


@contextmanager
def gcp_errors(where: str = "") -> Iterator[None]:
    """Turn what google-api-core, google-auth, requests and protobuf raise into cloudtrain's
    errors inside the block (`where`: a zone, region or resource, for the message): every one
    of them, each as one line. Anything else (cloudtrain's own errors included) passes."""
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError

    json_format = protobuf_json_format()
    from requests.exceptions import RequestException

    try:
        yield
    except (
        GoogleAPIError,
        GoogleAuthError,
        RequestException,
        json_format.Error,
        json.JSONDecodeError,
    ) as exc:
        raise map_sdk_error(exc, where) from exc
