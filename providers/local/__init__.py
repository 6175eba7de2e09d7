"""The embedded local provider: nodes are folders on this machine, jobs are processes."""

from __future__ import annotations

from cloudtrain.provision.provider import Option

OPTIONS: tuple[Option, ...] = ()
