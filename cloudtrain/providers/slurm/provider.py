"""Clusters on a Slurm cluster the team already runs: each one a batch job holding its nodes.

`apply` submits one job (``sbatch``: the nodes, whole, with the GPUs, partition, account, QoS
and time limit asked for), waits while Slurm keeps it pending and says why (squeue's reason;
past ``--wait`` it is cancelled, one line naming the reason; a reason that can never clear, a
time beyond the partition's limit, ends the wait at once), then, once it runs, waits for its
host on every node (`_host`: the job's one long step, which keeps what cloudtrain starts inside
the allocation) and starts each node's bootstrap through it, check-only against ``--python``.
Commands run as ``srun --overlap`` steps of the job (`_executor`), so a second `train` does not
queue again. `terminate` cancels the job (Slurm stops everything of it on every node) and
removes the cluster's folder.

The job is named after the cluster and its comment says whose it is (owner, cluster id):
`describe`, `clusters` and `leftovers` read ``squeue``/``scontrol``, never local state. Two
`apply`s of one name make one job: the second finds the first's in the queue.

Slurm's commands run on the login node (`_login`): this machine (``--login local``) or one
reached over SSH (``--login user@host[:port]``), where the cluster's folder is too (every file of
it read and written through the login node's shell). That folder (``--shared-dir``; default
``CLOUDTRAIN_HOME/slurm`` on this machine, ``~/.cloudtrain/slurm`` on a login node over SSH) must
be one the nodes see at the same path (a shared home).
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
from typing import Any, ClassVar

from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.executors.base import fan_out
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent, Plan, ignore_event
from cloudtrain.providers.slurm import _host
from cloudtrain.providers.slurm._executor import SrunExecutor, host_source
from cloudtrain.providers.slurm._login import Login
from cloudtrain.providers.slurm._slurm import NEVER, Allocation, Slurm, comment, seconds
from cloudtrain.provision.provider import ProviderContext, default_owner, node_price
from cloudtrain.spec import ClusterSpec

#: The bootstrap phases of a node whose Python the user names (nothing is installed).
PHASES = "python cloudtrain torch verify"
#: The clusters' folder on a login node over SSH, in the login user's home.
SHARED = ".cloudtrain/slurm"
#: The file in a cluster's folder that says whose it is.
OWNER = "owner.json"
#: How long `apply` lets the allocation pend before it cancels it (``--wait``), in seconds.
WAIT_S = 300.0
#: How long before the time limit the job is told to save (``--notice``), in seconds.
NOTICE_S = 120.0
#: How long a running allocation's hosts have to come up on every node.
HOSTS_S = 120.0
#: What Slurm takes as a time limit: minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$", re.IGNORECASE)
#: A network interface's name as Linux allows it (IFNAMSIZ): all a node's answer may be.
_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
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
        self.partition = _word(opts, "partition")
        self.account = _word(opts, "account")
        self.qos = _word(opts, "qos")
        self.time = str(opts.get("time") or "") or None
        if self.time is not None and not _TIME.fullmatch(self.time):
            raise ConfigError(
                f"--time {self.time!r}: give minutes, HH:MM:SS or D-HH:MM:SS (as sbatch takes)"
            )
        self.wait_s = _seconds(opts.get("wait"), WAIT_S, "wait")
        self.notice_s = int(_seconds(opts.get("notice"), NOTICE_S, "notice"))
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
            self.partition or "default",
            (self.partition or "default",),
            "slurm",
            self.node_price,
            False,
            accel,
            count if accel else 0,
        )
        self.login.check()
        options = self._options(spec)  # checks --shared-dir, before any call
        # Slurm answers, and no job of another owner's has the name, before anything is recorded
        self._held(spec.name, spec.cluster_id)
        request = {"action": "sbatch", "options": options}
        return Plan(spec=spec, offers=(offer,), requests=(request,))

    def _options(self, spec: ClusterSpec) -> list[str]:
        """sbatch's options for `spec`: whole nodes (every CPU and all memory), the GPUs."""
        folder = self._folder(spec.name)
        options = [
            f"--job-name={spec.name}",
            f"--comment={comment(self.owner, spec.cluster_id)}",
            f"--nodes={spec.num_nodes}",
            "--ntasks-per-node=1",
            "--exclusive",
            "--no-requeue",  # a node lost ends the job: recovery is cloudtrain's, not a rerun
            "--mem=0",
            f"--chdir={folder}",
            f"--output={folder}/slurm-%j.out",
            f"--signal=B:USR1@{self.notice_s}",  # the notice before the time limit: `_host`
        ]
        if spec.resources.accelerator and spec.resources.count:
            options.append(f"--gres={_gres(spec.resources.accelerator, spec.resources.count)}")
        for flag, value in (
            ("partition", self.partition),
            ("account", self.account),
            ("qos", self.qos),
            ("time", self.time),
        ):
            if value:
                options.append(f"--{flag}={value}")
        return options

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        spec = plan.spec
        folder = self._folder(spec.name)
        job = self._held(spec.name, spec.cluster_id)
        if job is not None and job.state not in ("PENDING", "CONFIGURING", "RUNNING"):
            self._until_gone(spec.name, [job.job_id])  # ending (a node failed): a new one
            job = None
        made = not self.login.exists(folder)
        try:
            if job is None:
                self._claim(spec)
                job_id = self.slurm.submit(self._script(spec), self._options(spec))
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
        self._until_hosts(spec.name, job_id, len(self.slurm.hostnames(job.nodelist)))
        nodes = self.describe(spec.name, spec.cluster_id)
        fan_out(lambda n: self._make_node(spec, n), nodes)
        return self.describe(spec.name, spec.cluster_id)

    def _first_wins(self, cluster: str, job_id: str) -> None:
        """Of two `up`s of one name at once (from two machines: one machine's hold its lock),
        the job submitted first is the cluster; a later one is cancelled, and says whose."""
        first = min(
            (j for j in self.slurm.queue(cluster) if j.name == cluster),
            key=lambda j: int(j.job_id),
            default=None,
        )
        if first is not None and first.job_id != job_id:
            self.slurm.cancel([job_id])
            raise ConfigError(
                f"cluster {cluster!r}: Slurm job {first.job_id} of "
                f"{first.owner or 'another user'} took that name first"
            )

    def _script(self, spec: ClusterSpec) -> str:
        """The batch script: one host per node, in a step that holds all of the node; and,
        on Slurm's ``USR1`` before the time limit (``--signal=B:``, to this shell only: a
        step's signal reaches every process of the step, and would kill what does not catch
        it), the notice on every node, in a step of its own (``cloudtrain.node notice``)."""
        gres = ""
        if spec.resources.accelerator and spec.resources.count:
            gres = f" --gres={_gres(spec.resources.accelerator, spec.resources.count)}"
        base = shlex.quote(self._folder(spec.name))
        python = shlex.quote(self.python)
        tell = (
            f'exec {python} -m cloudtrain.node notice --root {base}/node-"$SLURM_NODEID" '
            "--source slurm --action end"
        )
        return (
            "#!/bin/bash\n"
            f"# cloudtrain cluster {spec.name}: `cloudtrain down {spec.name}` cancels it\n"
            "HOST=$(cat <<'CLOUDTRAIN_HOST'\n"
            f"{host_source()}\n"
            "CLOUDTRAIN_HOST\n)\n"
            "notice() {\n"
            '  srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 '
            f"sh -c {shlex.quote(tell)}\n"
            "}\n"
            "trap notice USR1\n"
            'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" --mem=0'
            f'{gres} --kill-on-bad-exit=1 {python} -c "$HOST" serve {base} &\n'
            "hosts=$!\n"
            "while :; do  # a trapped signal ends a wait: wait again until the hosts end\n"
            '  wait "$hosts"; code=$?\n'
            '  kill -0 "$hosts" 2>/dev/null || exit "$code"\n'
            "done\n"
        )

    def _until_running(self, cluster: str, job_id: str, on_event: OnEvent) -> Allocation:
        """Wait while the job pends, saying why each time the reason changes; cancel it past
        `wait_s` or for a reason that never clears."""
        deadline = time.monotonic() + self.wait_s
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
                why = never or f"still pending after {self.wait_s:.0f} s"
                raise ProviderError(
                    "slurm",
                    "Pending",
                    f"job {job_id} of {cluster!r}: {why} (Slurm's reason: {job.reason}); cancelled",
                )
            time.sleep(0.5)

    def _why_ended(self, cluster: str, job_id: str) -> str:
        """One line on a job that ended before it ran: Slurm's state and reason; where its
        first node could not write its log, that the nodes do not see the cluster's folder."""
        shown = self.slurm.job(job_id)
        said = f"{shown.get('JobState', 'ended')}, {shown.get('Reason', 'no reason given')}"
        log = f"{self._folder(cluster)}/slurm-{job_id}.out"
        if shown.get("Reason") == "JobLaunchFailure" and not self.login.exists(log):
            return (
                f"job {job_id} of {cluster!r} could not start ({said}): its nodes do not see "
                f"{self._folder(cluster)}; give --shared-dir a folder every node sees at the "
                "same path (a shared home): sites without one are not served yet"
            )
        return f"job {job_id} of {cluster!r} ended before it ran ({said}); see {log}"

    def _until_hosts(self, cluster: str, job_id: str, count: int) -> None:
        folder = self._folder(cluster)
        deadline = time.monotonic() + HOSTS_S
        ready = [posixpath.join(folder, f"node-{i}", _host.READY) for i in range(count)]
        while self.login.count(ready) < count:
            if time.monotonic() > deadline:
                raise ProviderError(
                    "slurm",
                    "NoHost",
                    f"job {job_id}: its nodes' hosts did not "
                    f"start in {HOSTS_S:.0f} s; see {folder}/slurm-{job_id}.out",
                )
            if not any(j.job_id == job_id for j in self.slurm.queue(cluster)):
                raise ProviderError(
                    "slurm",
                    "Ended",
                    f"job {job_id} ended as it started; see {folder}/slurm-{job_id}.out",
                )
            time.sleep(0.2)

    def _make_node(self, spec: ClusterSpec, node: NodeInfo) -> None:
        """Learn the node's interface, record it, and start its check-only bootstrap."""
        ex = self.executor(node)
        root = node.root
        route = ex.run(["sh", "-c", _ROUTE.format(addr=shlex.quote(node.private_ip or ""))])
        said = route.stdout.strip() if route.ok else ""  # the node's word: an interface name
        facts = {"ifname": said if _IFNAME.fullmatch(said) else ""}
        self.login.write(posixpath.join(root, "facts.json"), json.dumps(facts))
        if self.login.exists(posixpath.join(root, "bootstrap", "status.json")):
            return  # started by an earlier apply: readiness reads how far it got
        script = posixpath.join(root, "bootstrap", "bootstrap.sh")
        self.login.write(script, bootstrap.script())
        config = posixpath.join(root, "bootstrap", "bootstrap.env")
        shape = bootstrap.NodeShape("slurm", spec.resources.accelerator, spec.resources.count)
        self.login.write(
            config,
            bootstrap.config(
                shape, install=False, phases=PHASES, python=self.python, root=root, agent="detached"
            ),
        )
        ex.start_detached(
            ["bash", script, config],
            env={"CLOUDTRAIN_NODE_ROOT": root},
            cwd=root,
            job_dir=f"{root}/bootstrap/run",
        )

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
        return jobs[0] if jobs else None

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        mine = self._mine(cluster, cluster_id)
        job = mine[0] if mine else None
        if job is None or not job.running:
            return []
        names = self.slurm.hostnames(job.nodelist)
        shown = self.slurm.nodes(names)
        addrs = {n: shown.get(n, {}).get("NodeAddr") or n for n in names}
        resolved = self.login.addresses([a for a in addrs.values() if not _is_ip(a)])
        roots = [posixpath.join(self._folder(cluster), f"node-{i}") for i in range(len(names))]
        said = self.login.read_all([posixpath.join(root, "facts.json") for root in roots])
        left = seconds(job.time_left)
        ends_at = time.time() + left if left is not None else None
        nodes = []
        for index, (name, root) in enumerate(zip(names, roots, strict=True)):
            ifname = str(_json(said[index]).get("ifname") or "")
            state = shown.get(name, {}).get("State", "")
            lost = any(w in state for w in ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"))
            nodes.append(
                NodeInfo(
                    cluster=cluster,
                    index=index,
                    node_id=f"{name}/{job.job_id}",  # this allocation's: a new one's differs
                    private_ip=resolved.get(addrs[name], addrs[name]),
                    public_ip=None,
                    state="unreachable" if lost else "running",
                    zone=self.partition,
                    instance_type="slurm",
                    root=root,
                    python=self.python,
                    ifname=ifname if _IFNAME.fullmatch(ifname) else None,
                    ends_at=ends_at,
                    extra=MappingProxyType({"job": job.job_id, "host": name, "slurm_state": state}),
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
            if _NAME.fullmatch(name) and _json(mark).get("owner") == self.owner
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
        return SrunExecutor(self.login.channel(), str(job), str(host), node.root, self.python)


def _gres(accelerator: str, count: int) -> str:
    """sbatch's ``--gres`` for `count` GPUs of type `accelerator` per node (``gpu:a100:8``)."""
    return f"gpu:{accelerator.lower()}:{count}"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _word(opts: Mapping[str, Any], key: str) -> str | None:
    value = str(opts.get(key) or "") or None
    if value is not None and not _NAME.fullmatch(value):
        raise ConfigError(f"--{key} {value!r}: letters, digits and _.+- only, at most 64")
    return value


def _seconds(value: object, default: float, flag: str) -> float:
    """The option `flag`'s seconds: more than 0, at most 65535 (what ``--signal`` takes)."""
    if value is None or value == "":
        return default
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = -1
    if not 0 < seconds <= 65535:
        raise ConfigError(f"--{flag} {value!r}: give seconds, more than 0 and at most 65535")
    return seconds


def _json(text: str | None) -> dict[str, object]:
    """A JSON object read back from the shared folder (anything else: empty)."""
    try:
        found = json.loads(text or "")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


__all__: Sequence[str] = ["SlurmProvider"]
