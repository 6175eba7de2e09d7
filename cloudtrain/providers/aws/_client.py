"""boto3, imported lazily, and the clients the provider uses (one per region, built once).

``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL`` and ``AWS_MAX_ATTEMPTS`` are read by boto3 itself,
so the provider never names an endpoint: a private endpoint or a test stand-in is configured
the way any AWS tool is.

Every call runs inside `aws_errors`, which maps whatever botocore raises (``_errors.py``); each
client records, per thread, the last answer it was about to parse, so that an answer that is
no AWS response is described by its status, content type and title.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cloudtrain.errors import ConfigError
from cloudtrain.providers.aws._errors import (
    map_botocore_error,
    map_client_error,
    not_an_aws_response,
)

if TYPE_CHECKING:
    import boto3

T = TypeVar("T")

#: the answer each thread's last call got, as botocore was about to parse it (`_remember`)
_answers = threading.local()
#: what of a body is kept for a message
_KEPT = 4096


def _remember(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    """``before-parse`` handler: keep the answer's status, type and start, per thread."""
    body = response_dict.get("body")
    headers = response_dict.get("headers") or {}
    _answers.last = {
        "service": operation_model.service_model.service_id,
        "operation": operation_model.name,
        "status": response_dict.get("status_code"),
        "content_type": headers.get("content-type", ""),
        "body": body[:_KEPT] if isinstance(body, bytes) else b"",
    }


def last_answer() -> dict[str, Any] | None:
    """The answer this thread's last call got (see `_remember`), if any."""
    found: dict[str, Any] | None = getattr(_answers, "last", None)
    return found


def import_boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise ConfigError("the aws provider needs boto3: pip install 'cloudtrain[aws]'") from None
    return boto3


class Clients:
    """boto3 clients per (service, region) from one session; thread-safe."""

    def __init__(
        self,
        profile: str | None = None,
        session: boto3.Session | None = None,
        *,
        models: Path | None = None,
    ) -> None:
        self._profile = profile
        self._session = session
        #: where botocore's parsed API models are kept (`_models`); None: not kept
        self._models = models
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        #: hooks (event name, handler) registered on every client built; tests inject faults
        self.hooks: list[tuple[str, Callable[..., Any]]] = []

    def session(self) -> Any:
        if self._session is None:
            boto3 = import_boto3()
            from botocore.exceptions import ProfileNotFound

            try:
                self._session = boto3.Session(
                    profile_name=self._profile, botocore_session=self._botocore_session()
                )
            except ProfileNotFound as exc:
                raise ConfigError(f"--profile {self._profile!r}: {exc}") from None
        return self._session

    def _botocore_session(self) -> Any:
        """botocore's session, its models read through `_models`' cache when one is set
        (None: boto3 makes its own)."""
        if self._models is None:
            return None
        import botocore.session
        from botocore.loaders import create_loader

        from cloudtrain.providers.aws import _models

        session = botocore.session.get_session()
        loader = create_loader(session.get_config_variable("data_path"))
        loader.file_loader = _models.file_loader(self._models)
        session.register_component("data_loader", loader)
        return session

    def get(self, service: str, region: str) -> Any:
        """The client of `service` in `region`, built on first use (a bad AWS config file, an
        unknown region: mapped as by `aws_errors`)."""
        with self._lock:
            key = (service, region)
            if key not in self._clients:
                from botocore.config import Config

                with aws_errors(region):
                    client = self.session().client(
                        service, region_name=region, config=Config(retries={"mode": "standard"})
                    )
                client.meta.events.register("before-parse", _remember)
                for event, handler in self.hooks:
                    client.meta.events.register(event, handler)
                self._clients[key] = client
            return self._clients[key]

    def ec2(self, region: str) -> Any:
        return self.get("ec2", region)

    def caller(self, region: str) -> str | None:
        """Who asks, and where, for keying what is cached (`_cache`): the EC2 endpoint of
        `region` (``AWS_ENDPOINT_URL*`` included), SSM's endpoint variable, the profile, and
        the access key id (one account's: another account, or another user of it, never
        shares an answer). No call is made. None without credentials."""
        endpoint = self.ec2(region).meta.endpoint_url  # first: it makes the session
        credentials = self.session().get_credentials()
        if credentials is None:
            return None
        access_key = credentials.get_frozen_credentials().access_key
        ssm = os.environ.get("AWS_ENDPOINT_URL_SSM", "")
        return "\0".join([endpoint, ssm, self.session().profile_name or "", access_key])


@contextmanager
def aws_errors(where: str = "") -> Iterator[None]:
    """Turn botocore's exceptions into cloudtrain's inside the block (`where`: a zone or
    region, for the message): every one of them, each as one line."""
    from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError
    from botocore.parsers import ResponseParserError

    _answers.last = None
    try:
        yield
    except ParamValidationError:  # a request cloudtrain built wrong: a bug, for the crash report
        raise
    except ClientError as exc:
        raise map_client_error(exc, where, last_answer()) from exc
    except ResponseParserError as exc:
        raise not_an_aws_response(exc, where, last_answer()) from exc
    except BotoCoreError as exc:
        raise map_botocore_error(exc, where) from exc


def concurrently(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run `calls` at once, a thread each, and return their results in order. Every call has
    finished before this returns or raises (an interrupt included): what one of them made
    exists when the caller cleans up after another one's error. Raises the first error, in
    the order of `calls`. Each call maps its own errors (`aws_errors` is per thread)."""
    if len(calls) <= 1:
        return [call() for call in calls]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(len(calls), 16), thread_name_prefix="cloudtrain-aws") as pool:
        futures = [pool.submit(call) for call in calls]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]


def paginate(client: Any, operation: str, key: str, **kwargs: Any) -> Iterator[Any]:
    """Every item under `key` of every page of `operation`."""
    for page in client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(key, [])
