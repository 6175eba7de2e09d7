"""Fixtures for tests against the Kubernetes stand-in (``standin.py``).

``k8s_standin`` (session) starts the server once per worker; ``k8s`` (function) empties it
(no nodes: a test adds the ones it needs), points ``KUBECONFIG`` at it for the test, and
fails the test if a pod's process outlives its ``reset``. ``core`` is a ``CoreV1Api`` of the
official client built from the stand-in's kubeconfig, never the global default config, so
tests stay independent of each other and of the developer's own cluster.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes.client.exceptions import ApiException

from tests.k8s.standin import StandIn
from tests.k8s.store import Obj

T = TypeVar("T")


@pytest.fixture(scope="session")
def k8s_standin() -> Iterator[StandIn]:
    with StandIn(namespaces=("default", "team")) as standin:
        yield standin


@pytest.fixture
def k8s(k8s_standin: StandIn, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    """The stand-in, emptied, with ``k8s_standin.env()`` set in ``os.environ``."""
    k8s_standin.reset()
    for key, value in k8s_standin.env().items():
        monkeypatch.setenv(key, value)
    yield k8s_standin
    assert k8s_standin.errors == [], "the stand-in failed to answer a request"
    k8s_standin.reset()
    assert k8s_standin.processes() == [], "a pod's process outlived the stand-in's reset"


def api_client(standin: StandIn) -> Any:
    """An ``ApiClient`` of the official client for `standin` (its own configuration)."""
    from kubernetes import config

    return config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(standin.kubeconfig_file)
    )


@pytest.fixture
def core(k8s: StandIn) -> Iterator[Any]:
    """``kubernetes.client.CoreV1Api`` against the emptied stand-in."""
    from kubernetes import client

    api = api_client(k8s)
    yield client.CoreV1Api(api)
    api.close()


def eventually(check: Callable[[], T | None], timeout: float = 10.0, every: float = 0.05) -> T:
    """`check()`'s first truthy answer, asked every `every` s; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"still {answer!r} after {timeout} s")
        time.sleep(every)


def pod(name: str, *command: str, labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    """A pod body of one container ``c`` (image ``busybox``) running `command`."""
    container: Obj = {"name": "c", "image": "busybox", "command": list(command)}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [container], **spec},
    }


def phase(core: Any, name: str, namespace: str = "default") -> str:
    return str(core.read_namespaced_pod(name, namespace).status.phase)


def quietly(call: Callable[[], T]) -> T:
    """`call()`'s answer, with the sockets it left open collected here without a warning.
    ``kubernetes.stream.stream`` never closes its WebSocket when it reads the whole answer
    (the default ``_preload_content=True``) or when the handshake is refused: the client's
    doing, not the stand-in's, and the warning would land in whichever test came next."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return call()
        finally:
            gc.collect()


def refused(call: Callable[[], object]) -> str:
    """The text of the ``ApiException`` that `call` raises (see `quietly`)."""

    def catch() -> str:
        try:
            call()
        except ApiException as exc:
            return str(exc)
        raise AssertionError("no ApiException")

    return quietly(catch)


def watching(func: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Iterator[Any]]:
    """A ``kubernetes.watch.Watch`` and its stream of `func`'s events (``stop()`` ends it)."""
    from kubernetes import watch

    w: Any = watch.Watch()  # type: ignore[no-untyped-call]
    return w, w.stream(func, *args, **kwargs)
