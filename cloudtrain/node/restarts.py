"""Run a child again each time it dies: the one restart loop behind the node agent's
supervisor (`agent.supervise`) and a managed job's watcher supervisor
(`cloudtrain.jobs.supervisor`). Stdlib only: it runs on the nodes too.

The wait doubles from `RESTART_S` to `MAX_RESTART_S` after each death, and is back to
`RESTART_S` after a child that lived `HEALTHY_S` (it was working). With `give_up`, that many
deaths in a row, each sooner than `HEALTHY_S` after its start (a crash at every start), end the
loop. SIGTERM stops the child and the loop.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

RESTART_S, MAX_RESTART_S = 1.0, 30.0
HEALTHY_S = 60.0


def supervise(
    child: Sequence[str],
    name: str,
    say: Callable[[str], None],
    *,
    is_open: Callable[[], bool] = lambda: True,
    give_up: int | None = None,
    after_give_up: str = "",
) -> int:
    """Run `child`, again after each death (a non-zero exit or a signal) while `is_open()`.
    `say` gets one line per death, naming the child as `name`. Returns 0 when the child exits
    0, when `is_open()` is False after a death, or on SIGTERM; 1 when it gave up."""
    stopping = threading.Event()
    current: list[subprocess.Popen[bytes]] = []

    def on_term(signum: int, frame: object) -> None:
        stopping.set()
        for proc in current:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        delay, quick = RESTART_S, 0
        while not stopping.is_set():
            began = time.monotonic()
            proc = subprocess.Popen(child, stdin=subprocess.DEVNULL)
            current[:] = [proc]
            if stopping.is_set():  # a SIGTERM just before it started
                proc.terminate()
            code = proc.wait()
            if stopping.is_set() or code == 0 or not is_open():
                return 0
            lived = time.monotonic() - began
            delay, quick = (RESTART_S, 0) if lived >= HEALTHY_S else (delay, quick + 1)
            how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
            if give_up is not None and quick >= give_up:
                say(f"{name} {how}: {quick} deaths in a row, each within {HEALTHY_S:.0f} s of "
                    f"its start; not starting it again{after_give_up}")  # fmt: skip
                return 1
            say(f"{name} {how} after {lived:.0f} s; starting it again in {delay:.0f} s")
            stopping.wait(delay)
            delay = min(delay * 2, MAX_RESTART_S)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
