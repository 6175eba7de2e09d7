"""Managed jobs on the command line: ``jobs watch``, and following or cancelling one.

The recovery itself is `cloudtrain.jobs.managed`; this module starts its watcher, follows a
managed job from the log copies the watcher keeps (so ``logs -f`` goes on across recoveries),
and cancels one so that nothing of it is started again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from cloudtrain.cli.app import App
from cloudtrain.cli.options import job_id as job_id_arg

if TYPE_CHECKING:
    from cloudtrain.jobs.managed import Policy
    from cloudtrain.state import JobRecord

pass_app = click.make_pass_decorator(App)

#: How long `cancel` and `train` wait for a managed job's watcher to end (a teardown).
WATCHER_EXIT_S = 900.0


def start_watching(app: App, job_id: str, policy: Policy) -> None:
    from cloudtrain.jobs import watched

    pid = watched.start_watcher(app.home, job_id)
    down = "; it tears the cluster down at the end" if policy.down else ""
    app.note(
        f"managed: its watcher (pid {pid}) recovers it up to {policy.max_recoveries} time(s){down}"
    )


def restart_watchers(app: App) -> None:
    """Start a watcher for every open managed job that has none (it died, or this machine
    restarted): the next command any user runs puts recovery back on its feet."""
    from cloudtrain.jobs import watched

    for job_id in watched.unwatched(app.state, app.home):
        pid = watched.start_watcher(app.home, job_id)
        app.note(f"the watcher of managed job {job_id} was not running; started it (pid {pid})")


def follow_managed(app: App, job_id: str) -> JobRecord:
    """Stream the job's logs and recoveries until it ends, then wait for its watcher."""
    from cloudtrain.jobs import watched

    rec = watched.follow_copies(
        app.state, app.home, job_id, app.node_line, lambda m: app.note(f"cloudtrain: {m}")
    )
    _wait_for_watcher(app, job_id)
    return rec


def _wait_for_watcher(app: App, job_id: str) -> None:
    """A watcher ends just after its job (after the teardown, with --down)."""
    from cloudtrain.jobs import watched

    began, told = time.monotonic(), False
    while (pid := watched.watcher_pid(app.home, job_id)) is not None:
        waited = time.monotonic() - began
        if waited > WATCHER_EXIT_S:
            app.note(
                f"warning: the watcher of {job_id} (pid {pid}) has not ended; it goes on "
                "in the background"
            )
            return
        if not told and waited > 2:
            app.note(f"waiting for the watcher of {job_id} (pid {pid}) to finish")
            told = True
        time.sleep(0.1)


def logs_managed(app: App, rec: JobRecord, follow: bool) -> JobRecord:
    """`logs` of a managed job: its copies hold every attempt; -f follows across them."""
    if follow and not rec.finished:
        restart_watchers(app)
        return follow_managed(app, rec.id)
    coord = app.coordinator(rec.cluster)
    try:
        return coord.logs(rec.id, app.node_line)
    finally:
        coord.close()


def cancel_managed(app: App, rec: JobRecord) -> JobRecord:
    """Ask first (a watcher mid-recovery then starts nothing), then stop what runs and
    record the job cancelled; its watcher ends (tearing the cluster down with --down)."""
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.jobs import managed, watched

    app.state.update_job(rec.id, detail={"cancel_requested": time.time()})
    coord = app.coordinator(rec.cluster)
    try:
        with app.err.status(f"cancelling {rec.id}"):
            if app.state.nodes(rec.cluster):
                try:
                    coord.stop(rec.id, mark=True)
                except CloudtrainError as exc:
                    app.note(f"warning: could not reach every node of {rec.id}: {exc}")
            if coord.finish(rec.id, "cancelled"):
                app.state.add_event(rec.cluster, "job", f"job {rec.id} cancelled", job_id=rec.id)
    finally:
        coord.close()
    policy = managed.Policy.of(rec)
    if watched.watcher_pid(app.home, rec.id) is not None:
        _wait_for_watcher(app, rec.id)
    elif policy is not None and policy.down and app.state.cluster(rec.cluster) is not None:
        from cloudtrain import api

        api.down(app.state, app.home, rec.cluster, on_event=app.event)
        app.note(f"cluster {rec.cluster} is down")
    return app.state.job(rec.id) or rec


@click.group()
def jobs() -> None:
    """Managed jobs' watchers."""


@jobs.command()
@click.argument("job_id", callback=job_id_arg)
@click.option(
    "--supervise",
    is_flag=True,
    help="Run the watcher as a child, and start it again whenever it dies while the "
    "job is open (what `train --managed` starts in the background).",
)
@pass_app
def watch(app: App, job_id: str, supervise: bool) -> None:
    """Watch JOB_ID and recover it until it ends, in the foreground.

    `train --managed` starts this in the background, under a supervisor that starts it again
    when it dies; run it when both died (the next `status` or `logs` starts them too). A job
    already watched is left to its watcher.
    """
    from cloudtrain.errors import NotFoundError
    from cloudtrain.jobs import managed, watched

    rec = app.state.job(job_id)
    if rec is None:
        raise NotFoundError(f"no job {job_id!r}; `cloudtrain status` lists jobs")
    if managed.Policy.of(rec) is None:
        raise NotFoundError(f"job {job_id} is not a managed job (`train --managed`)")
    if supervise:
        _supervise(app, job_id)
        return
    with watched.watching(app.home, job_id) as mine:
        if not mine:
            pid = watched.watcher_pid(app.home, job_id)
            app.note(f"job {job_id} is watched already (pid {pid})")
            return
        if rec.finished:
            app.note(f"job {job_id} already {rec.status}; nothing to watch")
            return
        app.note(f"{time.strftime('%H:%M:%S')} watching job {job_id}")
        watcher = managed.Watcher(
            app.state,
            app.home,
            app.coordinator,
            on_event=lambda e: app.note(f"{time.strftime('%H:%M:%S')} {e.message}"),
        )
        rec = watcher.run(job_id)
    app.note(f"{time.strftime('%H:%M:%S')} job {job_id} {rec.status}")


def _supervise(app: App, job_id: str) -> None:
    from cloudtrain.jobs import supervisor

    def is_open() -> bool:
        rec = app.state.job(job_id)
        return rec is not None and not rec.finished

    def say(message: str) -> None:
        app.note(f"{time.strftime('%H:%M:%S')} {message}")

    code = supervisor.supervise(app.home, job_id, supervisor.watch_argv(job_id), is_open, say)
    if code:
        raise click.exceptions.Exit(code)


COMMANDS = (jobs,)
