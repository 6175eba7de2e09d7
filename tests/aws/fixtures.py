"""Fixtures for tests against the AWS stand-in (``standin.py``).

``aws_standin`` (session) starts the server once; ``aws`` (function, explicit) empties it and
points this process's environment at it, so boto3 code under test — and any subprocess started
with ``os.environ`` — reaches only 127.0.0.1, with dummy credentials and no retries.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.aws.standin import StandIn


@pytest.fixture(scope="session")
def aws_standin() -> Iterator[StandIn]:
    """The stand-in server, started once per session and stopped at its end."""
    with StandIn() as standin:
        yield standin


@pytest.fixture
def aws(aws_standin: StandIn, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    """The stand-in, emptied, with ``aws_standin.env()`` set in ``os.environ`` for the test."""
    aws_standin.reset()
    for key, value in aws_standin.env().items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    return aws_standin
