"""A recording executor for tests, driven by a plain function (httpx's MockTransport idea).

    calls = []
    ex = FakeExecutor(lambda call: RunResult(call.argv, 0, "ok\\n", ""))
    ex.run(["nvidia-smi"])
    assert ex.calls[0].argv == ("nvidia-smi",)

The handler sees every `run` and `start_detached` as a `Call` and returns what the node would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cloudtrain.executors.base import RunResult


@dataclass(frozen=True)
class Call:
    """One request made of the executor."""

    kind: str  # "run" | "start_detached" | "put"
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


Handler = Callable[[Call], RunResult]


def succeed(call: Call) -> RunResult:
    """The default handler: every command exits 0 with no output."""
    return RunResult(call.argv, 0, "", "")


class FakeExecutor:
    """Records every call in `calls`; `handler` decides each result."""

    _pids = itertools.count(1000)

    def __init__(self, handler: Handler = succeed) -> None:
        self.handler = handler
        self.calls: list[Call] = []
        self.closed = False

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> RunResult:
        call = Call("run", tuple(argv), MappingProxyType(dict(env or {})), cwd)
        self.calls.append(call)
        result = self.handler(call)
        if on_output is not None:
            for line in (result.stdout + result.stderr).splitlines():
                on_output(line)
        return result

    def start_detached(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, job_dir: str
    ) -> int:
        call = Call(
            "start_detached",
            tuple(argv),
            MappingProxyType(dict(env)),
            cwd,
            MappingProxyType({"job_dir": job_dir}),
        )
        self.calls.append(call)
        self.handler(call).check()
        return next(self._pids)

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None:
        extra = MappingProxyType({"local": str(local), "excludes": tuple(excludes)})
        call = Call("put", (str(local), remote), extra=extra)
        self.calls.append(call)
        self.handler(call).check()

    def get(self, remote: str, local: Path) -> bool:
        call = Call("get", (remote, str(local)))
        self.calls.append(call)
        return self.handler(call).ok

    def close(self) -> None:
        self.closed = True
