"""Executors run commands on one node: `local` (subprocesses), `fake` (records calls), and
later `ssh`. See `cloudtrain.executors.base` for the interface."""

from cloudtrain.executors.base import Executor, RunResult, fan_out

__all__ = ["Executor", "RunResult", "fan_out"]
