"""torchrun whose workers are forked from its agent: the agent imported torch, and so have they.

Each worker of a plain torchrun job is a new interpreter that imports torch again (about 1.7 s of
CPU on a small machine, more with CUDA's libraries), after its agent already did. Run as::

    python -m cloudtrain.jobs.elastic --start-method fork [torchrun's flags] script.py ARGS

this is torchrun — its own parser, `LaunchConfig`, `elastic_launch`, rendezvous, restarts, env
contract (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` …), error files and failure
report — with a function entrypoint, `run_target`, which torch elastic starts with the
``fork`` start method. The worker runs the script as ``python -u script.py ARGS`` would (or
``python -u -m module ARGS``): ``__name__ == "__main__"``, ``sys.argv``, an absolute
``__file__``, the script's folder first on ``sys.path`` (a sibling module imports), Python's
default signal handlers, line-buffered output, a traceback on stderr for an uncaught exception
(exit 1), ``SystemExit``'s code, and the script's own ``atexit`` handlers (not the agent's).

While it meets the other agents at the rendezvous, the agent imports on a thread what every
worker would import next (`PRELOAD`: ``torch._dynamo``, which DDP's constructor imports, about
1.5 s of CPU); each fork waits for that thread, so a worker never inherits a module half
imported. The script's own imports are not preloaded: a module imported in the agent runs
before the env contract is set, and may start threads that a fork would not carry.

The coordinator starts it through `cloudtrain.jobs.warm`, whose node server forks this agent
with torch already imported (or which runs it in its own process when there is none).

Forking is safe only before CUDA is initialised in the agent (`import torch` does not
initialise it): if it was, the job falls back to ``spawn`` with a warning. Asking CUDA's device
count is enough to spoil every fork (torch's "Cannot re-initialize CUDA in forked subprocess"),
and torch's own ``LaunchConfig`` asks ``torch.cuda.is_available()`` (seen on an H200 with torch
2.11): the agent asks it through NVML instead (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, which torch
offers for this), and each worker gets the variable back as the job had it.
``--start-method spawn``, a command (``--no-python``) and torchrun's own
``--run-path`` are handed to torchrun unchanged.
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import os
import runpy
import signal
import sys
import threading
import traceback
import types
import uuid
from collections.abc import Sequence
from importlib.machinery import SourceFileLoader
from typing import Any

from cloudtrain.jobs import launched

#: The start methods a job may ask for (`JobSpec.start_method`): fork is the default.
START_METHODS = ("fork", "spawn")

#: What a forked worker would import anyway, imported by its agent during the rendezvous:
#: DDP's constructor imports ``torch._dynamo`` (about 1.5 s of CPU; it touches no device).
PRELOAD = ("torch._dynamo",)

#: torch's switch that makes ``torch.cuda.is_available()`` ask NVML, which leaves fork usable.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
#: The job's own value of `NVML_CHECK` (None: unset), which the forked workers get back.
_job_nvml_check: str | None = None


def run_target(module: bool, target: str, *args: str) -> None:
    """A forked worker's body: `target` (a script's path, or a module's name when `module`)
    with `args`, as the interpreter would run it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not the agent's handlers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)  # as `python -u` (the log follows it live)
    atexit._clear()  # the agent's exit handlers are not this worker's
    _restore_nvml_check()
    reseed()
    launched.guard_imports()  # `import horovod.torch` here would be a world of one: refused
    sys.argv = [target, *args]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            run_script(target)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()  # the script's own traceback in the job's log, as Python prints
        raise
    finally:
        atexit._run_exitfuncs()  # the fork's child ends with os._exit, which runs none


def _fork_safe_cuda_checks() -> None:
    """From now on this agent's ``torch.cuda.is_available()`` asks NVML, not the CUDA runtime,
    which would spoil every fork (`_restore_nvml_check` undoes it in each worker)."""
    global _job_nvml_check
    _job_nvml_check = os.environ.get(NVML_CHECK)
    os.environ[NVML_CHECK] = "1"


def _restore_nvml_check() -> None:
    if _job_nvml_check is None:
        os.environ.pop(NVML_CHECK, None)
    else:
        os.environ[NVML_CHECK] = _job_nvml_check


def reseed() -> None:
    """Give this fork numpy's global random state of its own, from the OS, as a new
    interpreter has: the agent's preload imports ``numpy.random``, and every fork would draw
    the same numbers (Python's `random` is reseeded by `os.fork` itself; torch's default
    generator starts from the same seed in every process anyway)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def run_script(target: str) -> None:
    """`target` as ``python target`` runs it: a new ``__main__`` module with the absolute
    ``__file__``, ``sys.argv[0]`` as given, the script's folder first on ``sys.path``."""
    path = os.path.abspath(target)
    sys.path[0] = os.path.dirname(path)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __builtins__=builtins,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", path),
    )
    sys.modules["__main__"] = main
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)


def _preload(modules: Sequence[str]) -> None:
    """Import `modules` on a thread of their own while the agent meets the others at the
    rendezvous; every fork of this process waits for it first, so no worker inherits a module
    half imported. A module that fails to import is left for the worker, whose own import then
    fails in its log."""

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:  # even SystemExit: the worker meets it again, and reports it
                continue

    def wait() -> None:  # a fork made by the preload itself (an import's subprocess) goes on
        if threading.current_thread() is not thread:
            thread.join()

    thread = threading.Thread(target=load, name="cloudtrain-preload", daemon=True)
    thread.start()
    os.register_at_fork(before=wait)


def _fork_args(cmd_args: Sequence[str]) -> tuple[bool, str, list[str]]:
    """torchrun's ``[-u, (-m), target, args…]`` as (module, target, args)."""
    rest = list(cmd_args)
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    module = rest[:1] == ["-m"]
    if module:
        rest = rest[1:]
    return module, rest[0], rest[1:]


def launch(argv: Sequence[str]) -> Any:
    """Parse torchrun's flags from `argv` and run the job: forked workers when the flags ask
    for ``fork`` and a Python entrypoint, else torchrun as it is. Returns what torch elastic
    returns (each rank's return value)."""
    import torch
    from torch.distributed import run

    torchrun: Any = run  # untyped: its functions take and give argparse's Namespace
    cuda: Any = torch.cuda
    args = torchrun.parse_args(list(argv))
    if args.start_method == "fork" and cuda.is_initialized():
        print(
            "cloudtrain: CUDA was initialised before the workers started; starting them "
            "with spawn instead of fork",
            file=sys.stderr,
        )
        args.start_method = "spawn"
    if args.start_method != "fork" or args.no_python or args.run_path:
        return torchrun.run(args)
    _fork_safe_cuda_checks()  # before torch's LaunchConfig asks is_available()
    _rendezvous_defaults(torchrun, args)
    config, _, cmd_args = torchrun.config_from_args(args)
    from torch.distributed.launcher.api import elastic_launch

    module, target, rest = _fork_args(cmd_args)
    _preload(PRELOAD)
    return elastic_launch(config=config, entrypoint=run_target)(module, target, *rest)


def _rendezvous_defaults(torchrun: Any, args: Any) -> None:
    """What torchrun's `run` decides before it builds its config, which a fork job builds
    itself: ``--standalone`` (and a one-node job with no rendezvous named) is a c10d
    rendezvous on a free local port, with an id of its own; the static backend's default
    port is 29500."""
    single = args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None
    if args.standalone or (single and torchrun.parse_min_max_nnodes(args.nnodes)[1] == 1):
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


def main(argv: Sequence[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        record(launch)(sys.argv[1:] if argv is None else argv)
    except SignalException as stopped:
        # A cancel, or a recovery stopping the nodes left, sends SIGTERM: torch elastic has
        # stopped the workers and raises through its own frames, thirty lines that tell the
        # user nothing. One line, and the status a shell gives a process the signal ended
        # (128 + N), which names it (`cloudtrain.jobs.torchrun.Failure.killed_by`).
        number = int(stopped.sigval)
        name = stopped.sigval.name if isinstance(stopped.sigval, signal.Signals) else number
        print(f"cloudtrain: the launcher got {name}; its workers are stopped", file=sys.stderr)
        raise Stopped(128 + number) from None


class Stopped(SystemExit):
    """The launcher was stopped by a signal; its code is the status a shell gives a process the
    signal ended (128 + N)."""


if __name__ == "__main__":
    main()
