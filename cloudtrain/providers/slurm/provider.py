"""Clusters on a Slurm cluster the team already runs: each one a batch job holding its nodes.

`apply` submits one job (``sbatch``: the nodes, whole, with the GPUs, partition, account, QoS
and time limit asked for), waits while Slurm keeps it pending and says why (squeue's reason;
past ``--wait`` it is cancelled, one line naming the reason; a reason that can never clear, a
time beyond the partition's limit, ends the wait at once), then, once it runs, waits for its
host on every node (`_host`: a long step of the job's on each node, which keeps what cloudtrain
starts inside the allocation) and starts each node's bootstrap through it, check-only against
``--python``. A node lost leaves the job running on the others (``--no-kill``); the next
`apply` makes it again as a job of one node (`_make_again`), which `describe` merges in.
Commands run as ``srun --overlap`` steps of the job (`_executor`), so a second `train` does not
queue again. `terminate` cancels the job (Slurm stops everything of it on every node) and
removes the cluster's folder.

The job is named after the cluster and its comment says whose it is (owner, cluster id):
`describe`, `clusters` and `leftovers` read ``squeue``/``scontrol``, never local state. Two
`apply`s of one name make one job: the second finds the first's in the queue.

Slurm's commands run on the login node (`_login`): this machine (``--login local``) or one
reached over SSH (``--login user@host[:port]``), where the cluster's folder is too (every file of
it read and written through the login node's shell; ``--shared-dir``, default
``CLOUDTRAIN_HOME/slurm`` on this machine, ``~/.cloudtrain/slurm`` on a login node over SSH).
Each node's folder is ``node-N`` at the same path on the node. Where the nodes see the login
node's folder (a shared home: its ``owner.json`` is there, the hosts say), files are read and
written there; where they do not, the node's folder is its own, files travel through steps
(`_executor`), the batch script's log stays on the first node, and the hosts remove the nodes'
folders when the allocation ends. The layout the hosts found is kept in ``layout.json``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import posixpath
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar

from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.executors.base import fan_out
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent, Plan, ignore_event
from cloudtrain.providers.slurm import _host
from cloudtrain.providers.slurm._batch import NAME, Batch
from cloudtrain.providers.slurm._executor import SrunExecutor, host_source
from cloudtrain.providers.slurm._login import Login
from cloudtrain.providers.slurm._slurm import NEVER, Allocation, Slurm, seconds
from cloudtrain.provision.provider import ProviderContext, default_owner, node_price
from cloudtrain.spec import ClusterSpec

#: The clusters' folder on a login node over SSH, in the login user's home.
SHARED = ".cloudtrain/slurm"
#: The file in a cluster's folder that says whose it is (and, to the nodes, that they share it).
OWNER = _host.OWNER
#: The file in a cluster's folder that says whether the nodes share it (`_host.ready`).
LAYOUT = "layout.json"
#: How long a running allocation's hosts have to come up on every node.
HOSTS_S = 120.0
#: A network interface's name as Linux allows it (IFNAMSIZ): all a node's answer may be.
_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
#: What `apply` learns of a node from the node itself: the interface its peers reach it on.
_ROUTE = "ip -o route get {addr} 2>/dev/null | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'"


class SlurmProvider:
    """Clusters as allocations of a Slurm cluster."""

    name: ClassVar[str] = "slurm"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.MULTI_NODE, Capability.GPU, Capability.AUTOSTOP}
    )

    def __init__(self, context: ProviderContext) -> None:
        opts = context.options
        self.login = Login(opts.get("login"), opts.get("identity"), opts.get("known_hosts"))
        self._shared = opts.get("shared_dir")
        self._default_shared = str(context.home / "slurm") if self.login.local else SHARED
        # the nodes' Python: over SSH this machine's path means nothing there
        self.python = str(opts.get("python") or (sys.executable if self.login.local else "python3"))
        self.batch = Batch.from_options(opts, self.python)
        self.node_price = node_price(opts)
        self.owner = default_owner()

    @functools.cached_property
    def slurm(self) -> Slurm:
        return Slurm(self.login.shell)

    @functools.cached_property
    def shared(self) -> str:
        """The clusters' folder on the login node (asks it for its home the first time)."""
        return self.login.folder(self._shared, self._default_shared)

    def _folder(self, cluster: str) -> str:
        return posixpath.join(self.shared, cluster)

    # -- the five verbs ------------------------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        accel, count = spec.resources.accelerator, spec.resources.count
        offer = Offer(
            "slurm",
            self.batch.partition or "default",
            (self.batch.partition or "default",),
            "slurm",
            self.node_price,
            False,
            accel,
            count if accel else 0,
        )
        self.login.check()
        self._folder(spec.name)  # checks --shared-dir, before any call
        options = self.batch.options(spec, self.owner)
        # Slurm answers, and no job of another owner's has the name, before anything is recorded
        self._held(spec.name, spec.cluster_id)
        request = {"action": "sbatch", "options": options}
        return Plan(spec=spec, offers=(offer,), requests=(request,))

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        spec = plan.spec
        folder = self._folder(spec.name)
        job = self._held(spec.name, spec.cluster_id)
        if job is None or job.state not in ("PENDING", "CONFIGURING", "RUNNING"):
            # ending (every node lost), or gone: a new one, and nothing of the old left
            ending = [j.job_id for j in self._mine(spec.name, spec.cluster_id)]
            self.slurm.cancel([j for j in ending if job is None or j != job.job_id])
            self._until_gone(spec.name, ending)
            job = None
        made = not self.login.exists(folder)
        made_now = job is None or job.state != "RUNNING"
        try:
            if job is None:
                self._claim(spec)
                script = self.batch.script(spec, folder)
                job_id = self.slurm.submit(script, self.batch.options(spec, self.owner))
                on_event(Event("node", f"submitted job {job_id} for {spec.num_nodes} node(s)"))
                self._first_wins(spec.name, job_id)
            else:
                job_id = job.job_id
                on_event(Event("node", f"job {job_id} holds the cluster already ({job.state})"))
            job = self._until_running(spec.name, job_id, on_event)
        except BaseException:
            if made and not self._mine(spec.name, None):  # nothing of it in the queue
                self.login.remove(folder)
            raise
        if made_now or not self._known(spec.name, job):  # (a running job's hosts are known)
            self._until_hosts(spec.name, job, range(spec.num_nodes) if made_now else ())
        fan_out(lambda i: self._make_again(spec, i, on_event), self._missing(spec))
        nodes = self.describe(spec.name, spec.cluster_id)
        fan_out(lambda n: self._make_node(spec, n), nodes)
        return self.describe(spec.name, spec.cluster_id)

    def _known(self, cluster: str, job: Allocation) -> bool:
        """Whether `job`'s hosts were found up before (`LAYOUT` names its nodes)."""
        layout = _json(self.login.read(posixpath.join(self._folder(cluster), LAYOUT)))
        nodes = layout.get("nodes")
        return isinstance(nodes, dict) and any(k.startswith(f"{job.job_id}/") for k in nodes)

    def _missing(self, spec: ClusterSpec) -> list[int]:
        """The nodes of `spec` that no job of the cluster holds, or only a lost one."""
        held = {n.index for n in self.describe(spec.name, spec.cluster_id) if n.state == "running"}
        coming = {j.index for j in self._mine(spec.name, spec.cluster_id) if not j.running}
        return [i for i in range(spec.num_nodes) if i not in held and i not in coming]

    def _make_again(self, spec: ClusterSpec, index: int, on_event: OnEvent) -> None:
        """Node `index` of the cluster, lost while the cluster's job runs on (``--no-kill``),
        made again as a job of one node of its own."""
        folder = self._folder(spec.name)
        script = self.batch.script(spec, folder, first=index)
        job_id = self.slurm.submit(script, self.batch.options(spec, self.owner, index))
        on_event(Event("node", f"node {index}: submitted job {job_id} to make it again"))
        job = self._until_running(spec.name, job_id, on_event)
        self._until_hosts(spec.name, job, [index])

    def _first_wins(self, cluster: str, job_id: str) -> None:
        """Of two `up`s of one name at once (from two machines: one machine's hold its lock),
        the job submitted first is the cluster; a later one is cancelled, and says whose."""
        first = min(
            (j for j in self.slurm.queue(cluster) if j.name == cluster and j.index is None),
            key=lambda j: int(j.job_id),
            default=None,
        )
        if first is not None and first.job_id != job_id:
            self.slurm.cancel([job_id])
            raise ConfigError(
                f"cluster {cluster!r}: Slurm job {first.job_id} of "
                f"{first.owner or 'another user'} took that name first"
            )

    def _until_running(self, cluster: str, job_id: str, on_event: OnEvent) -> Allocation:
        """Wait while the job pends, saying why each time the reason changes; cancel it past
        `wait_s` or for a reason that never clears."""
        deadline = time.monotonic() + self.batch.wait_s
        said = ("", "")
        while True:
            job = next((j for j in self.slurm.queue(cluster) if j.job_id == job_id), None)
            if job is None:
                raise ProviderError("slurm", "Ended", self._why_ended(cluster, job_id))
            if job.running and job.nodelist:
                return job
            if (job.reason, job.start) != said:
                said = (job.reason, job.start)
                parts = [job.reason] if job.reason not in ("", "None") else []
                parts += [f"Slurm expects it to start at {job.start}"] if job.start else []
                told = f" ({'; '.join(parts)})" if parts else ""
                on_event(Event("wait", f"job {job_id} is {job.state.lower()}{told}"))
            never = NEVER.get(job.reason)
            if never or time.monotonic() > deadline:
                self.slurm.cancel([job_id])
                why = never or f"still pending after {self.batch.wait_s:.0f} s"
                raise ProviderError(
                    "slurm",
                    "Pending",
                    f"job {job_id} of {cluster!r}: {why} (Slurm's reason: {job.reason}); cancelled",
                )
            time.sleep(0.5)

    def _why_ended(self, cluster: str, job_id: str) -> str:
        """One line on a job that ended before it ran: Slurm's state and reason, and where
        its log is."""
        shown = self.slurm.job(job_id)
        said = f"{shown.get('JobState', 'ended')}, {shown.get('Reason', 'no reason given')}"
        log = self._log(cluster, job_id)
        return f"job {job_id} of {cluster!r} ended before it ran ({said}); {log}"

    def _log(self, cluster: str, job_id: str) -> str:
        """Where the batch script's log is: in the cluster's folder, or on the job's first node
        when the nodes do not share it (and gone with the job)."""
        log = f"{self._folder(cluster)}/slurm-{job_id}.out"
        if self.login.exists(log):
            return f"see {log}"
        return f"its log is {log} on its first node, where the folder is the node's own"

    def _until_hosts(self, cluster: str, job: Allocation, indices: Sequence[int]) -> None:
        """Wait until the host of every node of `job` is up, nodes `indices` among them (one
        step over its nodes asks them all); keep which node is which, and whether they all
        share the cluster's folder (`LAYOUT`)."""
        deadline = time.monotonic() + HOSTS_S
        ask = ["srun", "--overlap", f"--jobid={job.job_id}", f"--nodes={job.nodes}",
               "--ntasks-per-node=1", "--chdir=/", "--quiet", self.python, "-c", host_source(),
               "ready", self._folder(cluster)]  # fmt: skip
        while True:
            said = [
                _json(line) for line in self.login.shell.run(ask, timeout=60).stdout.splitlines()
            ]
            up = {
                i: str(n.get("node"))
                for n in said
                if isinstance(i := n.get("index"), int) and "pid" in n and n.get("node")
            }
            if len(up) >= job.nodes and all(i in up for i in indices):
                path = posixpath.join(self._folder(cluster), LAYOUT)
                layout = _json(self.login.read(path))
                known = layout.get("nodes")
                nodes = dict(known) if isinstance(known, dict) else {}
                nodes |= {f"{job.job_id}/{name}": i for i, name in up.items()}
                shared = all(n.get("shared") is True for n in said if "pid" in n)
                if layout.get("shared") is False:
                    shared = False  # one node of the cluster does not share it: none do
                self.login.write(path, json.dumps({"shared": shared, "nodes": nodes}))
                return
            if time.monotonic() > deadline:
                raise ProviderError(
                    "slurm",
                    "NoHost",
                    f"job {job.job_id}: its nodes' hosts did not "
                    f"start in {HOSTS_S:.0f} s; {self._log(cluster, job.job_id)}",
                )
            if not any(j.job_id == job.job_id for j in self.slurm.queue(cluster)):
                raise ProviderError(
                    "slurm",
                    "Ended",
                    f"job {job.job_id} ended as it started; {self._log(cluster, job.job_id)}",
                )
            time.sleep(0.5)

    def _make_node(self, spec: ClusterSpec, node: NodeInfo) -> None:
        """Learn the node's interface, record it, and start its check-only bootstrap."""
        ex = self.executor(node)
        root = node.root
        route = ex.run(["sh", "-c", _ROUTE.format(addr=shlex.quote(node.private_ip or ""))])
        said = route.stdout.strip() if route.ok else ""  # the node's word: an interface name
        facts = {"ifname": said if _IFNAME.fullmatch(said) else ""}
        self.login.write(self._facts(spec.name, node.index), json.dumps(facts))
        shape = bootstrap.NodeShape("slurm", spec.resources.accelerator, spec.resources.count)
        bootstrap.start_checks(ex, shape, root=root, python=self.python)

    def _facts(self, cluster: str, index: int) -> str:
        """What `apply` learned of node `index` (in the cluster's folder on the login node)."""
        return posixpath.join(self._folder(cluster), f"facts-{index}.json")

    def _held(self, cluster: str, cluster_id: str | None) -> Allocation | None:
        """`apply`'s: this owner's job of this incarnation of `cluster`; `ConfigError` when a
        job of another owner, or of another incarnation, has the name."""
        jobs = [j for j in self.slurm.queue(cluster) if j.name == cluster]
        other = [j for j in jobs if (j.owner, j.cluster_id) != (self.owner, cluster_id)]
        if other:
            whose = other[0].owner or "no cloudtrain owner"
            raise ConfigError(
                f"cluster {cluster!r}: Slurm job {other[0].job_id} has that name "
                f"({whose}); choose another name, or `cloudtrain down {cluster}` it first"
            )
        return next((j for j in jobs if j.index is None), None)  # the cluster's own

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        """The nodes of the cluster's running jobs (its own, and those that made a lost node
        again), each by the index its host was started as."""
        jobs = [j for j in self._mine(cluster, cluster_id) if j.running and j.nodelist]
        names = {j.job_id: self.slurm.hostnames(j.nodelist) for j in jobs}
        every = sorted({n for found in names.values() for n in found})
        shown = self.slurm.nodes(every)
        addrs = {n: shown.get(n, {}).get("NodeAddr") or n for n in every}
        resolved = self.login.addresses([a for a in addrs.values() if not _is_ip(a)])
        layout = _json(self.login.read(posixpath.join(self._folder(cluster), LAYOUT)))
        known = layout.get("nodes") if isinstance(layout.get("nodes"), dict) else {}
        assert isinstance(known, dict)
        held: dict[int, tuple[Allocation, str]] = {}
        for job in sorted(jobs, key=lambda j: j.index is not None):  # the made again last
            for position, name in enumerate(names[job.job_id]):
                said = known.get(f"{job.job_id}/{name}")
                index = (
                    said if type(said) is int else job.index if job.index is not None else position
                )
                if index not in held or not _lost(shown.get(held[index][1], {})):
                    held[index] = (job, name)
        said_of = dict(
            zip(held, self.login.read_all([self._facts(cluster, i) for i in held]), strict=True)
        )
        shared = layout.get("shared") is not False  # until the hosts said: as before
        nodes = []
        for index, (job, name) in sorted(held.items()):
            ifname = str(_json(said_of[index]).get("ifname") or "")
            state = shown.get(name, {}).get("State", "")
            left = seconds(job.time_left)
            nodes.append(
                NodeInfo(
                    cluster=cluster,
                    index=index,
                    node_id=f"{name}/{job.job_id}",  # this allocation's: a new one's differs
                    private_ip=resolved.get(addrs[name], addrs[name]),
                    public_ip=None,
                    state="unreachable" if _lost(shown.get(name, {})) else "running",
                    zone=self.batch.partition,
                    instance_type="slurm",
                    root=posixpath.join(self._folder(cluster), f"node-{index}"),
                    python=self.python,
                    ifname=ifname if _IFNAME.fullmatch(ifname) else None,
                    ends_at=time.time() + left if left is not None else None,
                    extra=MappingProxyType(
                        {"job": job.job_id, "host": name, "slurm_state": state}
                        | ({} if shared else {"shared": "no"})
                    ),
                )
            )
        return nodes

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        """Cancel the cluster's job(s) and wait until Slurm has ended them (every process of
        theirs on every node), then remove the cluster's folder."""
        jobs = [j.job_id for j in self._mine(cluster, cluster_id)]
        self.slurm.cancel(jobs)
        self._until_gone(cluster, jobs)
        if self._owns(cluster) and not self._mine(cluster, None):
            self.login.remove(self._folder(cluster))

    def _until_gone(self, cluster: str, jobs: Sequence[str]) -> None:
        """Wait until Slurm has ended `jobs` (every process of theirs, on every node)."""
        deadline = time.monotonic() + 120
        while any(j.job_id in jobs for j in self.slurm.queue(cluster)):
            if time.monotonic() > deadline:
                ended = ", ".join(jobs)
                raise ProviderError(
                    "slurm", "NotEnded", f"job(s) {ended} of {cluster!r} still queued after 120 s"
                )
            time.sleep(0.2)

    def _claim(self, spec: ClusterSpec) -> None:
        """Make the cluster's folder, marked as this owner's (`OWNER`); `ConfigError` when
        another owner's folder has the name."""
        folder = self._folder(spec.name)
        marks = _json(self.login.read(posixpath.join(folder, OWNER)))
        if marks and marks.get("owner") != self.owner:
            raise ConfigError(
                f"cluster {spec.name!r}: {folder} is {marks.get('owner')}'s; choose another name"
            )
        mark = json.dumps({"owner": self.owner, "id": spec.cluster_id})
        self.login.write(posixpath.join(folder, OWNER), mark)

    def _owns(self, cluster: str) -> bool:
        """Whether the cluster's folder is this owner's."""
        return (
            _json(self.login.read(posixpath.join(self._folder(cluster), OWNER))).get("owner")
            == self.owner
        )

    def _mine(self, cluster: str, cluster_id: str | None) -> list[Allocation]:
        return [
            j
            for j in self.slurm.queue(cluster)
            if j.name == cluster
            and j.owner == self.owner
            and (cluster_id is None or j.cluster_id == cluster_id)
        ]

    def clusters(self) -> list[str]:
        found = {j.name for j in self.slurm.queue() if j.owner == self.owner}
        marks = self.login.listing(self.shared, OWNER)
        found |= {
            name
            for name, mark in marks.items()
            if NAME.fullmatch(name) and _json(mark).get("owner") == self.owner
        }
        return sorted(found)

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        """A job of the cluster that holds no node (pending), and its folder with no job."""
        jobs = self._mine(cluster, cluster_id)
        found = [f"job {j.job_id} ({j.state.lower()}: {j.reason})" for j in jobs if not j.running]
        if not jobs and self._owns(cluster):
            found.append(f"folder {self._folder(cluster)}")
        return found

    def executor(self, node: NodeInfo) -> SrunExecutor:
        job, host = node.extra.get("job"), node.extra.get("host")
        if not job or not host:
            raise ProviderError(
                "slurm",
                "NoJob",
                f"node {node.index} of {node.cluster!r}: its "
                "record names no job; `cloudtrain status --refresh` reads it",
            )
        # a login shell of its own: closing one node's ends only that node's commands
        stage = None
        if node.extra.get("shared") == "no":  # files travel through the login node's folder
            stage = posixpath.join(self._folder(node.cluster), ".transfer")
        return SrunExecutor(
            self.login.channel(), str(job), str(host), node.root, self.python, stage=stage
        )


def _lost(node: Mapping[str, str]) -> bool:
    """Whether Slurm says the node (``scontrol show node``'s) is lost to its jobs."""
    state = node.get("State", "")
    return any(w in state for w in ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _json(text: str | None) -> dict[str, object]:
    """A JSON object read back from the shared folder (anything else: empty)."""
    try:
        found = json.loads(text or "")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


__all__: Sequence[str] = ["SlurmProvider"]
