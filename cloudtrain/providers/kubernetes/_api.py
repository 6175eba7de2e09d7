"""The Kubernetes API as the provider calls it: the official client, built from the user's
kubeconfig or a pod's service account, and every error it raises mapped to cloudtrain's at this
boundary (one line each: the API server's own message, which names the object and the verb).

The client is imported only here, when a cluster of this provider is used: reading the plugin
costs nothing (`cloudtrain.providers.kubernetes`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cloudtrain.errors import (
    AuthError,
    ConfigError,
    ProviderError,
    QuotaError,
)

NAME = "kubernetes"
#: A namespace as Kubernetes allows it (an RFC 1123 label).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: What websocket-client raises for an upgrade the server refused: its status, then its
#: headers and its body after ``-+-+-`` marks.
_HANDSHAKE = re.compile(r"Handshake status (\d{3})\b")
#: Seconds one API call may take (a watch says its own).
CALL_S = 30.0
#: Where a pod's service account keeps its token (the client reads it; here: whether it is one).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class NotFound(ProviderError):
    """The object asked for is not there (HTTP 404)."""


class Conflict(ProviderError):
    """The object exists already, or changed meanwhile (HTTP 409)."""


def client_module() -> Any:
    try:
        import kubernetes
    except ImportError as exc:
        raise ConfigError(
            "the kubernetes provider needs the official client: "
            "pip install 'cloudtrain[kubernetes]'"
        ) from exc
    return kubernetes


class Api:
    """The API server of one kubeconfig context (or of the pod this runs in), in one namespace."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        k8s = client_module()
        self.kubeconfig = kubeconfig(options.get("kubeconfig"))
        context = options.get("context") or None
        try:
            if self.kubeconfig is None:
                cfg = k8s.client.Configuration()
                k8s.config.load_incluster_config(client_configuration=cfg)
                self.client = k8s.client.ApiClient(cfg)
                found = SERVICE_ACCOUNT / "namespace"
                default = found.read_text().strip() if found.is_file() else "default"
                self.where = "this pod's service account"
                self.user = "this pod's service account"
            else:
                contexts, active = k8s.config.list_kube_config_contexts(str(self.kubeconfig))
                chosen = next((c for c in contexts if c.get("name") == context), None)
                if context and chosen is None:
                    names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
                    raise ConfigError(
                        f"--context {context!r}: {self.kubeconfig} has no such context "
                        f"(it has: {names})"
                    )
                chosen = chosen or active
                self.where = f"context {chosen.get('name')!r} of {self.kubeconfig}"
                with _plugin_errors() as said:
                    self.client = k8s.config.new_client_from_config(
                        config_file=str(self.kubeconfig),
                        context=chosen.get("name"),
                        persist_config=False,
                    )
                if said:  # its credential plugin failed: every call would be refused
                    raise AuthError(
                        NAME, "CredentialPlugin", f"{self.where}: its credential plugin failed: "
                        + " ".join(said[0].split())[:400],
                    )  # fmt: skip
                default = (chosen.get("context") or {}).get("namespace") or "default"
                self.user = str((chosen.get("context") or {}).get("user") or "")
        except k8s.config.ConfigException as exc:
            raise ConfigError(f"kubernetes: {self.kubeconfig}: {exc}") from exc
        self.namespace = str(options.get("namespace") or default)
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ConfigError(
                f"--namespace {self.namespace!r} is not a namespace's name (1 to 63 lowercase "
                "letters, digits and '-', a letter or digit at each end)"
            )
        self.core = k8s.client.CoreV1Api(self.client)
        self.net = k8s.client.NetworkingV1Api(self.client)
        self.host = str(self.client.configuration.host)

    @contextlib.contextmanager
    def exec_core(self) -> Iterator[Any]:
        """A `CoreV1Api` of its own for one exec: the client's `stream` swaps its client's
        transport for the WebSocket while it connects, which would take every other thread's
        call on a shared one with it."""
        k8s = client_module()
        client = k8s.client.ApiClient(self.client.configuration)
        try:
            yield k8s.client.CoreV1Api(client)
        finally:
            client.close()

    @contextlib.contextmanager
    def calling(self, what: str) -> Iterator[None]:
        """Map what the client raises while doing `what` to cloudtrain's errors."""
        k8s = client_module()
        import urllib3  # the client's transport

        try:
            yield
        except k8s.client.exceptions.ApiException as exc:
            raise self.error(what, exc) from exc
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # no answer, after its retries
            raise self.unreachable(what, _why(exc)) from exc
        except ValueError as exc:  # an answer the client's models cannot read
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ProviderError(
                NAME, "BadAnswer", f"{what}: {self.host} gave an answer that cannot be read: {said}"
            ) from exc

    def unreachable(self, what: str, said: str) -> ProviderError:
        return ProviderError(
            NAME,
            "Unreachable",
            f"{what}: the API server at {self.host} does not answer: {said}",
            retryable=True,
        )

    def error(self, what: str, exc: Any) -> ProviderError:
        """The cloudtrain error for the client's `ApiException` `exc` while doing `what`."""
        status = int(getattr(exc, "status", 0) or 0)
        said = _message(getattr(exc, "body", None)) or str(getattr(exc, "reason", "")) or "?"
        refused = _HANDSHAKE.match(said) if status == 0 else None
        if refused:  # an exec the server refused: websocket-client's words around its answer
            status = int(refused.group(1))
            said = _message(said.rpartition(" -+-+- ")[2]) or f"HTTP {status}"
        if status == 0:
            return self.unreachable(what, said)
        if status == 401:
            return AuthError(
                NAME,
                "Unauthorized",
                f"{what}: {self.where} is not accepted by {self.host} ({said})",
            )
        if status == 403 and ("exceeded quota" in said or "failed quota" in said):
            return QuotaError(NAME, "QuotaExceeded", f"{what}: {said}")
        if status == 403:
            return AuthError(NAME, "Forbidden", f"{what}: {said}")
        if status == 404:
            return NotFound(NAME, "NotFound", f"{what}: {said}")
        if status == 409:
            return Conflict(NAME, "Conflict", f"{what}: {said}")
        code = {400: "BadRequest", 422: "Invalid", 429: "TooManyRequests"}.get(status)
        return ProviderError(
            NAME,
            code or f"HTTP{status}",
            f"{what}: {said}",
            retryable=status == 429 or status >= 500,
        )


class _Said(logging.Handler):
    """What the client's kubeconfig loader logs as an error (it logs a credential plugin's
    failure, its exit and its stderr, and goes on without credentials)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if f"{os.sep}kubernetes{os.sep}config{os.sep}" in record.pathname:
            self.lines.append(record.getMessage())


@contextlib.contextmanager
def _plugin_errors() -> Iterator[list[str]]:
    """The errors the client logs meanwhile, kept from the terminal (a handler on the root
    logger also keeps ``logging.error`` from configuring it for the whole process)."""
    said = _Said()
    root = logging.getLogger()
    root.addHandler(said)
    try:
        yield said.lines
    finally:
        root.removeHandler(said)


def kubeconfig(given: object) -> Path | None:
    """The kubeconfig file to read: `given`, ``$KUBECONFIG`` (its first file), or
    ``~/.kube/config``; None inside a pod with no kubeconfig (its service account)."""
    if given:
        path = Path(str(given)).expanduser()
        if not path.is_file():
            raise ConfigError(f"--kubeconfig {str(given)!r}: no such file")
        return path
    env = os.environ.get("KUBECONFIG", "")
    for part in env.split(os.pathsep):
        if part and Path(part).expanduser().is_file():
            return Path(part).expanduser()
    default = Path.home() / ".kube" / "config"
    if default.is_file():
        return default
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT / "token").is_file():
        return None
    raise ConfigError(
        "kubernetes: no kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and not "
        "inside a pod with a service account"
    )


def _why(exc: BaseException) -> str:
    """Why a connection failed, in one line: urllib3's last reason, without its objects'
    reprs (``<urllib3.connection.HTTPConnection object at 0x…>: Failed to establish…``)."""
    reason = getattr(exc, "reason", None) or exc
    text = re.sub(r"<[^<>]*object at 0x[0-9a-f]+>:?\s*", "", str(reason))
    return " ".join(text.split())[:300] or type(exc).__name__


def _message(body: object) -> str:
    """The ``message`` of a Status body, on one line; "" when the body is none."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body.strip():
        return ""
    try:
        found = json.loads(body)
    except ValueError:
        return " ".join(body.split())[:300]
    message = found.get("message") if isinstance(found, dict) else None
    return " ".join(str(message).split())[:500] if message else ""
