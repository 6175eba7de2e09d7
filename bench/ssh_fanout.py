"""How does the SSH executor fan out over many nodes, and what does an incremental sync save?

    sudo .venv/bin/python bench/ssh_fanout.py [--hosts 1 8 32] [--rounds 5]
                                              [--files 500] [--file-kb 100]

Runs as root (sshd must bind test addresses and log root in); exits with a message otherwise.
Every node is a real sshd (tests/sshd.py's `SshHost`) on a loopback address, 127.0.0.2 …
127.0.0.(N+1), presenting the cluster host key of `access.host_key(HOME, "bench")` and letting
`access.cluster_key(HOME, "bench")` log in as root; the client pins that host key through
`access.known_hosts` and connects with `access.ssh_options` (no trust on first use), exactly as
cloudtrain does. HOME, the trees and the remote folders live in one temporary folder that is
removed at the end; CLOUDTRAIN_SSH_LOOPBACK_ONLY=1 is set, so no packet leaves the machine.

1. Fan-out. For each N of --hosts, one `SshExecutor` per host. The first ``run(["true"])`` on
   each opens its ControlMaster connection (handshake, auth): that is timed once over all N
   hosts through `fan_out` and shown as "first connection", not counted below. Then --rounds
   rounds, each running ``true`` on all N hosts (a) one host after the other and (b) through
   `fan_out` (threads, at most 32 at a time), in that order; it prints the medians and
   sequential / fan-out. Every executor is closed (its master connection ends) before the next
   N, so each N starts from cold connections.
2. Workdir sync, with one host: a tree of --files files of --file-kb KB of random bytes in 10
   subfolders (50 MB by default). It times the first `SshExecutor.put` (a full copy into an
   empty folder), then --rounds times: change ONE file (new random bytes, same size) and time
   `put` (incremental), then time a full copy of the same tree to the same place: rsync with
   put's own flags (``-az --delete``) plus ``--whole-file --ignore-times``, so every file is
   sent whole again, over the same ssh options and the same warm master connection
   (``ControlPath``). Both sides thus pay the same process start-up and no handshake; the
   difference is only what is sent. It prints the medians and full copy / incremental.
   Contents are checked after every put.

3. Remote shell. sshd runs every command as ``SHELL -c COMMAND`` with the user's login shell,
   and Debian's bash then reads ~/.bashrc (SSH_CLIENT is set). The bench times root's shell
   running ``true`` that way, locally, and prints it: on a loopback node that start-up is much
   of each command's time (and all of it is CPU, which bounds what fan-out can gain on few
   cores). A node whose ~/.bashrc does little pays little.

At the end it prints a fixed-width summary to quote in a README, and the bench's wall time.
Ctrl-C stops it; executors are closed and every sshd it started is stopped either way.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import pwd
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cloudtrain import access  # noqa: E402
from cloudtrain.executors.base import fan_out  # noqa: E402
from cloudtrain.executors.ssh import SshExecutor, control_dir  # noqa: E402
from tests.sshd import SshHost  # noqa: E402

CLUSTER = "bench"


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def run_true(ex: SshExecutor) -> None:
    ex.run(["true"], timeout=60).check()


def one_after_another(executors: list[SshExecutor]) -> None:
    for ex in executors:
        run_true(ex)


def all_at_once(executors: list[SshExecutor]) -> None:
    fan_out(run_true, executors)


def preflight() -> None:
    """Fail clearly (not with a pytest skip) when this machine cannot run the bench."""
    if os.geteuid() != 0:
        raise SystemExit("bench/ssh_fanout.py starts sshd on loopback addresses: run it as root")
    for tool in ("/usr/sbin/sshd", "ssh", "rsync"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench/ssh_fanout.py needs {tool}; it is not installed")


def end_master(host: SshHost) -> None:
    """End a master connection to `host` that `SshExecutor.close` does not know of: one whose
    first connection was interrupted (Ctrl-C) after ssh had already put it in the background."""
    argv = ["ssh", "-o", f"ControlPath={control_dir()}/%C", "-p", str(host.port),
            "-O", "exit", f"root@{host.host}"]  # fmt: skip
    subprocess.run(argv, capture_output=True, timeout=30, check=False)


def tool_versions() -> str:
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
    rsync = subprocess.run(["rsync", "--version"], capture_output=True, text=True, check=False)
    ssh_v = (ssh.stderr or ssh.stdout).strip().split(",")[0]
    rsync_v = " ".join(rsync.stdout.split()[:3])
    return f"{ssh_v}, {rsync_v}, {os.cpu_count()} CPUs"


ROOT_HOME = Path(pwd.getpwuid(0).pw_dir)


def shell_startup(rounds: int) -> tuple[str, float]:
    """root's login shell and the median time it takes to run ``true`` the way sshd starts it
    for a command (``SHELL -c``, with sshd's environment), measured locally: every command on
    a node pays it once, and ``rsync`` once more for the remote rsync. Debian's bash reads
    ~/.bashrc when SSH_CLIENT is set, so what root's ~/.bashrc does shows up here."""
    user = pwd.getpwuid(0)
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
           "SHELL": user.pw_shell, "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
           "SSH_CLIENT": "127.0.0.1 50000 22",
           "SSH_CONNECTION": "127.0.0.1 50000 127.0.0.2 22"}  # fmt: skip
    argv = [user.pw_shell, "-c", "true"]
    runs = [timed(subprocess.run, argv, env=env, check=True) for _ in range(rounds)]
    return user.pw_shell, statistics.median(runs)


def bench_fanout(
    home: Path, hosts: list[SshHost], sizes: list[int], rounds: int, opened: list[SshExecutor]
) -> list[tuple[int, float, float, float]]:
    """(N, first connection s, sequential s, fan-out s) for each N."""
    options = access.ssh_options(home, CLUSTER)
    rows = []
    for n in sizes:
        executors = [
            SshExecutor(h.host, user="root", port=h.port, options=options, connect_timeout_s=30)
            for h in hosts[:n]
        ]
        opened.extend(executors)
        try:
            connect = timed(all_at_once, executors)
            sequential, parallel = [], []
            for _ in range(rounds):
                sequential.append(timed(one_after_another, executors))
                parallel.append(timed(all_at_once, executors))
        finally:
            for ex in executors:
                ex.close()
        row = (n, connect, statistics.median(sequential), statistics.median(parallel))
        rows.append(row)
        print(f"N={n}: first connection {connect:.3f} s, sequential {row[2]:.3f} s, "
              f"fan_out {row[3]:.3f} s", flush=True)  # fmt: skip
    return rows


def make_tree(root: Path, files: int, size: int) -> list[Path]:
    paths = []
    for i in range(files):
        path = root / f"part{i % 10}" / f"file{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def bench_sync(
    home: Path,
    host: SshHost,
    tmp: Path,
    files: int,
    size: int,
    rounds: int,
    opened: list[SshExecutor],
) -> tuple[float, float, float]:
    """(first put s, incremental put s, full copy s): medians of `rounds` for the last two."""
    options = access.ssh_options(home, CLUSTER)
    tree, remote = tmp / "tree", tmp / "remote" / "work"
    paths = make_tree(tree, files, size)
    ex = SshExecutor(host.host, user="root", port=host.port, options=options, connect_timeout_s=30)
    opened.append(ex)
    try:
        run_true(ex)  # the connection is warm for both ways of copying
        first = timed(lambda: ex.put(tree, str(remote)))
        copied = sorted(p.relative_to(remote) for p in remote.rglob("*.bin"))
        if copied != sorted(p.relative_to(tree) for p in paths):
            raise SystemExit("the first put did not copy the tree")
        # The same ssh, options and ControlPath as the executor: rsync's ssh rides its master.
        ssh = shlex.join(["ssh", *options, "-o", f"ControlPath={control_dir()}/%C",
                          "-p", str(host.port)])  # fmt: skip
        full_copy = ["rsync", "-az", "--delete", "--whole-file", "--ignore-times", "-e", ssh,
                     f"{tree}/", f"root@{host.host}:{shlex.quote(str(remote))}"]  # fmt: skip
        incremental, full = [], []
        for i in range(rounds):
            changed = paths[(i * 37) % len(paths)]
            changed.write_bytes(os.urandom(size))
            # rsync's quick check compares size and mtime: a same-size rewrite within the second
            # the first put copied looks unchanged (CI saw it). An edit seconds later is the case.
            mtime = changed.stat().st_mtime + 2
            os.utime(changed, (mtime, mtime))
            incremental.append(timed(lambda: ex.put(tree, str(remote))))
            if not filecmp.cmp(changed, remote / changed.relative_to(tree), shallow=False):
                raise SystemExit(f"the incremental put did not copy {changed}")
            full.append(timed(lambda: subprocess.run(full_copy, check=True, capture_output=True)))
    finally:
        ex.close()
    row = (first, statistics.median(incremental), statistics.median(full))
    print(f"sync: first put {row[0]:.3f} s, incremental put {row[1]:.3f} s, "
          f"full copy {row[2]:.3f} s", flush=True)  # fmt: skip
    return row


def summary(
    fanout: list[tuple[int, float, float, float]],
    sync: tuple[float, float, float],
    rounds: int,
    files: int,
    kb: int,
    shell: tuple[str, float],
) -> str:
    lines = [
        f"SSH fan-out: `true` on every host, warm ControlMaster connections, "
        f"median of {rounds} rounds",
        f"{'hosts':>5}  {'first connection s':>18}  {'sequential s':>12}  {'fan_out s':>9}  "
        f"{'sequential/fan_out':>18}",
    ]
    for n, connect, seq, par in fanout:
        lines.append(f"{n:>5}  {connect:18.3f}  {seq:12.3f}  {par:9.3f}  {seq / par:18.2f}")
    first, incremental, full = sync
    mb = files * kb / 1000
    lines += [
        "",
        f"Workdir sync, one host: {files} files x {kb} KB = {mb:.0f} MB, one file changed, "
        f"median of {rounds} rounds",
        f"{'first put s':>11}  {'full copy s':>11}  {'incremental put s':>17}  "
        f"{'full/incremental':>16}",
        f"{first:11.3f}  {full:11.3f}  {incremental:17.3f}  {full / incremental:16.1f}",
        "",
        f"Every remote command starts root's shell ({shell[0]} -c) on the node: "
        f"{shell[1]:.3f} s here.",
    ]
    return "\n".join(lines)


def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--file-kb", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="2 hosts, 1 round, 1 MB (CI)")
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.rounds, args.files, args.file_kb = [1, 2], 1, 10, 100
    if not all(1 <= n <= 253 for n in args.hosts) or args.rounds < 1 or args.files < 1:
        parser.error("--hosts must be 1 … 253 (127.0.0.2 … 127.0.0.254); --rounds, --files ≥ 1")
    preflight()
    os.environ["CLOUDTRAIN_SSH_LOOPBACK_ONLY"] = "1"

    hosts: list[SshHost] = []
    opened: list[SshExecutor] = []
    with tempfile.TemporaryDirectory(prefix="cloudtrain-sshbench-") as folder:
        tmp = Path(folder)
        home = tmp / "home"
        try:
            _, user_public = access.cluster_key(home, CLUSTER)
            host_private, _ = access.host_key(home, CLUSTER)
            start = time.perf_counter()
            for i in range(max(args.hosts)):  # root's own ~ (its ~/.bashrc: 3. above)
                address = f"127.0.0.{i + 2}"
                hosts.append(SshHost(tmp / f"h{i}", address, host_private, user_public, ROOT_HOME))
            up = time.perf_counter() - start
            access.known_hosts(home, CLUSTER, [h.address for h in hosts])
            print(f"started {len(hosts)} sshd in {up:.2f} s", flush=True)
            fanout = bench_fanout(home, hosts, args.hosts, args.rounds, opened)
            shell = shell_startup(args.rounds)
            sync = bench_sync(home, hosts[0], tmp, args.files, args.file_kb * 1000, args.rounds,
                              opened)  # fmt: skip
        finally:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a 2nd Ctrl-C: clean up
            try:
                for ex in opened:
                    ex.close()
                for host in hosts:
                    end_master(host)
                    host.stop()
            finally:
                signal.signal(signal.SIGINT, previous)
    print()
    print(summary(fanout, sync, args.rounds, args.files, args.file_kb, shell))
    print(f"\n({tool_versions()}; the bench took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit("interrupted; every executor was closed and every sshd stopped") from None
