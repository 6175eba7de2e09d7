"""An in-memory provider for tests: a fake cloud that records what was asked of it."""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import Option

OPTIONS: tuple[Option, ...] = ()

PLUGIN = laid_out(__name__, "FakeProvider", OPTIONS, for_tests=True)
