"""A spawned torchrun worker's body: the guard of `cloudtrain.jobs.launched`, then the script.
Run by torchrun (``--start-method spawn``) as::

    python -u -m cloudtrain.jobs.spawned script.py ARGS
    python -u -m cloudtrain.jobs.spawned --module package.module ARGS

A forked worker installs the guard in `cloudtrain.jobs.elastic.run_target`; a spawned one is a
new interpreter, which this module starts with it before it runs the script as ``python -u
script.py ARGS`` (or ``python -u -m module ARGS``) would: ``__name__ == "__main__"``,
``sys.argv``, an absolute ``__file__``, the script's folder first on ``sys.path``, the
interpreter's own traceback and exit code. Nothing else of the interpreter changes: a site's or
user's ``sitecustomize`` and their ``atexit`` handlers stay; the cost is this module's import
(the standard library's, no torch).
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from cloudtrain.jobs import elastic, launched


def main(argv: Sequence[str] | None = None) -> None:
    words = list(sys.argv[1:] if argv is None else argv)
    module = words[:1] in (["-m"], ["--module"])
    if module:
        words = words[1:]
    if not words:
        raise SystemExit("usage: python -m cloudtrain.jobs.spawned [--module] TARGET [ARGS...]")
    launched.guard_imports()  # `import horovod.torch` here would be a world of one: refused
    target, args = words[0], words[1:]
    sys.argv = [target, *args]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        elastic.run_script(target)


if __name__ == "__main__":
    main()
