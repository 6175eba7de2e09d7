"""The embedded local provider: "nodes" are folders on this machine, jobs are its processes.

Prerequisites: none (torch in this Python to train). Supports: multi-node clusters (several
torchrun agents on one machine, talking over loopback). No GPUs, spot, regions or images.

Each node is ``<home>/local/<cluster>/node-<i>/`` with a ``node.json`` that plays the part of a
cloud's tags: `describe` and `terminate` read the folders, never the state database, so a lost
state file leaks nothing here either. `terminate` stops every process started for the node
(found by the ``CLOUDTRAIN_NODE_ROOT`` variable in its environment), then deletes the folders.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Collection
from functools import partial
from pathlib import Path
from typing import ClassVar

from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent, Plan, ignore_event
from cloudtrain.node import agent as resident
from cloudtrain.node import procs
from cloudtrain.provision.provider import ProviderContext, node_price
from cloudtrain.spec import ClusterSpec

LOOPBACK = "127.0.0.1"


class LocalProvider:
    """Clusters of folders and processes on this machine."""

    name: ClassVar[str] = "local"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.MULTI_NODE, Capability.AUTOSTOP}
    )

    def __init__(self, context: ProviderContext) -> None:
        self._root = context.home / "local"
        self._price = node_price(context.options)

    def _cluster_dir(self, cluster: str) -> Path:
        return self._root / cluster

    def plan(self, spec: ClusterSpec) -> Plan:
        offer = Offer("local", "local", ("local",), "cpu", self._price)
        cdir = self._cluster_dir(spec.name)
        requests = [
            {"action": "create-node", "path": str(cdir / f"node-{i}")}
            for i in range(spec.num_nodes)
        ]
        return Plan(spec=spec, offers=(offer,), requests=tuple(requests))

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        spec = plan.spec
        existing = self.describe(spec.name)
        if len(existing) > spec.num_nodes:
            raise ConfigError(
                f"cluster {spec.name!r} already has {len(existing)} nodes, more than the "
                f"{spec.num_nodes} asked for; `cloudtrain down {spec.name}` first"
            )
        have = {n.index for n in existing}
        try:
            return self._make(spec, have, on_event)
        except OSError as exc:  # its folder removed while it was made: the "instance" is lost
            raise ProviderError("local", "NodeLost", f"a node's folder went away while it was "
                                f"made ({exc.strerror}: {exc.filename})",
                                retryable=True) from None  # fmt: skip

    def _make(self, spec: ClusterSpec, have: set[int], on_event: OnEvent) -> list[NodeInfo]:
        """Make the nodes of `spec` not in `have`; start the bootstrap of every node not
        ready. An `OSError` when a node's folder goes away meanwhile."""
        for index in range(spec.num_nodes):
            if index in have:
                continue
            node_dir = self._cluster_dir(spec.name) / f"node-{index}"
            node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            resident.stopped_record(node_dir).unlink(missing_ok=True)  # an earlier life's
            tags = {"cluster": spec.name, "index": index, "created": time.time()}
            tmp = node_dir / "node.json.tmp"
            tmp.write_text(json.dumps(tags))
            os.replace(tmp, node_dir / "node.json")
            on_event(Event("node", f"made at {node_dir}", node=index))
        nodes = self.describe(spec.name)
        for node in nodes:
            if node.index not in have or not _bootstrapped(node):  # a ready node stays as it is
                self._bootstrap(node)
        return nodes

    def _bootstrap(self, node: NodeInfo) -> None:
        """Start the same bootstrap cloud nodes run, in check-only mode: the phases that make
        sense on this machine (this Python and its cloudtrain; its torch and a gloo all-reduce,
        this cloudtrain's `cloudtrain.node.bootstrap`). The nodes are one machine: node 0
        verifies it (a torch import and an all-reduce, 2 s of CPU), the others skip that phase.
        Detached: `cloudtrain.boot.readiness` reads its status file like any node's."""
        root = Path(node.root)
        (root / "bootstrap").mkdir(exist_ok=True)
        script = root / "bootstrap" / "bootstrap.sh"
        script.write_text(bootstrap.script())
        env = root / "bootstrap" / "bootstrap.env"
        env.write_text(
            bootstrap.config(
                bootstrap.NodeShape("local"),
                install=False,
                phases=bootstrap.CHECK_PHASES,
                python=sys.executable,
                root=str(root),
                agent="detached",
                verified_by=None if node.index == 0 else "node 0",
            )
        )
        LocalExecutor().start_detached(
            ["bash", str(script), str(env)],
            env={"CLOUDTRAIN_NODE_ROOT": str(root)},
            cwd=str(root),
            job_dir=str(root / "bootstrap" / "run"),
        )

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        nodes = []
        for tag_file in sorted(self._cluster_dir(cluster).glob("node-*/node.json")):
            try:
                index = int(json.loads(tag_file.read_text())["index"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a node half-made by a crash: apply makes it again
            nodes.append(
                NodeInfo(
                    cluster=cluster,
                    index=index,
                    node_id=f"{cluster}-{index}",
                    private_ip=LOOPBACK,
                    public_ip=None,
                    state="running",
                    zone="local",
                    instance_type="cpu",
                    ifname="lo",
                    root=str(tag_file.parent),
                    python=sys.executable,
                )
            )
        return sorted(nodes, key=lambda n: n.index)

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        cdir = self._cluster_dir(cluster)
        if not cdir.exists():
            return
        for node_dir in sorted(cdir.glob("node-*")):
            procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node_dir)}, grace_s=5.0)
        shutil.rmtree(cdir, ignore_errors=True)

    def remove_nodes(self, cluster: str, cluster_id: str | None, indices: Collection[int]) -> None:
        """Stop every process of the nodes `indices` and delete their folders; the cluster's
        other nodes stay (`RemovesNodes`)."""
        for index in sorted(indices):
            node_dir = self._cluster_dir(cluster) / f"node-{int(index)}"
            procs.stop(partial(procs.find_node, str(node_dir)), 5.0)  # its warm client too
            shutil.rmtree(node_dir, ignore_errors=True)

    def clusters(self) -> list[str]:
        return sorted({p.parent.parent.name for p in self._root.glob("*/node-*/node.json")})

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        """The cluster's folder when it holds no node any more (a crash mid-`terminate`, or
        nodes that removed themselves when idle: it says why)."""
        folder = self._cluster_dir(cluster)
        if folder.is_dir() and not any(folder.glob("node-*/node.json")):
            why = resident.stopped_reasons(folder)
            return [f"folder {folder}" + (f" ({'; '.join(why)})" if why else "")]
        return []

    def executor(self, node: NodeInfo) -> LocalExecutor:
        return LocalExecutor()


def _bootstrapped(node: NodeInfo) -> bool:
    """Whether the node's bootstrap reported ready (its status file)."""
    try:
        status = json.loads((Path(node.root) / "bootstrap" / "status.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(status, dict) and status.get("state") == "ready"
