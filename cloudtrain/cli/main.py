"""``cloudtrain``: the command line. Exit codes are decided here and only here:

    0    ok                         3    a provider/cloud error (capacity, quota, auth) or a
    1    the job failed/cancelled        node command failed
    2    bad input (nothing made)   4    the local state file is unusable
                                    130  interrupted (Ctrl-C)

Importing this module is cheap: commands import the library (and never torch or a cloud SDK)
when they run.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import click

from cloudtrain import __version__
from cloudtrain.cli.app import App
from cloudtrain.errors import (
    BootstrapError,
    CloudtrainError,
    CommandError,
    ConfigError,
    JobError,
    NotFoundError,
    ProviderError,
    StateError,
)

EXIT_OK, EXIT_JOB, EXIT_INPUT, EXIT_PROVIDER, EXIT_STATE, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130


def exit_code(error: CloudtrainError) -> int:
    if isinstance(error, ConfigError | NotFoundError):
        return EXIT_INPUT
    if isinstance(error, ProviderError | BootstrapError | CommandError):
        return EXIT_PROVIDER
    if isinstance(error, StateError):
        return EXIT_STATE
    if isinstance(error, JobError):
        return EXIT_JOB
    return EXIT_JOB


class Group(click.Group):
    """Maps cloudtrain's errors to a one-line message and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CloudtrainError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exit_code(exc))
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
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
    if verbose or quiet:
        from rich.logging import RichHandler

        logging.basicConfig(
            level=level, handlers=[RichHandler(show_path=False)], format="%(message)s"
        )
    ctx.obj = App(home=home())


def _register() -> None:
    from cloudtrain.cli import bootstrap_cmd, clusters, jobs

    for command in (*clusters.COMMANDS, *jobs.COMMANDS, *bootstrap_cmd.COMMANDS):
        cli.add_command(command)


_register()


def main(argv: Sequence[str] | None = None) -> None:
    """The console script."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="cloudtrain")
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
