"""What comes home from a job's nodes while it runs and before its cluster goes: the new lines
of its metrics, its checkpoints (to the job's bucket too), its logs. All of it untrusted and
bounded on the way (`cloudtrain.executors.received`, `cloudtrain.jobs.checkpoints`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cloudtrain.errors import CloudtrainError, CommandError, ProviderError
from cloudtrain.executors import received
from cloudtrain.executors.base import fan_out
from cloudtrain.jobs import checkpoints, metrics, shards
from cloudtrain.jobs.attempts import attempt_of, job_dir, ran_on, run_dir
from cloudtrain.jobs.nodes import JobNodes
from cloudtrain.model import NodeInfo
from cloudtrain.state import JobRecord

log = logging.getLogger(__name__)


class Pulling(JobNodes):
    """A job's metrics, checkpoints and logs, copied home from its nodes."""

    def pull_metrics(self, rec: JobRecord, nodes: Sequence[NodeInfo] | None = None) -> None:
        """Copy home the new lines of the current attempt's metrics from `nodes` (default: the
        job's); a node that does not answer is logged and tried again next time."""
        attempt = attempt_of(rec)
        closes = self._closes

        def pull(node: NodeInfo) -> None:
            folder = job_dir(node, rec.id, attempt)
            try:
                metrics.pull(
                    metrics.copy_path(self.home, rec.id, attempt, node.index),
                    lambda offset: (
                        self._agent(node, "metrics", folder, "--offset", str(offset)).check().stdout
                    ),
                )
            except (CommandError, ProviderError, OSError) as exc:
                if self._closes != closes:  # ended by `close` (Ctrl-C): not the node's fault
                    return
                log.warning(
                    "could not copy the metrics of %s from node %d: %s", rec.id, node.index, exc
                )

        fan_out(pull, ran_on(rec, nodes) if nodes is not None else self._job_nodes(rec))

    def pull_checkpoints(
        self, job_id: str, *, lost: int | None = None, nodes: Sequence[NodeInfo] | None = None
    ) -> Path | None:
        """Copy the checkpoint folder of `job_id` on its first node (or, when node `lost` is
        the first, on the next one: every node's local rank 0 writes its own copy; an fsdp
        job's shards from every node, `Kept.pull_sharded`) to the user's machine
        (`cloudtrain.jobs.checkpoints`), then a new snapshot to the job's bucket if it has one;
        the newest snapshot kept (an fsdp job's: the newest that holds a complete checkpoint,
        `shards.newest_usable`), or None. A node or a bucket that does not answer is logged,
        not raised: the snapshot before it stands (an unpushed one is pushed next time)."""

        rec = self._job(job_id)
        keep = rec.detail.get("checkpoint_keep") or checkpoints.KEEP
        kept = checkpoints.Kept(self.home, job_id, keep=keep)
        found = self.state.nodes(rec.cluster) if nodes is None else nodes  # or where they went
        nodes = [n for n in ran_on(rec, found) if n.index != lost]
        newest = kept.newest()

        def warn(index: int, exc: Exception) -> None:
            log.warning("could not copy the checkpoints of %s from node %d: %s", job_id, index, exc)

        override = rec.detail.get("checkpoint_dir")
        sharded = (rec.detail.get("spec") or {}).get("strategy") == "fsdp"
        if nodes and sharded:
            sources = [
                (n.index, self._executor(n), checkpoints.node_folder(n.root, job_id, override))
                for n in nodes
            ]
            newest = kept.pull_sharded(sources, warn)
        elif nodes:
            head = nodes[0]
            try:
                newest = kept.pull(
                    self._executor(head), checkpoints.node_folder(head.root, job_id, override)
                )
            except (CommandError, ProviderError, OSError) as exc:
                warn(head.index, exc)
        url = rec.detail.get("checkpoint_url")
        if url and newest is not None:
            try:
                kept.push(checkpoints.bucket_of(url), sharded=sharded)
            except (CloudtrainError, OSError) as exc:
                log.warning("could not copy the checkpoints of %s to %s: %s", job_id, url, exc)
        if sharded:  # a lost node's last copy and the survivors' newer shards may not make one
            return shards.newest_usable(kept.snapshots())
        return newest

    def archive_logs(self, cluster: str, nodes: Sequence[NodeInfo] | None = None) -> None:
        """Copy every job's node logs of `cluster` to ``<home>/logs`` (before a teardown), from
        `nodes` when given (a self-stopped cluster's folders, `cloudtrain.jobs.selfstopped`)."""
        nodes = self.state.nodes(cluster) if nodes is None else nodes
        for rec in self.state.jobs(cluster):
            self.pull_metrics(rec, nodes)
            if rec.detail.get("managed"):
                continue  # its watcher keeps the copy of every attempt
            copy_dir = self.home / "logs" / rec.id
            for node in ran_on(rec, nodes):
                copy_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                try:  # as it comes, bounded: a node's log may be as long as it likes
                    with received.log_copy(copy_dir / f"node-{node.index}.log") as write:
                        args = ("follow", "--once", run_dir(node, rec))
                        self._agent(node, *args, timeout=300, on_output=write)
                except (CommandError, ProviderError) as exc:
                    log.warning(
                        "could not copy the logs of %s from node %d: %s", rec.id, node.index, exc
                    )
        jobs = self.state.jobs(cluster)
        if jobs:  # the nodes' checkpoint folders hold the newest job's last checkpoint
            self.pull_checkpoints(max(jobs, key=lambda r: r.seq).id, nodes=nodes)
