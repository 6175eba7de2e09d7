"""The embedded local provider: nodes are folders on this machine, jobs are processes."""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import NODE_PRICE, Option

OPTIONS: tuple[Option, ...] = (NODE_PRICE,)

PLUGIN = laid_out(__name__, "LocalProvider", OPTIONS, default=True)
