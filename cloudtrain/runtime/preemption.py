"""What a training script learns of its node's preemption, from the node agent's watcher
(`cloudtrain.node.notices`): the cloud's own notice, a minute or two before the node goes.

    if runtime.preempting():            # the notice is recorded on this node
        save and stop
    runtime.on_preemption(save_now)     # or be told at once (the agent's signal)

No cloud call and no polling here: the agent writes ``<node root>/preemption.json`` and sends
``SIGUSR1`` to the processes that catch it (registering a callback is what makes a process
catch it: a script that does not register is never sent a signal it would die of).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from cloudtrain.node.notices import NOTICE_FILE, NOTICE_SIGNAL_NAME


def _root() -> Path | None:
    root = os.environ.get("CLOUDTRAIN_NODE_ROOT")
    return Path(root) if root else None


def preempting() -> bool:
    """True once this node's cloud has announced that it takes the node away."""
    root = _root()
    return root is not None and (root / NOTICE_FILE).exists()


def on_preemption(callback: Callable[[], None]) -> None:
    """Call `callback` when the notice comes (in the main thread, between two of the script's
    statements, as Python runs signal handlers), or now when it has come already. Call it
    in every rank that should act: each process gets its own signal."""

    def handle(signum: int, frame: FrameType | None) -> None:
        callback()

    signal.signal(signal.Signals[NOTICE_SIGNAL_NAME], handle)
    if preempting():
        callback()
