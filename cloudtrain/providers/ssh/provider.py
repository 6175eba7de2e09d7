"""Bring-your-own machines over SSH. See the package docstring for what it needs.

Options (``--hosts`` or ``--inventory``, ``--identity``, ``--known-hosts``, ``--python``,
``--allow-sudo``, ``--torch-index``; stored in the cluster's spec): ``hosts``
(``user@address[:port]``, comma-separated or a list; the first is the head), ``inventory`` (a
YAML file of hosts with per-host user, port, key and GPUs: see `cloudtrain.providers.ssh.hosts`),
``identity`` (private key; default ``~/.ssh/id_ed25519``), ``known_hosts`` (default
``~/.ssh/known_hosts``), ``python`` (use it as it is, check-only; without it each node gets a
venv), ``allow_sudo`` (also the ``base`` and ``nvidia-driver`` phases, through ``sudo -n``),
``torch_index`` (a mirror), ``bootstrap_phases`` (overrides the phases `up` runs). Connections
are multiplexed and kept ``ControlPersist`` seconds, so the commands of one CLI run share one
per host. On each host, node *i* of cluster *c* lives in ``~/.cloudtrain/c/node-i/`` (its venv
too); its ``node.json`` is the "tag" `describe` reads.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Collection, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from cloudtrain import access
from cloudtrain.boot import bootstrap
from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.executors.base import SSH_FAILED, fan_out
from cloudtrain.executors.ssh import SshExecutor
from cloudtrain.model import Capability, Event, NodeInfo, Offer, OnEvent, Plan, ignore_event
from cloudtrain.node import agent as resident
from cloudtrain.node import procs
from cloudtrain.providers.ssh.hosts import Host, load_inventory, parse_hosts
from cloudtrain.provision.provider import ProviderContext, node_price
from cloudtrain.spec import ClusterSpec

#: What `apply` learns of a host, printed as one JSON line by its Python.
FACTS = """
import json, os, shutil, subprocess, sys
def out(*argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
route = out("ip", "-o", "route", "get", sys.argv[1]).split()
gpus = [l for l in out("nvidia-smi", "-L").splitlines() if l.startswith("GPU ")]
print(json.dumps({
    "home": os.path.expanduser("~"), "python": sys.version.split()[0],
    "cpus": os.cpu_count(), "gpus": len(gpus),
    "ifname": route[route.index("dev") + 1] if "dev" in route else "",
    "rsync": bool(shutil.which("rsync")),
}))
"""


#: How long a teardown waits for the cluster's processes to end on a TERM before it KILLs them.
STOP_GRACE_S = 5.0


def _not_stopped(stdout: str, code: int) -> str:
    """Why a host's teardown left processes, from what its finder printed (a node's word:
    only a count is taken from it)."""
    try:
        left = int(json.loads(stdout.strip().splitlines()[-1])["left"])
    except (ValueError, KeyError, TypeError, IndexError):
        return f"its process finder exited {code}"
    return f"{left} process(es) of the cluster outlived SIGKILL"


def trust_warning(addresses: Sequence[str]) -> str:
    """What a multi-node job opens on hosts cloudtrain has no firewall for, and the rule that
    keeps it among them (clouds get theirs from `up`: only the cluster's nodes reach them)."""
    listed = ", ".join(addresses)
    sources = " ".join(f"'ufw allow proto tcp from {a}'" for a in addresses)
    return (
        f"a job on these hosts listens on {listed} (the rendezvous store and gloo/NCCL, on "
        "ports chosen per job), which torch does not authenticate: whoever reaches those "
        f"addresses can join it. Let only the hosts reach each other, e.g. on each host "
        f"{sources}, with other incoming TCP refused but SSH"
    )


class SshProvider:
    """Clusters on machines you already have."""

    name: ClassVar[str] = "ssh"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.MULTI_NODE, Capability.GPU, Capability.AUTOSTOP}
    )

    def __init__(self, context: ProviderContext) -> None:
        opts = context.options
        self.home = context.home
        self.hosts = parse_hosts(opts.get("hosts"))
        defaults: dict[str, str | None] = {}
        if opts.get("inventory"):
            if self.hosts:
                raise ConfigError("give --hosts or --inventory, not both")
            inventory = load_inventory(Path(str(opts["inventory"])))
            self.hosts = list(inventory.hosts)
            defaults = {
                "identity": inventory.identity,
                "known_hosts": inventory.known_hosts,
                "python": inventory.python,
            }
        identity = opts.get("identity") or defaults.get("identity") or "~/.ssh/id_ed25519"
        known = opts.get("known_hosts") or defaults.get("known_hosts") or "~/.ssh/known_hosts"
        self.identity = Path(str(identity)).expanduser()
        self.known_hosts = Path(str(known)).expanduser()
        python = opts.get("python") or defaults.get("python")
        self.python = str(python or "python3")
        # --python: use that interpreter as it is. Without it, each node gets a venv of its own
        # (in its folder: `down` removes it) with torch and this cloudtrain installed.
        self.install = not python
        self.allow_sudo = bool(opts.get("allow_sudo"))
        self.torch_index = str(opts["torch_index"]) if opts.get("torch_index") else None
        self.node_price = node_price(opts)
        # Hosts that exist already: a refused connection is an answer, not a machine booting.
        self.connect_timeout_s = float(opts.get("connect_timeout_s", 3))
        phases = "python torch cloudtrain verify"  # run in the bootstrap's own order
        if self.allow_sudo:  # packages (python3-venv, rsync; a driver on a GPU host that
            phases = "base nvidia-driver " + phases  # lacks one) through `sudo -n apt-get`
        self.phases = str(opts.get("bootstrap_phases") or phases)

    def _executor(self, host: Host) -> SshExecutor:
        identity = Path(host.identity) if host.identity else self.identity
        return SshExecutor(
            host.address,
            user=host.user,
            port=host.port,
            options=access.client_options(identity, self.known_hosts),
            connect_timeout_s=self.connect_timeout_s,
            retry_s=1.0,
        )

    def plan(self, spec: ClusterSpec) -> Plan:
        if not self.hosts:
            raise ConfigError("provider 'ssh' needs --hosts user@address[:port],… or --inventory")
        if spec.num_nodes > len(self.hosts):
            raise ConfigError(
                f"num_nodes {spec.num_nodes} is more than the {len(self.hosts)} --hosts given"
            )
        keys = [(self.identity, "--identity"), (self.known_hosts, "--known-hosts")]
        keys += [(Path(h.identity), f"identity of {h}") for h in self.hosts if h.identity]
        for path, flag in keys:
            if not path.is_file():
                raise ConfigError(f"{flag} {str(path)!r} is not a file")
        offer = Offer(
            "ssh",
            "byo",
            ("byo",),
            "byo",
            self.node_price,
            False,
            spec.resources.accelerator,
            spec.resources.count,
        )
        requests = [{"action": "connect", "host": str(h)} for h in self.hosts[: spec.num_nodes]]
        return Plan(spec=spec, offers=(offer,), requests=tuple(requests))

    def apply(self, plan: Plan, on_event: OnEvent = ignore_event) -> list[NodeInfo]:
        """Connect to every host first (nothing is written anywhere unless all answer), then
        record the nodes and start the check-only bootstrap on each."""
        spec = plan.spec
        hosts = self.hosts[: spec.num_nodes]
        facts = fan_out(lambda h: self._facts(h), hosts)
        existing = self.describe(spec.name)
        if len(existing) > spec.num_nodes:
            raise ConfigError(
                f"cluster {spec.name!r} has {len(existing)} nodes, more than the "
                f"{spec.num_nodes} asked for; `cloudtrain down {spec.name}` first"
            )
        for index, (host, fact) in enumerate(zip(hosts, facts, strict=True)):
            on_event(
                Event(
                    "node",
                    f"{host}: Python {fact['python']}, {fact['cpus']} CPUs, {fact['gpus']} GPUs",
                    node=index,
                )
            )
            if host.gpus is not None and fact["gpus"] != host.gpus:
                raise ConfigError(
                    f"{host}: the inventory says {host.gpus} GPUs, nvidia-smi shows {fact['gpus']}"
                )
            if spec.resources.count and fact["gpus"] < spec.resources.count:
                raise ConfigError(f"{host} has {fact['gpus']} GPUs, not {spec.resources.count}")
        fan_out(lambda i: self._make_node(spec, i, hosts[i], facts[i]), list(range(len(hosts))))
        exposed = [h.address for h in hosts if not access.is_loopback(h.address)]
        if exposed and spec.num_nodes > 1:
            on_event(Event("warning", trust_warning(exposed)))
        return self.describe(spec.name)

    def _facts(self, host: Host) -> dict[str, Any]:
        ex = self._executor(host)
        try:
            done = ex.run([self.python, "-c", FACTS, host.address], timeout=60)
        finally:
            ex.release()
        if done.returncode != 0:
            raise ProviderError("ssh", "NoPython", f"{host}: {self.python} failed: {done.stderr}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    def _root(self, home: str, cluster: str, index: int) -> str:
        return f"{home}/.cloudtrain/{cluster}/node-{index}"

    def _make_node(self, spec: ClusterSpec, index: int, host: Host, fact: dict[str, Any]) -> None:
        root = self._root(str(fact["home"]), spec.name, index)
        python = f"{root}/venv/bin/python" if self.install else self.python
        tags = json.dumps(
            {"cluster": spec.name, "index": index, "host": str(host), "node_python": python, **fact}
        )
        shape = bootstrap.NodeShape("ssh", spec.resources.accelerator, spec.resources.count)
        config = bootstrap.config(
            shape,
            install=self.install,
            phases=self.phases,
            python=self.python,
            root=root,
            torch_index=self.torch_index,
            agent="detached",
        )
        # the node's folders are the node user's alone (0700), also ones made looser before;
        # what is written in them is too (the executor's commands run under umask 077)
        folders = [str(Path(root).parent.parent), str(Path(root).parent), root]
        write = (
            f"mkdir -p {shlex.quote(root)}/bootstrap && chmod 700 {shlex.join(folders)} && "
            f"cd {shlex.quote(root)} && printf '%s\\n' {shlex.quote(tags)} > node.json.tmp && "
            "mv node.json.tmp node.json && "
            f"printf '%s' {shlex.quote(config)} > bootstrap/bootstrap.env"
        )
        ex = self._executor(host)
        try:
            ex.run(["sh", "-c", write]).check()
            self.home.mkdir(parents=True, exist_ok=True)
            script = self.home / "bootstrap.sh"
            script.write_text(bootstrap.script())
            ex.put(script, f"{root}/bootstrap/bootstrap.sh")
            ex.start_detached(
                ["bash", f"{root}/bootstrap/bootstrap.sh", f"{root}/bootstrap/bootstrap.env"],
                env={"CLOUDTRAIN_NODE_ROOT": root},
                cwd=root,
                job_dir=f"{root}/bootstrap/run",
            )
        finally:
            ex.release()

    def _node(self, cluster: str, index: int, host: Host) -> NodeInfo | None:
        ex = self._executor(host)
        try:
            done = ex.run(
                ["sh", "-c", f'cat "$HOME/.cloudtrain/{cluster}/node-{index}/node.json"'],
                timeout=60,
            )
        except ProviderError:  # what reaches it is known still: the executor needs it
            done = None
        finally:
            ex.release()
        if done is None or done.returncode == SSH_FAILED:  # no answer (a connection that
            # broke under load is no "node gone": that ended a bootstrap's wait once)
            return NodeInfo(
                cluster,
                index,
                str(host),
                host.address,
                None,
                "unreachable",
                user=host.user,
                extra=MappingProxyType(_reach(host)),
            )
        if done.returncode != 0:  # the host answered: no node of the cluster there
            return None
        try:
            tags = json.loads(done.stdout)
            root = self._root(str(tags["home"]), cluster, index)
        except (ValueError, KeyError, TypeError):  # half-written (the host went down while
            return None  # `apply` wrote it): no node; `apply` makes it again
        return NodeInfo(
            cluster=cluster,
            index=index,
            node_id=str(host),
            private_ip=host.address,
            public_ip=None,
            state="running",
            zone="byo",
            instance_type="byo",
            root=root,
            python=tags.get("node_python", self.python),
            user=host.user,
            ifname=tags.get("ifname") or None,
            bootstrap=(f"{root}/bootstrap/bootstrap.sh", f"{root}/bootstrap/bootstrap.env"),
            extra=MappingProxyType({**_reach(host), "gpus": tags.get("gpus", 0)}),
        )

    def describe(self, cluster: str, cluster_id: str | None = None) -> list[NodeInfo]:
        """The hosts that hold a node of `cluster`, and (state ``unreachable``) those that do
        not answer: the cluster's host list says they may."""
        found = fan_out(lambda p: self._node(cluster, p[0], p[1]), list(enumerate(self.hosts)))
        return [n for n in found if n is not None]

    def terminate(self, cluster: str, cluster_id: str | None = None) -> None:
        """Stop every process of the cluster on each host, and wait until none is left (TERM,
        KILL after `STOP_GRACE_S`, bounded), then remove its files; the machines stay. Blocks;
        idempotent. Raises naming the hosts it could not clean (their files are kept, so that
        `down` again finds what runs there)."""
        self._clean([(host, "stop-nodes", cluster) for host in self.hosts])

    def remove_nodes(self, cluster: str, cluster_id: str | None, indices: Collection[int]) -> None:
        """Stop every process of the nodes `indices` on their hosts and remove their folders;
        the cluster's other nodes, on the same hosts or not, stay (`RemovesNodes`). Raises
        naming the hosts it could not clean, as `terminate` does."""
        chosen = sorted(i for i in set(indices) if 0 <= i < len(self.hosts))
        self._clean([(self.hosts[i], "stop-node", f"{cluster}/node-{i}") for i in chosen])

    def _clean(self, places: Sequence[tuple[Host, str, str]]) -> None:
        """On each (host, how, folder): stop every process of the nodes under
        ``~/.cloudtrain/FOLDER`` (procs' ``stop-nodes``, or ``stop-node`` for one node's root),
        then remove the folder; at once on every host. Raises naming the hosts it could not
        clean (their files are kept, so that `down` again finds what runs there)."""
        failed: list[str] = []
        # the hosts' own Python runs the finder from its source: the nodes' venv (with
        # cloudtrain) may not be there yet, or any more
        finder = Path(procs.__file__).read_text()

        def clean(place: tuple[Host, str, str]) -> None:
            host, how, folder = place
            ex = self._executor(host)
            try:
                where = f"~/.cloudtrain/{folder}"
                argv = [self.python, "-c", finder, how, where, str(STOP_GRACE_S)]
                done = ex.run(argv, timeout=STOP_GRACE_S + 60)
                if done.returncode != 0:
                    failed.append(f"{host} ({_not_stopped(done.stdout, done.returncode)})")
                    return
                ex.run(["sh", "-c", f'rm -rf "$HOME/.cloudtrain/{folder}"']).check()
            except ProviderError as exc:
                failed.append(f"{host} ({exc.code})")
            finally:
                ex.release()

        fan_out(clean, places)
        if failed:
            raise ProviderError("ssh", "NotCleaned", "could not clean " + ", ".join(failed))

    def leftovers(self, cluster: str, cluster_id: str | None = None) -> list[str]:
        """What nodes that removed themselves when idle left on their hosts: a line each, with
        why (a node's folder is all else the ssh provider makes, and `describe` finds it)."""

        def said(item: tuple[int, Host]) -> list[str]:
            index, host = item
            ex = self._executor(host)
            try:
                done = ex.run(
                    [
                        "sh",
                        "-c",
                        f'cat "$HOME/.cloudtrain/{cluster}/node-{index}.stopped.json" 2>/dev/null',
                    ],
                    timeout=60,
                )
            except ProviderError:
                return []
            finally:
                ex.release()
            if done.returncode != 0:
                return []
            return [f"{host}: " + resident.said_when_stopped(f"node-{index}", done.stdout)]

        return [line for found in fan_out(said, list(enumerate(self.hosts))) for line in found]

    def clusters(self) -> list[str]:
        def names(host: Host) -> list[str]:
            ex = self._executor(host)
            try:
                done = ex.run(["sh", "-c", 'ls "$HOME/.cloudtrain" 2>/dev/null || true'])
            except ProviderError:
                return []
            finally:
                ex.release()
            return done.stdout.split()

        return sorted({n for found in fan_out(names, self.hosts) for n in found})

    def executor(self, node: NodeInfo) -> SshExecutor:
        """An executor for `node`, from its record; a record that lacks the port (written by
        a failed `up` while its host did not answer) is reached as the cluster's host list
        says. Raises `ProviderError` when neither names the host."""
        port = node.extra.get("port")
        if node.user and node.private_ip and port is not None:
            key = node.extra.get("identity")
            return self._executor(
                Host(str(node.user), str(node.private_ip), int(port), key and str(key))
            )
        listed = [h for h in self.hosts if str(h) == node.node_id]
        if not listed:
            raise ProviderError(
                "ssh",
                "UnknownHost",
                f"node {node.index} ({node.node_id}): "
                "its record names no port and the cluster's hosts do not "
                f"list it; `cloudtrain status --refresh {node.cluster}` "
                "reads it again",
            )
        return self._executor(listed[0])


def _reach(host: Host) -> dict[str, Any]:
    """What a node's record keeps of its host to reach it again (`SshProvider.executor`)."""
    return {"port": host.port, "identity": host.identity}


__all__: Sequence[str] = ["Host", "SshProvider", "parse_hosts"]
