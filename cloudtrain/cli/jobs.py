"""Job commands: train, launch, logs, cancel.

Ctrl-C while `train` follows a job stops following and leaves the job running on its nodes
(it is detached from this process); the command says so in one line, with how to follow it
again and how to stop it, and exits 130. Pressing Ctrl-C again exits at once; cancelling is
always explicit (`cloudtrain cancel JOB`). Ctrl-C while the job is still starting stops the
ranks already started (one line says that too). The nodes' processes never see the terminal's
Ctrl-C (`cloudtrain.executors.local`), so no traceback of theirs reaches it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cloudtrain.cli.app import App, Interrupted
from cloudtrain.cli.clusters import bring_up, cluster_options, load_task
from cloudtrain.cli.options import cluster_name
from cloudtrain.cli.options import job_id as job_id_arg

if TYPE_CHECKING:
    from cloudtrain.executors.base import Executor
    from cloudtrain.jobs.attempts import JobSpec
    from cloudtrain.jobs.coordinator import Coordinator
    from cloudtrain.jobs.managed import Policy
    from cloudtrain.jobs.staging import Stager
    from cloudtrain.spec import TaskSpec
    from cloudtrain.state import JobRecord

pass_app = click.make_pass_decorator(App)
TASK_SUFFIXES = (".yaml", ".yml")


def _envs(pairs: tuple[str, ...]) -> dict[str, str]:
    from cloudtrain.errors import ConfigError
    from cloudtrain.spec import validate_env_name

    envs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair!r}: write NAME=VALUE")
        envs[validate_env_name(key, f"--env {pair!r}")] = value
    return envs


def job_from_task(task: TaskSpec, **options: Any) -> JobSpec:
    from cloudtrain.errors import ConfigError
    from cloudtrain.jobs.attempts import JobSpec

    if not task.run:
        raise ConfigError(
            "the task file has no `run:` to train with (e.g. run: train.py --epochs 3)"
        )
    return JobSpec(
        entrypoint=tuple(shlex.split(task.run)),
        workdir=task.workdir,
        setup=task.setup,
        envs={**task.envs, **options["envs"]},
        nproc_per_node=options["nproc_per_node"],
        max_restarts=options["max_restarts"],
        name=task.cluster.name,
        resume_from=options.get("resume_from"),
        checkpoint_url=task.checkpoint,
        checkpoint_keep=task.checkpoint_keep,
        min_nodes=task.min_nodes,
        **_framework(options, task.runtime, task.strategy),
    )


def job_from_script(
    script: Path, args: tuple[str, ...], workdir: Path | None, **options: Any
) -> JobSpec:
    from cloudtrain.errors import ConfigError
    from cloudtrain.jobs.attempts import JobSpec

    if not script.is_file():
        raise ConfigError(f"script {str(script)!r} does not exist (or is not a file)")
    script = script.resolve()
    root = (workdir or script.parent).resolve()
    if workdir is None and root in (Path.home().resolve(), Path("/")):
        raise ConfigError(
            f"script {str(script)!r} is in {root}: its folder is what is copied to every node, "
            "and that one holds far more than a project; pass --workdir with the project's folder"
        )
    if not script.is_relative_to(root):
        raise ConfigError(f"script {str(script)!r} is not inside --workdir {str(root)!r}")
    return JobSpec(
        entrypoint=(script.relative_to(root).as_posix(), *args),
        workdir=root,
        envs=options["envs"],
        nproc_per_node=options["nproc_per_node"],
        max_restarts=options["max_restarts"],
        name=script.stem,
        resume_from=options.get("resume_from"),
        **_framework(options),
    )


def _framework(
    options: dict[str, Any], runtime: str = "torch", strategy: str | None = None
) -> dict[str, Any]:
    """The job's runtime and strategy: the flags over the task file's; checked together."""
    from cloudtrain.errors import ConfigError
    from cloudtrain.jobs.elastic import START_METHODS
    from cloudtrain.spec import SpecError
    from cloudtrain.spec.frameworks import validate_runtime, validate_strategy

    try:
        runtime = validate_runtime(options.get("runtime") or runtime, "--runtime")
        strategy = options.get("strategy") or strategy
        if strategy is not None:
            strategy = validate_strategy(strategy, runtime, "--strategy")
    except SpecError as exc:
        raise ConfigError(str(exc)) from exc
    from cloudtrain.jobs import runtimes

    elastic = runtimes.get(runtime).elastic  # torchrun's flags
    if not elastic and options.get("max_restarts"):
        raise ConfigError(
            f"--max-restarts is torchrun's and needs runtime torch, not {runtime!r}; "
            "--managed recovers any runtime's job"
        )
    start = options.get("start_method")
    if start is not None and start not in START_METHODS:
        raise ConfigError(
            f"--start-method {start!r} is not a start method; allowed: {', '.join(START_METHODS)}"
        )
    if start is not None and not elastic:
        raise ConfigError(f"--start-method is for runtime torch, not {runtime!r}")
    return {"runtime": runtime, "strategy": strategy, "start_method": start or START_METHODS[0]}


#: A workdir larger than this gets a warning before it is copied to every node.
SYNC_WARN_BYTES = 200_000_000


def show_sync_size(app: App, workdir: Path) -> None:
    """Say what the sync leaves out for holding credentials, what it copies to each node, and
    warn when that is large (data or outputs that an ignore file should keep home)."""
    from cloudtrain.executors.base import IGNORE_FILES, left_out, sync_size

    secrets = left_out(workdir)
    if secrets:  # what holds credentials never leaves this machine: say so, by name
        shown = ", ".join(secrets[:40]) + (f" and {len(secrets) - 40} more" if secrets[40:] else "")
        app.note(f"left out of the sync (credentials stay on this machine): {shown}")
    size = sync_size(workdir)
    app.note(f"syncing {workdir}: {size} to each node")
    if size.bytes > SYNC_WARN_BYTES:
        app.note(
            f"warning: the workdir holds more than {SYNC_WARN_BYTES // 1_000_000} MB; name "
            f"what the job does not need (data, outputs) in {' or '.join(IGNORE_FILES)}"
        )


def run_job(
    app: App,
    coord: Coordinator,
    cluster: str,
    job: JobSpec,
    detach: bool,
    policy: Policy | None = None,
) -> JobRecord:
    """Submit, then follow until the end (unless `detach`); a managed job (`policy`) gets its
    watcher first, and is followed across its recoveries. Ctrl-C while following leaves the
    job running and exits 130 after saying how to find it again."""
    from cloudtrain.jobs import runtimes
    from cloudtrain.jobs.torchrun import entrypoint_args

    # before a word of progress: it costs nothing
    runtimes.get(job.runtime).check(job, entrypoint_args(job.entrypoint))
    if job.resume_from:  # before a word of progress: bad input costs nothing
        from cloudtrain.jobs import checkpoints

        checkpoints.Kept(app.home, job.resume_from).required(
            checkpoints.bucket_of(job.checkpoint_url)
        )
    if job.workdir is not None:
        show_sync_size(app, job.workdir)
    before = next((j.id for j in app.state.jobs(cluster)), None)
    try:
        rec = coord.submit(
            cluster, job, on_line=app.node_line, managed=policy.to_dict() if policy else None
        )
    except KeyboardInterrupt:  # `submit` stopped what it had started
        app.stop_node_lines()
        newest = next((j.id for j in app.state.jobs(cluster)), None)
        what = f"job {newest}" if newest not in (None, before) else f"the job on {cluster}"
        raise Interrupted(
            f"stopped starting {what}: what had started was stopped, nothing of it runs"
        ) from None
    app.note(f"job {rec.id} running on {rec.num_nodes} node(s) × {rec.nproc_per_node} process(es)")
    if policy is not None:
        from cloudtrain.cli.watch import start_watching

        start_watching(app, rec.id, policy)
    if detach:
        app.note(
            f"detached; follow it with `cloudtrain logs {rec.id} -f`, "
            f"stop it with `cloudtrain cancel {rec.id}`"
        )
        return rec
    from cloudtrain.cli.live import following

    try:
        with following(app, rec.id, live=app.live):
            if policy is not None:
                from cloudtrain.cli.watch import follow_managed

                rec = follow_managed(app, rec.id)
            else:
                rec = coord.follow(rec.id, app.node_line)
    except KeyboardInterrupt:
        app.stop_node_lines()
        watched = " (its watcher keeps recovering it)" if policy is not None else ""
        raise Interrupted(
            f"stopped following job {rec.id}; it keeps running on its nodes{watched}: "
            f"`cloudtrain logs {rec.id} -f` follows it again, `cloudtrain cancel {rec.id}` "
            "stops it"
        ) from None
    tail = rec.detail.get("log_tail")
    if rec.status == "failed" and tail:
        app.note(f"last lines of node {rec.detail.get('failed_node')}:\n{tail.rstrip()}")
    from cloudtrain.jobs.checkpoints import Kept

    kept = Kept(app.home, rec.id).newest()
    if kept is not None:
        app.note(f"its newest checkpoint is kept in {kept}: `--resume-from {rec.id}` starts "
                 "a job from it, on any cluster")  # fmt: skip
    app.note(f"job {rec.id} {rec.status}")
    return coord.raise_for_status(rec)


#: The job's own flags (the rest shape the cluster).
JOB_FLAGS = (
    "nproc_per_node", "max_restarts", "envs", "resume_from", "managed", "max_recoveries",
    "retry_on_failure", "runtime", "strategy", "start_method",
)  # fmt: skip


def policy_from(options: dict[str, Any], down: bool, task: TaskSpec | None = None) -> Policy | None:
    """The managed job's policy the flags (over the task file's fields) ask for; None: not
    managed. The flags that only a managed job takes are refused without --managed."""
    from cloudtrain.errors import ConfigError
    from cloudtrain.jobs.managed import DEFAULT_MAX_RECOVERIES, Policy

    managed = options.pop("managed") or bool(task and task.managed)
    max_recoveries = options.pop("max_recoveries")
    if max_recoveries is None and task is not None:
        max_recoveries = task.max_recoveries
    retry = options.pop("retry_on_failure") or bool(task and task.retry_on_failure)
    if not managed:
        if max_recoveries is not None or retry:
            flag = "--max-recoveries" if max_recoveries is not None else "--retry-on-failure"
            raise ConfigError(f"{flag} is for a managed job: add --managed")
        return None
    if max_recoveries is None:
        max_recoveries = DEFAULT_MAX_RECOVERIES
    return Policy(max_recoveries=max_recoveries, retry_on_failure=retry, down=down)


def _no_live(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_object(App).live = False  # type: ignore[union-attr]


def job_options(fn: Any) -> Any:
    options = [
        click.option(
            "--nproc-per-node",
            type=click.IntRange(min=1),
            help="Processes per node (default: GPUs per node, 1 on CPU; tensorflow: 1).",
        ),
        click.option(
            "--runtime",
            metavar="torch|tensorflow|horovod",
            help="What starts the processes (default: the task's, else torch): torchrun, "
            "TensorFlow workers with TF_CONFIG, or Horovod workers.",
        ),
        click.option(
            "--start-method",
            metavar="fork|spawn",
            help="How a torch job's workers start on each node: fork (the default: from the "
            "agent, which imported torch already) or spawn (new interpreters, as torchrun).",
        ),
        click.option(
            "--strategy",
            metavar="ddp|fsdp",
            help="A torch job's strategy, which the script reads with runtime.strategy(): "
            "ddp (replicas, the default) or fsdp (the model sharded over the ranks).",
        ),
        click.option(
            "--max-restarts",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="torchrun restarts of the worker group before the job fails.",
        ),
        click.option(
            "--env",
            "envs",
            multiple=True,
            metavar="NAME=VALUE",
            help="Environment for the job (repeatable).",
        ),
        click.option(
            "--resume-from",
            metavar="JOB_ID",
            callback=lambda ctx, param, value: value and job_id_arg(ctx, param, value),
            help="Start from the newest checkpoint kept of that job (on any cluster, also "
            "one since torn down): every node gets it first.",
        ),
        click.option(
            "--managed",
            is_flag=True,
            help="Recover the job when a node is lost (preempted, gone, silent): a watcher "
            "on this machine replaces the node and restarts from the newest checkpoint.",
        ),
        click.option(
            "--max-recoveries",
            type=click.IntRange(min=0),
            help="How many times a managed job is recovered (default 3).",
        ),
        click.option(
            "--retry-on-failure",
            is_flag=True,
            help="Recover a managed job also when the script itself exits non-zero.",
        ),
        click.option("--detach", "-d", is_flag=True, help="Return once the job runs."),
        click.option(
            "--no-live",
            is_flag=True,
            expose_value=False,
            callback=_no_live,
            help="No progress panel (step, metrics, ETA, nodes) under the logs.",
        ),
        click.option(
            "--down",
            is_flag=True,
            help="Tear the cluster down when the job ends, whatever its outcome.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _teardown(app: App, cluster: str) -> None:
    from cloudtrain import api

    with app.err.status(f"tearing down {cluster}"):
        api.down(app.state, app.home, cluster, on_event=app.event)
    app.note(f"cluster {cluster} is down")


def _train_and_maybe_down(
    app: App, cluster: str, job: JobSpec, detach: bool, down: bool, policy: Policy | None
) -> None:
    from cloudtrain.errors import ConfigError, NotFoundError

    if policy is not None and policy.down:
        down = False  # the watcher tears it down when the job ends, detached or not
    if detach and down:
        raise ConfigError(
            "--detach and --down together would tear the cluster down under the "
            "running job; use one of them, or add --managed: its watcher tears the cluster "
            "down when the job ends"
        )
    from cloudtrain import autostop
    from cloudtrain.reconcile import reconcile

    record = app.state.cluster(cluster)
    if record is not None and autostop.may_have_stopped(app.state, record):  # meanwhile?
        reconcile(app.state, app.home, [record], app.note, others=False)
        record = app.state.cluster(cluster)
    if record is None:
        raise NotFoundError(
            f"no cluster named {cluster!r}; `cloudtrain up --name {cluster}` "
            "makes one, `cloudtrain status` lists them"
        )
    ends_at = record.spec.limits.ends_at
    if ends_at is not None:  # the cluster goes then, its job with it
        import time

        from cloudtrain.cli.render import span

        app.note(f"warning: cluster {cluster!r} ends in {span(max(0, ends_at - time.time()))} "
                 f"(its {record.spec.limits.ends_why}, set at `up`); a job still running then "
                 "is stopped with it (checkpoints kept in a bucket survive it)")  # fmt: skip
    coord = app.coordinator(cluster)
    try:
        run_job(app, coord, cluster, job, detach, policy)
    except Interrupted as stopped:
        if down:  # the same one line says it
            stopped.line += f"; cluster {cluster} stays up (`cloudtrain down {cluster}`)"
        raise
    except KeyboardInterrupt:  # pressed again while it wound down: exit at once, as it is
        raise
    except BaseException:
        if down:
            _teardown(app, cluster)
        raise
    finally:
        coord.close()
    if down:
        _teardown(app, cluster)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--cluster",
    "-c",
    callback=cluster_name,
    help="The cluster to run on (default: the task file's name).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Folder synced to every node (default: the script's folder).",
)
@click.option(
    "--nodes",
    metavar="N|MIN:MAX",
    help="Run on N of the cluster's nodes (default: all), or elastic: MIN:MAX goes on while "
    "MIN of its MAX nodes are left.",
)
@job_options
@click.argument("target", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@pass_app
def train(
    app: App,
    /,
    cluster: str | None,
    workdir: Path | None,
    nodes: str | None,
    target: Path,
    args: tuple[str, ...],
    detach: bool,
    down: bool,
    **options: Any,
) -> None:
    """Run TARGET on every node of a cluster with torchrun and stream the logs.

    TARGET is a script (its arguments after `--`) or a task file whose `run:` says what to run.
    """
    from cloudtrain.errors import ConfigError

    options["envs"] = _envs(options["envs"])
    if target.suffix in TASK_SUFFIXES:
        if args:
            raise ConfigError("arguments after a task file are not used; put them in its `run:`")
        task = load_task(target)
        policy = policy_from(options, down, task)
        job = job_from_task(task, **options)
        cluster = cluster or task.cluster.name
    else:
        policy = policy_from(options, down)
        job = job_from_script(target, args, workdir, **options)
    if nodes is not None:
        import dataclasses

        from cloudtrain.spec import parse_nodes

        low, high = parse_nodes(nodes)
        job = dataclasses.replace(job, num_nodes=high, min_nodes=low)
    if cluster is None:
        raise ConfigError("which cluster? pass --cluster/-c NAME (`cloudtrain status` lists them)")
    _train_and_maybe_down(app, cluster, job, detach, down, policy)


@click.command()
@click.argument("task_file", type=click.Path(path_type=Path))
@cluster_options
@job_options
@pass_app
def launch(app: App, /, task_file: Path, detach: bool, down: bool, **flags: Any) -> None:
    """Bring up TASK_FILE's cluster (or reuse it), run its job, and with --down tear it down."""
    options = {k: flags.pop(k) for k in JOB_FLAGS}
    options["envs"] = _envs(options["envs"])
    task = load_task(task_file, **flags)
    policy = policy_from(options, down, task)
    job = job_from_task(task, **options)  # checked before anything is created
    stager = _stager(app, task.cluster.name, job)
    try:
        bring_up(app, task, dry_run=False, max_price=flags.get("max_price"),
                 preflight=not flags.get("no_preflight"), on_event=stager.tap,
                 before_unlock=stager.join)  # fmt: skip
    finally:
        stager.join()  # when `up` never took the lock
    _train_and_maybe_down(app, task.cluster.name, job, detach, down, policy)


def _stager(app: App, cluster: str, job: JobSpec) -> Stager:
    """Sends `job`'s workdir and setup to each node of `cluster` while its bootstrap runs
    (`cloudtrain.jobs.staging`)."""
    from cloudtrain import api
    from cloudtrain.jobs.staging import Stager
    from cloudtrain.model import NodeInfo
    from cloudtrain.provision.provider import Provider

    providers: list[Provider] = []  # built once, by the first node staged

    def node(index: int) -> NodeInfo | None:
        record = app.state.cluster(cluster)
        if record is not None and not providers:
            providers.append(api.provider_for(record.spec, app.home))
        if not providers:
            return None
        return next((n for n in app.state.nodes(cluster) if n.index == index), None)

    def executor(node: NodeInfo) -> Executor:
        return providers[0].executor(node)

    return Stager(job, node, executor, app.event, app.node_line)


@click.command()
@click.argument("job_id", callback=job_id_arg)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the job ends.")
@pass_app
def logs(app: App, job_id: str, follow: bool) -> None:
    """Print a job's logs from every node (again, or live with -f)."""
    from cloudtrain.errors import NotFoundError

    rec = app.state.job(job_id)
    if rec is None:
        raise NotFoundError(f"no job {job_id!r}; `cloudtrain status` lists jobs")
    if rec.detail.get("managed"):
        from cloudtrain.cli.watch import logs_managed

        rec = logs_managed(app, rec, follow)
        app.note(f"job {rec.id} {rec.status}")
        return
    coord = app.coordinator(rec.cluster)
    try:
        rec = coord.logs(job_id, app.node_line, follow=follow)
    finally:
        coord.close()
    app.note(f"job {rec.id} {rec.status}")


@click.command()
@click.argument("job_id", callback=job_id_arg)
@pass_app
def cancel(app: App, job_id: str) -> None:
    """Stop every rank of JOB_ID on every node; nothing of it keeps running."""
    from cloudtrain.errors import NotFoundError

    rec = app.state.job(job_id)
    if rec is None:
        raise NotFoundError(f"no job {job_id!r}; `cloudtrain status` lists jobs")
    if rec.finished:
        app.out.print(f"job {job_id} already {rec.status}; nothing to do", markup=False)
        return
    if rec.detail.get("managed"):
        from cloudtrain.cli.watch import cancel_managed

        rec = cancel_managed(app, rec)
        app.out.print(f"job {job_id} {rec.status}", markup=False)
        return
    coord = app.coordinator(rec.cluster)
    try:
        with app.err.status(f"cancelling {job_id}"):
            rec = coord.cancel(job_id)
    finally:
        coord.close()
    app.out.print(f"job {job_id} {rec.status}", markup=False)


COMMANDS = (train, launch, logs, cancel)
