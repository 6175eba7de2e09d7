"""Fixtures for tests against the Azure stand-in (``standin.py``).

``azure_standin`` (session) starts the HTTPS server once; ``azure`` (function, explicit) empties
it and points this process's environment at it — ARM endpoint, token authority, a client-secret
credential, the stand-in's CA — so the SDK code under test, and any subprocess started with
``os.environ``, reaches only 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.azure.standin import StandIn


@pytest.fixture(scope="session")
def azure_standin() -> Iterator[StandIn]:
    """The stand-in server, started once per session and stopped at its end."""
    with StandIn() as standin:
        yield standin


@pytest.fixture
def azure(azure_standin: StandIn, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    """The stand-in, emptied, with ``azure_standin.env()`` set in ``os.environ`` for the test."""
    azure_standin.reset()
    for key, value in azure_standin.env().items():
        monkeypatch.setenv(key, value)
    return azure_standin
