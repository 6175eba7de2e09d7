"""`cloudtrain dashboard`: the page of clusters, costs, jobs' curves and events
(`cloudtrain.dashboard`), served on 127.0.0.1 until Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import click

from cloudtrain.cli.app import App

if TYPE_CHECKING:
    from cloudtrain.dashboard import Dashboard

pass_app = click.make_pass_decorator(App)


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="The port on 127.0.0.1 (default: a free one).")  # fmt: skip
@click.option("--no-open", is_flag=True, help="Print the link; do not open a browser.")
@pass_app
def dashboard(app: App, port: int, no_open: bool) -> None:
    """Serve a page of the clusters, their cost so far, the jobs with live curves and the
    events, on this machine only, until Ctrl-C. It prints a one-time link (Enter prints
    another); the browser it opens gets its own."""
    from cloudtrain.dashboard import LOGIN_S, Dashboard
    from cloudtrain.errors import ConfigError

    def poll(job_id: str) -> None:  # in the dashboard's own thread: its own state connection
        mine = App(home=app.home)
        try:
            rec = mine.state.job(job_id)
            if rec is not None and mine.state.nodes(rec.cluster):
                coord = mine.coordinator(rec.cluster)
                try:
                    coord.pull_metrics(rec)
                    coord.refresh(rec.id)  # its end, as its nodes saw it
                finally:
                    coord.close()
        finally:
            mine.close()

    try:
        board = Dashboard(app.home, port, poll=poll)
    except OSError as exc:
        raise ConfigError(
            f"--port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror})"
        ) from None
    click.echo(board.login_url(), nl=True)  # stdout: a script may read it
    how = f"a link works once, for {LOGIN_S / 60:g} minutes: press Enter for a new one"
    how += "; Ctrl-C stops it"
    app.note(f"the dashboard serves this machine only; {how}")
    if not no_open:  # a link of its own: what a browser is started with, `ps` shows to all
        import webbrowser

        webbrowser.open(board.login_url())
    # in the background a read of the terminal fails (EIO) instead of stopping the dashboard
    signal.signal(signal.SIGTTIN, signal.SIG_IGN)
    threading.Thread(target=_links_on_enter, args=(board,), daemon=True).start()
    try:
        board.serve()
    except KeyboardInterrupt:
        app.note("dashboard stopped")
    finally:
        board.close()


def _links_on_enter(board: Dashboard) -> None:
    """A new one-time link on stdout for each line read from stdin, until it ends (closed, or
    a terminal this process may not read from: in the background, the read fails). Read from
    the descriptor, not `sys.stdin`, whose lock this thread would hold at the exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no stdin at all
        fd = sys.stdin.fileno()
        while read := os.read(fd, 4096):
            for _ in range(read.count(b"\n")):
                click.echo(board.login_url(), nl=True)


COMMANDS = (dashboard,)
