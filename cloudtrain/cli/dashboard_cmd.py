"""`cloudtrain dashboard`: the page of clusters, costs, jobs' curves and events
(`cloudtrain.dashboard`), served on 127.0.0.1 until Ctrl-C."""

from __future__ import annotations

import click

from cloudtrain.cli.app import App

pass_app = click.make_pass_decorator(App)


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="The port on 127.0.0.1 (default: a free one).")  # fmt: skip
@click.option("--no-open", is_flag=True, help="Print the URL; do not open a browser.")
@pass_app
def dashboard(app: App, port: int, no_open: bool) -> None:
    """Serve a page of the clusters, their cost so far, the jobs with live curves and the
    events, on this machine only (a token in the URL), until Ctrl-C."""
    from cloudtrain.dashboard import Dashboard
    from cloudtrain.errors import ConfigError

    def pull(job_id: str) -> None:  # in the dashboard's own thread: its own state connection
        mine = App(home=app.home)
        try:
            rec = mine.state.job(job_id)
            if rec is not None and mine.state.nodes(rec.cluster):
                coord = mine.coordinator(rec.cluster)
                try:
                    coord.pull_metrics(rec)
                finally:
                    coord.close()
        finally:
            mine.close()

    try:
        board = Dashboard(app.home, port, pull=pull)
    except OSError as exc:
        raise ConfigError(
            f"--port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror})"
        ) from None
    click.echo(board.url, nl=True)  # stdout: a script may read it
    app.note("the dashboard serves this machine only; Ctrl-C stops it")
    if not no_open:
        import webbrowser

        webbrowser.open(board.url)
    try:
        board.serve()
    except KeyboardInterrupt:
        app.note("dashboard stopped")
    finally:
        board.close()


COMMANDS = (dashboard,)
