"""Fixtures for tests against the GCE stand-in (``standin.py``).

``gcp_standin`` (session) starts the server once; ``gcp`` (function, explicit) empties it and
points this process's environment at it (endpoint, credentials file, project), so
google-cloud-compute code under test — and any subprocess started with ``os.environ`` —
reaches only 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gcp.standin import StandIn


@pytest.fixture(scope="session")
def gcp_standin() -> Iterator[StandIn]:
    with StandIn() as standin:
        yield standin


@pytest.fixture
def gcp(gcp_standin: StandIn, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    """The stand-in, emptied, with ``gcp_standin.env()`` set in ``os.environ`` for the test."""
    gcp_standin.reset()
    for key, value in gcp_standin.env().items():
        monkeypatch.setenv(key, value)
    return gcp_standin
