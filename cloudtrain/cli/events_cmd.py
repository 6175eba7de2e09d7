"""`cloudtrain events [NAME] [-f] [--since 12h] [--json]`: the audit trail, from the state.

One line per event, oldest first: the local time (ISO, to the second), the cluster, the job
(``-`` for none), the kind and what happened (created, a create attempt that failed in a zone
with the cloud's code, a bootstrap phase done, a job started or ended, a node preempted or
gone, a recovery, stopped when idle, down). Events outlive their cluster, so a cluster already
down still has its story. ``-f`` polls the state for new events (by id, every `POLL_S`) until
Ctrl-C, which ends it quietly with exit 130.

A message may quote a node or a cloud: its control characters are shown escaped (as in all
the CLI prints: `cloudtrain.cli.app`), and the lines after its first are indented, so no
message can pass for another event.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import TYPE_CHECKING, Any

import click

from cloudtrain.cli.app import App
from cloudtrain.cli.options import SINCE_HELP, parse_since

if TYPE_CHECKING:
    from cloudtrain.state import EventRecord

pass_app = click.make_pass_decorator(App)

#: How often ``-f`` looks for new events, in seconds.
POLL_S = 0.5
_INDENT = "    "


def event_line(event: EventRecord) -> str:
    """``2026-12-03T09:30:05+01:00  exp1  exp1-3  job  job exp1-3 running on 2 node(s)``."""
    when = datetime.datetime.fromtimestamp(event.ts).astimezone().isoformat(timespec="seconds")
    message = event.message.replace("\n", "\n" + _INDENT)
    return f"{when}  {event.cluster}  {event.job_id or '-'}  {event.kind}  {message}"


def event_json(event: EventRecord) -> dict[str, Any]:
    return {"id": event.id, "ts": event.ts, "cluster": event.cluster, "job": event.job_id,
            "kind": event.kind, "message": event.message}  # fmt: skip


def check_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: NAME is a cluster name or a job id, checked before it is looked up."""
    from cloudtrain.errors import ConfigError
    from cloudtrain.spec import JOB_ID_RE, NAME_RE

    if value is None or NAME_RE.fullmatch(value) or JOB_ID_RE.fullmatch(value):
        return value
    raise ConfigError(
        f"NAME {value!r} is neither a cluster name (lowercase letters, digits and '-', starting "
        "with a letter) nor a job id (e.g. 'exp1-3'); `cloudtrain status` lists both"
    )


@click.command()
@click.argument("name", required=False, callback=check_name)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@click.option("--since", "since_text", help=f"Only events from then: {SINCE_HELP}.")
@click.option("--json", "as_json", is_flag=True, help="JSON: a list; with -f, one object per line.")
@pass_app
def events(app: App, name: str | None, follow: bool, since_text: str | None, as_json: bool) -> None:
    """What happened, oldest first: to cluster NAME (and its jobs) or job NAME, else to all,
    clusters already down included."""
    from cloudtrain.errors import NotFoundError

    since = None if since_text is None else parse_since(since_text, time.time())
    state = app.state
    found = state.event_log(name, since=since)
    unknown = name is not None and state.cluster(name) is None and state.job(name) is None
    if unknown and not found and not follow:
        raise NotFoundError(
            f"no cluster or job named {name!r} has events; `cloudtrain events` lists all"
        )
    if as_json and not follow:
        click.echo(json.dumps([event_json(e) for e in found], indent=2))
        return

    def show(event: EventRecord) -> None:
        if as_json:  # JSON escapes every control character itself
            click.echo(json.dumps(event_json(event)))
        else:
            app.out.print(event_line(event), markup=False, soft_wrap=True)

    for event in found:
        show(event)
    if not follow:
        if not found:
            app.note("no events" + (f" since {since_text}" if since_text else ""))
        return
    last = found[-1].id if found else 0
    try:
        while True:
            time.sleep(POLL_S)
            for event in state.event_log(name, after=last, since=since):
                show(event)
                last = event.id
    except KeyboardInterrupt:  # the end of following: quietly, with Ctrl-C's usual status
        raise SystemExit(130) from None


COMMANDS = (events,)
