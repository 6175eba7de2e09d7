"""A real Slurm cluster for the tests, on this machine: a munged, a slurmctld and N slurmd's
(nodes n1, n2 …, each a daemon of its own on its own port of 127.0.0.1, n1 addressed as that and
the others by the name localhost), with their key, config,
state and logs in one folder, their spools and sockets in a short one under /tmp, and a cluster
name of their own, so that two labs (two test processes) run at once without meeting. Clients
reach it through ``SLURM_CONF`` (`SlurmLab.env`, `SlurmLab.run`).

The GPUs are declared, not real: each node has ``gpu:a100:<gpus>``, whose "devices" are links to
/dev/null in the folder (Slurm 22.05 drops a GPU without a device file, and a File= that is not a
device is an error), which is all the scheduler needs to place, refuse and count them."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.conftest import require_tool, unavailable
from tests.sshd import free_port

HOST = "127.0.0.1"
TOOLS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmstepd",
         "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")  # fmt: skip
#: The states a job ends in.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE")  # fmt: skip


class SlurmLab:
    """A lab in `folder` with nodes n1 … n`nodes`; `start` it, `close` it."""

    def __init__(self, folder: Path, nodes: int = 2, gpus: int = 8) -> None:
        for tool in TOOLS:
            require_tool(tool)
        if os.geteuid() != 0:
            unavailable("a Slurm lab needs root: slurmd runs jobs as their users (CI runs as root)")
        # A Unix socket's path has at most 107 bytes, and slurmd makes one per step in its
        # spool folder (``n1_<job>.4294967291``): the spools and munge's socket live in a short
        # folder of the lab's own under /tmp (a test's folder under xdist is too long a path).
        self.sockets = Path(tempfile.mkdtemp(prefix="slurmlab-", dir="/tmp"))
        self.folder, self.gpus = folder, gpus
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.name = f"lab{secrets.token_hex(6)}"  # the ClusterName: lower case, the lab's own
        self.conf, self.munge_socket = folder / "slurm.conf", self.sockets / "munge.sock"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)
        #: What a Slurm client needs beyond its own environment (a shell's, a login session's).
        self.client_env = {"SLURM_CONF": str(self.conf)}
        #: The lab's daemons by name; every process of the lab (these, slurmstepd's, the
        #: jobs') has the lab's SLURM_CONF in its environment, which is how `leftovers` finds them.
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        """munged, slurmctld, the slurmd's; returns once every node is idle (a second or so)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "gpus"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.sockets / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._munged()
        ctld_port = free_port(HOST)
        self._configure(ctld_port)
        self._daemon("slurmctld", "/usr/sbin/slurmctld", "-D", "-f", str(self.conf))
        # clients retry a controller that is not there for 9 s: wait until it listens
        self._wait_up(lambda: _listening(ctld_port), 10, "slurmctld listening")
        for node in self.nodes:
            argv = ("/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf))
            self._daemon(f"slurmd-{node}", *argv)
        self._wait_up(self._all_idle, 30, "every node idle")

    def _munged(self) -> None:
        """A munged of the lab's own with a key of its own: what another lab (or the machine's
        munged) signs does not decode here. In the foreground (-F, so it is our child) it logs
        to stderr, not to --log-file; -f: the folder is not executable by all, as munged wants."""
        key = self.folder / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        files = {
            "socket": self.munge_socket,
            "key-file": key,
            "pid-file": self.folder / "munged.pid",
            "seed-file": self.folder / "munged.seed",
        }
        options = [f"--{option}={path}" for option, path in files.items()]
        self._daemon("munged", "/usr/sbin/munged", "-F", "-f", *options, log=True)
        self._wait_up(self.munge_socket.exists, 10, "munged's socket")

    def _configure(self, ctld_port: int) -> None:
        """slurm.conf, gres.conf and cgroup.conf. The nodes declare what a GPU node would
        (a CPU per GPU at least), and `config_overrides` makes slurmd report that rather than
        this machine's cores: jobs are placed by the declaration, not by what is here."""
        f, here = self.folder, socket.gethostname()
        cpus = max(self.gpus, os.cpu_count() or 1)
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
        settings: dict[str, object] = {
            "ClusterName": self.name,
            "SlurmctldHost": f"{here}({HOST})",
            "SlurmctldPort": ctld_port,
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",  # auth/munge and cred/munge both read it
            "StateSaveLocation": f / "state",
            "SlurmctldPidFile": f / "slurmctld.pid",
            "SlurmctldLogFile": f / "slurmctld.log",
            "SlurmdSpoolDir": self.sockets / "spool/%n",
            "SlurmdPidFile": self.sockets / "spool/%n/slurmd.pid",
            "SlurmdLogFile": f / "slurmd-%n.log",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc",  # a step's processes: the stepd's descendants
            "TaskPlugin": "task/none",
            "MpiDefault": "none",
            "AccountingStorageType": "accounting_storage/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "JobCompType": "jobcomp/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",  # memory is not scheduled
            "GresTypes": "gpu",
            "SlurmdParameters": "config_overrides",
            "ReturnToService": 2,
            # a batch job starts within a second; a pending one's start is estimated each second
            "SchedulerParameters": "batch_sched_delay=0,bf_interval=1",
            "KillWait": 1,  # seconds from a cancelled step's SIGTERM to its SIGKILL (30)
            "MailProg": "/bin/true",
        }
        # n1 by its address, the others by a host name (as most sites name their nodes): the
        # provider resolves a name on the login node
        addrs = [HOST] + ["localhost"] * (len(self.nodes) - 1)
        nodes = [
            f"NodeName={node} NodeHostname={here} NodeAddr={addr} Port={free_port(HOST)} "
            f"CPUs={cpus} RealMemory={memory} Gres=gpu:a100:{self.gpus} State=UNKNOWN"
            for node, addr in zip(self.nodes, addrs, strict=True)
        ]
        partition = "PartitionName=gpu Nodes=ALL Default=YES MaxTime=1:00:00 State=UP"
        lines = [f"{key}={value}" for key, value in settings.items()] + nodes + [partition]
        self.conf.write_text("\n".join(lines) + "\n")
        for i in range(self.gpus):
            (f / "gpus" / f"gpu{i}").symlink_to("/dev/null")
        (f / "gres.conf").write_text(
            f"AutoDetect=off\nName=gpu Type=a100 File={f / 'gpus'}/gpu[0-{self.gpus - 1}]\n"
        )
        # slurmd loads a cgroup plugin even when nothing uses cgroups; on a cgroup v2 host
        # without systemd (a container) v2's would ask systemd for a scope over D-Bus, and fail
        (f / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _daemon(self, name: str, *argv: str, log: bool = False) -> None:
        """Start `argv` in a session of its own, its stderr to ``<name>.log`` where the daemon
        logs there (munged in the foreground), else to ``<name>.stderr``."""
        with (self.folder / f"{name}.{'log' if log else 'stderr'}").open("ab") as sink:
            self.daemons[name] = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                start_new_session=True,
            )

    def _all_idle(self) -> bool:
        shown = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
        states = dict(line.split() for line in shown.stdout.splitlines())
        return all(states.get(node) == "idle" for node in self.nodes)

    def _wait_for(self, ready: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm lab: no {what} after {seconds} s\n{self.logs()}")
            time.sleep(0.1)

    def _wait_up(self, ready: Callable[[], bool], seconds: float, what: str) -> None:
        """`_wait_for`, failing at once when a daemon exits (a config it refuses, a port taken)."""

        def up() -> bool:
            if exited := [name for name, proc in self.daemons.items() if proc.poll() is not None]:
                raise RuntimeError(f"Slurm lab: {', '.join(exited)} exited\n{self.logs()}")
            return ready()

        self._wait_for(up, seconds, what)

    def lose_node_under(self, train: subprocess.Popen[str], once: str, node: str = "n2") -> str:
        """Set `node` down once `train` (a `cloudtrain train` with its output piped) printed
        `once`; everything it printed, after it ended (within 300 s)."""
        assert train.stdout is not None
        out = ""
        while once not in out:
            line = train.stdout.readline()
            assert line, out
            out += line
        self.run("scontrol", "update", f"nodename={node}", "state=down", "reason=test")
        rest, _ = train.communicate(timeout=300)
        return out + rest

    def run(
        self, *argv: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """`argv` (a Slurm client, usually) against this lab, in its folder (where a batch
        job's slurm-<id>.out lands), its output captured as text."""
        return subprocess.run(
            argv,
            env=self.env,
            cwd=self.folder,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def submit(self, *args: str) -> str:
        """``sbatch args``: the job's id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """JobState from ``scontrol show job``: PENDING, RUNNING, COMPLETED, CANCELLED …"""
        shown = self.run("scontrol", "--oneliner", "show", "job", job_id).stdout
        found = re.search(r"\bJobState=(\S+)", shown)
        if found is None:
            raise RuntimeError(f"no JobState in: {shown}")
        return found.group(1)

    def wait_state(self, job_id: str, *states: str, seconds: float = 30) -> str:
        """Poll until the job's state is one of `states`; that state. slurmctld schedules
        once a second, its first pass 3 s after it started: a lab's first job waits that long."""
        seen = [""]

        def reached() -> bool:
            seen[0] = self.job_state(job_id)
            return seen[0] in states

        self._wait_for(reached, seconds, f"job {job_id} in {states}")
        return seen[0]

    def queue(self) -> list[str]:
        """The ids of the jobs squeue shows (pending, running, completing)."""
        return self.run("squeue", "--noheader", "--format=%A").stdout.split()

    def logs(self, lines: int = 15) -> str:
        """The last `lines` of every daemon's log, and of the stderr of those that exited."""
        parts = []
        for name, proc in self.daemons.items():
            files = [self.folder / f"{name}.log"]
            if proc.poll() is not None:
                files.append(self.folder / f"{name}.stderr")
            for file in (f for f in files if f.exists()):
                tail = file.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"== {file.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def leftovers(self) -> list[int]:
        """The lab's live processes, by its SLURM_CONF in their environment (what `env -i`
        started would escape this; a job of a test has no reason to)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):  # gone meanwhile
                if marker in environ.read_bytes().split(b"\0"):
                    found.append(int(environ.parent.name))
        return found

    def job_processes(self) -> list[int]:
        """`leftovers` but the lab's daemons (and slurmctld's helper): what runs of jobs."""
        daemons = {proc.pid for proc in self.daemons.values()}
        return [
            pid for pid in self.leftovers() if pid not in daemons and _parent(pid) not in daemons
        ]

    def close(self) -> None:
        """Cancel every job and wait until the queue is empty, stop the daemons (slurmd's,
        slurmctld, munged) by PID, then kill what is left of the lab and raise if anything was."""
        try:
            ctld = self.daemons.get("slurmctld")
            if ctld is not None and ctld.poll() is None and (jobs := self.queue()):
                self.run("scancel", *jobs)
                self._wait_for(lambda: not self.queue(), 30, "empty queue after scancel")
        finally:
            for proc in reversed(self.daemons.values()):
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            try:
                self._kill_leftovers()
            finally:
                shutil.rmtree(self.sockets, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """Kill what is left of the lab, and raise if anything was; returns once it is dead."""
        with contextlib.suppress(RuntimeError):  # a step's last processes may still be exiting
            self._wait_for(lambda: not self.leftovers(), 2, "end of the lab's processes")
        if left := self.leftovers():
            described = [_command(pid) for pid in left]
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(RuntimeError):  # SIGKILL is not instant either
                self._wait_for(lambda: not self.leftovers(), 5, "end of the killed processes")
            raise RuntimeError(f"Slurm lab {self.name}: processes left (killed): {described}")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


def _parent(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    return 0


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return f"{pid} " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return str(pid)


@contextlib.contextmanager
def lab(folder: Path, nodes: int = 2, gpus: int = 8) -> Iterator[SlurmLab]:
    """A started lab in `folder`, closed afterwards (also when it failed to start)."""
    running = SlurmLab(folder, nodes, gpus)
    try:
        running.start()
        yield running
    finally:
        running.close()
