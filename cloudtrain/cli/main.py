"""``cloudtrain``: the command line. Exit codes are decided here and only here:

    0    ok                         3    a provider/cloud error (capacity, quota, auth), a
    1    the job failed/cancelled;       node command failed, or the cluster stayed busy
         what was checked is not         (another command held its lock past the wait)
         usable (`check`)
    2    bad input (nothing made)   4    the local state file is unusable
                                    5    a bug: an unexpected exception (a crash report is
                                         written, see below)
                                    130  interrupted (Ctrl-C)

A failure is one ``error: …`` line on stderr: cloudtrain's own errors say what to do (a failed
node command adds the tail of its stderr). Any other exception (a bug in cloudtrain, or an SDK
error not mapped at the provider boundary) prints ``error: unexpected <type>: <its first line>
(details: <file>)`` and writes the traceback, the command line (secrets redacted), cloudtrain's
and Python's versions to ``<CLOUDTRAIN_HOME>/crashes/<UTC time>-<pid>.txt`` (folder 0700, file
0600) for a bug report. click's own exits (usage errors, ``--help``, aborts) and Ctrl-C are not
crashes. The cloud SDKs' own log records below ERROR are shown with ``-v`` only.

Importing this module is cheap: commands import the library (and never torch or a cloud SDK)
when they run.
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from cloudtrain import __version__
from cloudtrain.cli.app import App, Interrupted, console
from cloudtrain.errors import (
    BootstrapError,
    CloudtrainError,
    ClusterBusyError,
    CommandError,
    ConfigError,
    JobError,
    NotFoundError,
    ProviderError,
    StateError,
)

EXIT_OK, EXIT_JOB, EXIT_INPUT, EXIT_PROVIDER, EXIT_STATE, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CRASH = 5
#: Files 0600, folders 0700, for the CLI and what it starts (a local job's files too).
PRIVATE_UMASK = 0o077

#: a flag whose value is not written to a crash report
_SECRET_FLAG = re.compile(r"^--?[\w-]*(secret|token|password)[\w-]*$", re.IGNORECASE)
#: what looks like an AWS secret access key (40 characters of base64) or access key id
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"
)
REDACTED = "***"
_ARGV = "cloudtrain.argv"  # the Context.meta key of the command line as given


def exit_code(error: CloudtrainError) -> int:
    if isinstance(error, ConfigError | NotFoundError):
        return EXIT_INPUT
    if isinstance(error, ProviderError | BootstrapError | CommandError | ClusterBusyError):
        return EXIT_PROVIDER
    if isinstance(error, StateError):
        return EXIT_STATE
    if isinstance(error, JobError):
        return EXIT_JOB
    return EXIT_JOB


def redact(argv: Sequence[str]) -> list[str]:
    """`argv` fit for a crash report: the value after (or ``=``-joined to) a flag named
    *secret*, *token* or *password*, and anything that looks like an AWS key, as ``***``."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide_next:
            shown.append(REDACTED)
        elif eq and _SECRET_FLAG.match(flag):
            shown.append(f"{flag}={REDACTED}")
        else:
            shown.append(_SECRET_VALUE.sub(REDACTED, arg))
        hide_next = not hide_next and not eq and bool(_SECRET_FLAG.match(arg))
    return shown


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = _SECRET_VALUE.sub(REDACTED, lines[0]) if lines else ""
    return text if len(text) <= 200 else text[:197] + "..."


def _type_name(exc: BaseException) -> str:
    kind = type(exc)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def crash_report(exc: BaseException, argv: Sequence[str], home: Path) -> Path:
    """Write `exc`'s report to ``home/crashes/<UTC time>-<pid>.txt`` (folder 0700, file 0600,
    never overwritten); its path. Raises `OSError` when it cannot be written."""
    now = datetime.datetime.now(datetime.UTC)
    folder = home / "crashes"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)  # mkdir's mode is masked by the umask, and the folder may be older
    path = folder / f"{now:%Y%m%dT%H%M%SZ}-{os.getpid()}.txt"
    trace = "".join(traceback.format_exception(exc))
    text = (
        f"cloudtrain crash report, {now:%Y-%m-%d %H:%M:%S} UTC\n"
        f"cloudtrain {__version__}, Python {platform.python_version()} "
        f"({sys.executable}), {platform.platform()}\n"
        f"command: {' '.join(redact(argv))}\n\n"
        f"{_SECRET_VALUE.sub(REDACTED, trace)}"
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)
    return path


def report_crash(exc: BaseException, argv: Sequence[str], home: Path | None = None) -> str:
    """The one line to print for an unexpected `exc`, after writing its crash report (under
    `home`, default ``$CLOUDTRAIN_HOME``); never raises."""
    head = f"error: unexpected {_type_name(exc)}"
    first = _first_line(exc)
    head = f"{head}: {first}" if first else head
    try:
        from cloudtrain.state import home as default_home

        path = crash_report(exc, argv, home or default_home())
    except Exception as failed:  # the report is a courtesy; the line is what must come out
        return f"{head} (no crash report: {type(failed).__name__}: {_first_line(failed)})"
    return f"{head} (details: {path})"


def _say(line: str) -> None:
    """`line` on stderr, whole (never wrapped), through the console that shows a node's
    control characters escaped (`cloudtrain.cli.app`)."""
    console(sys.stderr).print(line, markup=False, soft_wrap=True)


class _Lines(logging.Handler):
    """A record's message as Python's last-resort handler shows it (a plain line on stderr, as
    stderr is when it comes), but through the console that escapes control characters."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _say(record.getMessage())
        except Exception:
            self.handleError(record)


class Group(click.Group):
    """Maps cloudtrain's errors to a one-line message and an exit code; anything unexpected
    to one line, a crash report and `EXIT_CRASH`. Its commands are `COMMAND_MODULES`'."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return command_of(cmd_name)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        argv = ["cloudtrain", *args]
        ctx = super().make_context(info_name, args, parent, **extra)
        ctx.meta[_ARGV] = argv
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise  # click's own: --help, usage errors, aborts, ctx.exit
        except CloudtrainError as exc:
            _say(f"error: {exc}")  # it may quote a node: `console` shows it safe
            ctx.exit(exit_code(exc))
        except Interrupted as stopped:  # one line: what it stopped, what keeps running
            _say(stopped.line)
            ctx.exit(EXIT_INTERRUPTED)
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            app = ctx.find_object(App)
            argv = ctx.meta.get(_ARGV) or ["cloudtrain"]
            line = report_crash(exc, argv, app.home if app else None)
            _say(line)
            ctx.exit(EXIT_CRASH)
        finally:
            app = ctx.find_object(App)
            if app is not None:
                app.close()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cloudtrain")
@click.option("-v", "--verbose", count=True, help="More detail (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """Provision GPU clusters, run data-parallel PyTorch jobs on them, tear them down.

    With no cloud account everything runs on the embedded `local` provider.
    """
    from cloudtrain.state import home

    level = (
        logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    )
    # what the cloud SDKs (any logger not cloudtrain's) warn of (a retry, a body they could
    # not read, with its traceback) comes before the one line cloudtrain maps the failure to:
    # shown with -v only
    logging.getLogger().setLevel(level if verbose else logging.ERROR)
    logging.getLogger("cloudtrain").setLevel(logging.NOTSET if verbose else level)
    if verbose or quiet:
        from rich.logging import RichHandler

        handler = RichHandler(console=console(sys.stderr), show_path=False)
        logging.basicConfig(level=level, handlers=[handler], format="%(message)s")
    elif not any(isinstance(h, _Lines) for h in logging.getLogger().handlers):
        logging.getLogger().addHandler(_Lines())  # a warning may quote a node: not raw
    # what cloudtrain writes (state, keys, logs, crash files, local nodes) and what it starts is
    # this user's alone, whatever the shell's umask or the modes of an older CLOUDTRAIN_HOME
    os.umask(PRIVATE_UMASK)
    check_environment()
    ctx.obj = App(home=home())


def check_environment() -> None:
    """Read every ``CLOUDTRAIN_*`` knob the core reads, before any command has an effect: a
    bad value is exit 2 before anything is made, never after (providers check their own when
    they are built, which is also before any cloud call)."""
    from cloudtrain import locks
    from cloudtrain.executors.base import parallelism

    parallelism()
    locks.timeout_s()


#: Every command, by name, and the module that defines it (in its ``COMMANDS``): a command's
#: module is imported only when that command runs (or `--help` lists them all), so `up` does
#: not pay for the dashboard's or the catalog updater's imports.
#: tests/unit/test_cli_surface.py checks this table against the modules' ``COMMANDS``.
COMMAND_MODULES = {
    "up": "clusters", "down": "clusters", "status": "status_cmd", "gpus": "clusters",
    "autostop": "clusters",
    "launch": "jobs", "train": "jobs", "logs": "jobs", "cancel": "jobs",
    "jobs": "watch",
    "check": "check_cmd", "catalog": "catalog_cmd", "cost": "cost_cmd",
    "events": "events_cmd", "metrics": "metrics_cmd", "plot": "metrics_cmd",
    "preflight": "preflight_cmd", "dashboard": "dashboard_cmd", "bootstrap": "bootstrap_cmd",
}  # fmt: skip


def command_of(name: str) -> click.Command | None:
    """The command `name`, its module imported now; None for a name that is none."""
    import importlib

    module = COMMAND_MODULES.get(name)
    if module is None:
        return None
    commands = importlib.import_module(f"cloudtrain.cli.{module}").COMMANDS
    return next((c for c in commands if c.name == name), None)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script."""
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        cli.main(args=args, prog_name="cloudtrain")
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # raised outside a command (Group.invoke reports those)
        _say(report_crash(exc, ["cloudtrain", *args]))
        sys.exit(EXIT_CRASH)
