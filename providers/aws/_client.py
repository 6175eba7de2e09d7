"""boto3, imported lazily, and the clients the provider uses (one per region, built once).

``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL`` and ``AWS_MAX_ATTEMPTS`` are read by boto3 itself,
so the provider never names an endpoint: a private endpoint or a test stand-in is configured
the way any AWS tool is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.providers.aws._errors import map_client_error, no_credentials

if TYPE_CHECKING:
    import boto3

T = TypeVar("T")


def import_boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise ConfigError("the aws provider needs boto3: pip install 'cloudtrain[aws]'") from None
    return boto3


class Clients:
    """boto3 clients per (service, region) from one session; thread-safe."""

    def __init__(self, profile: str | None = None, session: boto3.Session | None = None) -> None:
        self._profile = profile
        self._session = session
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        #: hooks (event name, handler) registered on every client built; tests inject faults
        self.hooks: list[tuple[str, Callable[..., Any]]] = []

    def session(self) -> Any:
        if self._session is None:
            boto3 = import_boto3()
            from botocore.exceptions import ProfileNotFound

            try:
                self._session = boto3.Session(profile_name=self._profile)
            except ProfileNotFound as exc:
                raise ConfigError(f"--profile {self._profile!r}: {exc}") from None
        return self._session

    def get(self, service: str, region: str) -> Any:
        with self._lock:
            key = (service, region)
            if key not in self._clients:
                from botocore.config import Config

                client = self.session().client(
                    service, region_name=region, config=Config(retries={"mode": "standard"})
                )
                for event, handler in self.hooks:
                    client.meta.events.register(event, handler)
                self._clients[key] = client
            return self._clients[key]

    def ec2(self, region: str) -> Any:
        return self.get("ec2", region)


@contextmanager
def aws_errors(where: str = "") -> Iterator[None]:
    """Turn botocore's exceptions into cloudtrain's inside the block."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    try:
        yield
    except ClientError as exc:
        raise map_client_error(exc, where) from exc
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise no_credentials(exc) from exc
    except EndpointConnectionError as exc:
        raise ProviderError("aws", "EndpointConnectionError", str(exc), retryable=True) from exc


def paginate(client: Any, operation: str, key: str, **kwargs: Any) -> Iterator[Any]:
    """Every item under `key` of every page of `operation`."""
    for page in client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(key, [])
