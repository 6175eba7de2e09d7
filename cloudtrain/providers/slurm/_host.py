"""A Slurm node's host: the one long step that keeps what cloudtrain runs on the node inside the
allocation. Standard library only: it runs before anything is installed on the node, as
``python -c SOURCE serve BASE INDEX`` (`SOURCE`, this file's text) in a step of the batch
script's own on each node (node INDEX of the cluster: its folder is ``BASE/node-INDEX``), so that
a node lost ends only its own host (``--no-kill``); its clients are ``python -c SOURCE run ROOT
-- ARGV…`` and ``python -c SOURCE spawn ROOT`` (a request on stdin), each in a short ``srun
--overlap`` step.

Why: Slurm ends a step's processes when the step ends (every one of them where proctrack is
cgroup, which most sites run; where it is linuxproc, an orphan escapes it instead), so nothing a
command starts to outlive it (the node agent it heals, a warm server, a job's launcher) may be
started in a short step. Every command is run by this host, as its child, and the short step
only carries its input, output and exit status: ``run`` hands the host its own stdin, stdout and
stderr (``SCM_RIGHTS``) with the argv, environment and folder, and exits with the command's
status; ``spawn`` asks for a detached start (``/bin/sh -c SCRIPT cloudtrain-detach JOB_DIR
ARGV…``, the executors' detach script) and prints its pid. What they start stays in the long
step until the allocation ends: ``scancel`` stops every one of them, on every node.

The host listens on ``ROOT/host.sock`` (the folder is the user's alone, 0700) and serves only
its own user (the peer's uid, ``SO_PEERCRED``); each client in a thread of its own. It is the
child subreaper of what it starts, so a daemon that a command forks stays its descendant (where
proctrack is linuxproc, that is how Slurm finds a step's processes), and it reaps those orphans.
A command whose client goes (srun killed, a timeout) is killed with its process group. On the
step's SIGTERM (``scancel``) the host outlives what it started: it ends once they have, KILLing
what is left after a grace. When the node's folder goes (its agent removed the node: autostop)
the host TERMs what it started and ends the same way, and with the last host the allocation.

Once listening, the host writes ``ROOT/host.json`` (its pid, the node's hostname, Slurm name,
job and index, and whether BASE is the login node's folder: its ``owner.json`` is there)
atomically; ``ready BASE``, one task per node in one step, prints each node's as a JSON line,
which the controller waits for before it starts the bootstraps. A step finds its node's folder
by that file (`own`: Slurm's name for the node and the job's id), not by its own node id, which
a job that lost a node numbers anew; so does ``notice BASE``, the notice before the time limit.

Where BASE is the node's own (a site without a shared home), the host removes its node's folder,
and BASE when it is left empty, when it ends: nothing of the cluster stays on the node.

What is written on a node, and read from one that does not share the login node's folder, goes
through steps of `cloudtrain.node.files`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

SOCKET = "host.sock"
READY = "host.json"
#: The file of the login node's own folder (the cluster's): a BASE that has it is shared.
OWNER = "owner.json"
_PR_SET_CHILD_SUBREAPER = 36
#: How long the host lets what it started end by the step's SIGTERM before it KILLs them.
STOP_GRACE_S = 10.0


def _subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: orphans go to init
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


#: The children a client's thread waits for itself: `_reap` leaves them to it. Held while one
#: is started, so that it cannot be reaped before it is known.
_LOCK = threading.Lock()
_OWN: set[int] = set()


def _reap() -> None:
    """Reap the orphans that came to the host (it is their subreaper)."""
    while True:
        with _LOCK:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in _OWN:
                return  # none ended, or a thread's, which it reaps at once
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)


def _start(
    argv: list[str], env: dict[str, str], cwd: str, stdio: tuple[int, int, int]
) -> subprocess.Popen[bytes]:
    """`argv` started as a child the caller waits for (`_OWN`), in a session of its own."""
    with _LOCK:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdio[0],
            stdout=stdio[1],
            stderr=stdio[2],
            start_new_session=True,
        )
        _OWN.add(proc.pid)
    return proc


def _done(proc: subprocess.Popen[bytes]) -> None:
    with _LOCK:
        _OWN.discard(proc.pid)


def descendants(pid: int) -> set[int]:
    """Every live process under `pid`, from /proc's parent links."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _stop(since: float, grace_s: float) -> bool:
    """After the step's SIGTERM: whether every process the host started has ended, after
    `grace_s` by SIGKILL. Until then the host lives on, so that they stay its descendants
    for Slurm's own SIGKILL (which finds a step's processes by their parents, where proctrack is
    linuxproc: a host that died at once would let the slower ones go)."""
    _reap()
    left = descendants(os.getpid())
    if left and time.monotonic() - since > grace_s:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return not left


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _strings(value: object) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return [str(v) for v in value]


def _env(value: object) -> dict[str, str] | None:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    return {str(k): str(v) for k, v in value.items()}


def _spawn(request: dict[str, object]) -> dict[str, object]:
    """Start ``sh -c SCRIPT cloudtrain-detach JOB_DIR ARGV`` (it detaches ARGV): its pid."""
    script, argv, env = (
        request.get("script"),
        _strings(request.get("argv")),
        _env(request.get("env")),
    )
    cwd, job_dir = request.get("cwd"), request.get("job_dir")
    if not (isinstance(script, str) and argv is not None and env is not None):
        return {"error": "a request needs script, argv and env"}
    if not (isinstance(cwd, str) and isinstance(job_dir, str)):
        return {"error": "a request needs cwd and job_dir"}
    try:
        os.makedirs(job_dir, mode=0o700, exist_ok=True)
        detach = ["/bin/sh", "-c", script, "cloudtrain-detach", job_dir, *argv]
        stdio = (subprocess.DEVNULL, subprocess.PIPE, subprocess.PIPE)
        proc = _start(detach, {**os.environ, **env}, cwd, stdio)
    except OSError as exc:
        return {"error": f"{exc.strerror}: {exc.filename}"}
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        _done(proc)
    pid = out.decode(errors="replace").strip()
    if proc.returncode != 0 or not pid.isdigit():
        said = (err or out).decode(errors="replace").strip()[-2000:]
        return {"error": said or f"exit {proc.returncode}"}
    return {"pid": int(pid)}


def _run(conn: socket.socket, request: dict[str, object], fds: list[int]) -> dict[str, object]:
    """Run the request's argv as the host's child on the client's stdin, stdout and stderr
    (`fds`) until it exits, or until the client goes (then it is killed, its group too)."""
    argv, env, cwd = _strings(request.get("argv")), _env(request.get("env")), request.get("cwd")
    if not argv or env is None or not isinstance(cwd, str) or len(fds) != 3:
        return {"error": "a request needs argv, env, cwd and three descriptors"}
    try:
        proc = _start(argv, env, cwd, (fds[0], fds[1], fds[2]))
    except OSError as exc:
        return {"error": f"{exc.strerror}: {exc.filename or argv[0]}", "code": 127}
    finally:
        for fd in fds:
            os.close(fd)
    try:
        while proc.poll() is None:
            if select.select([conn], [], [], 0.2)[0] and not conn.recv(1):  # the client went
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        _done(proc)
    code = proc.returncode
    return {"code": 128 - code if code < 0 else code}


def _serve_one(conn: socket.socket) -> None:
    """One client: its request (and descriptors), answered with one JSON line."""
    fds: list[int] = []
    with conn:
        try:
            if _peer_uid(conn) != os.getuid():
                return
            head, fds, _, _ = socket.recv_fds(conn, 1, 3)
            with conn.makefile("rb") as stream:
                request = json.loads(stream.readline(1 << 24))
            if not isinstance(request, dict):
                answer: dict[str, object] = {"error": "no request"}
            elif head == b"r":
                taken, fds = fds, []  # `_run` closes them
                answer = _run(conn, request, taken)
            else:
                answer = _spawn(request)
        except (OSError, ValueError) as exc:
            answer = {"error": f"bad request: {exc}"}
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(answer).encode() + b"\n")


def serve(base: str, index: int, grace_s: float = STOP_GRACE_S) -> None:
    """Host the node ``BASE/node-INDEX`` until the step ends."""
    root = os.path.abspath(os.path.join(base, f"node-{index}"))
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.chdir(root)  # the socket is bound by a relative name: a long path fits
    _subreaper()
    if os.path.exists(SOCKET):
        os.unlink(SOCKET)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(SOCKET)
    os.chmod(SOCKET, 0o600)
    server.listen(16)
    server.settimeout(0.5)
    stopping: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
    shared = os.path.isfile(os.path.join(base, OWNER))
    facts = {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "index": index,
        "node": os.environ.get("SLURMD_NODENAME", ""),
        "job": os.environ.get("SLURM_JOB_ID", ""),
    }
    with open(READY + ".tmp", "w") as f:
        json.dump({**facts, "shared": shared}, f)
    os.replace(READY + ".tmp", READY)
    try:
        _host(root, server, grace_s, stopping)
    finally:
        if not shared:  # the node's own folder: nothing of the cluster stays on the node
            os.chdir("/")
            shutil.rmtree(root, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(base)


def _host(root: str, server: socket.socket, grace_s: float, stopping: list[float]) -> None:
    while True:
        _reap()
        if not stopping and not os.path.isdir(root):
            # The node's agent removed the node (autostop): what is left of it ends, then the
            # host; with the last node's host the step ends, the batch script, and the job.
            for pid in descendants(os.getpid()):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            stopping.append(time.monotonic())
        if stopping:
            if _stop(stopping[0], grace_s):
                return
            time.sleep(0.1)
            continue
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


def _ask(root: str, head: bytes, request: dict[str, object], fds: list[int]) -> dict[str, object]:
    """The host's answer to `request` (with `fds`); ``{"error": …}`` when there is no host."""
    os.chdir(root)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(SOCKET)
        except OSError as exc:
            return {"error": f"no host on this node ({exc.strerror})", "code": 3}
        socket.send_fds(conn, [head], fds)
        conn.sendall(json.dumps(request).encode() + b"\n")
        with conn.makefile("rb") as stream:
            answer = json.loads(stream.readline(1 << 20) or b"{}")
    return answer if isinstance(answer, dict) else {}


def spawn(root: str) -> int:
    """Hand the request on stdin to the host of the node at `root`; print the pid it started."""
    request = json.loads(sys.stdin.read())
    answer = _ask(root, b"s", request, [])
    if "pid" not in answer:
        print(answer.get("error", "the host gave no answer"), file=sys.stderr)
        return 1
    print(answer["pid"])
    return 0


def run(root: str, argv: list[str]) -> int:
    """Have the host of the node at `root` run `argv` here, as it were: on this process's
    stdin, stdout and stderr, in its folder and environment; its exit status."""
    cwd = os.getcwd()
    answer = _ask(root, b"r", {"argv": argv, "env": dict(os.environ), "cwd": cwd}, [0, 1, 2])
    if "error" in answer:
        print(f"cloudtrain host: {answer['error']}", file=sys.stderr)
    code = answer.get("code", 1 if "error" in answer else 0)
    return code if isinstance(code, int) else 1


def own(base: str) -> dict[str, object] | None:
    """The ready file of this node's host in this job (`serve`'s, its folder as ``root``), of
    the folders in `base`; None when it has none yet."""
    me = (os.environ.get("SLURMD_NODENAME", ""), os.environ.get("SLURM_JOB_ID", ""))
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(base)):
            if not name.startswith("node-"):
                continue
            said: object = None
            with (
                contextlib.suppress(OSError, ValueError),
                open(os.path.join(base, name, READY)) as f,
            ):
                said = json.load(f)
            if isinstance(said, dict) and (said.get("node"), said.get("job")) == me:
                return {**said, "root": os.path.join(base, name)}
    return None


def ready(base: str) -> None:
    """Print this node's ready file (``{}`` when its host is not up yet)."""
    print(json.dumps(own(base) or {}), flush=True)


def notice(base: str) -> None:
    """Tell this node's jobs that the allocation ends soon (``cloudtrain.node notice``)."""
    found = own(base)
    if found is None:
        sys.exit("cloudtrain host: no node of this job here")
    argv = [sys.executable, "-m", "cloudtrain.node", "notice", "--root", str(found["root"])]
    os.execv(sys.executable, [*argv, "--source", "slurm", "--action", "end"])


if __name__ == "__main__":
    verb, args = sys.argv[1:2], sys.argv[2:]
    if verb == ["serve"]:
        serve(args[0], int(args[1]), *map(float, args[2:3]))
    elif verb == ["spawn"]:
        sys.exit(spawn(args[0]))
    elif verb == ["run"] and args[1:2] == ["--"]:
        sys.exit(run(args[0], args[2:]))
    elif verb == ["ready"]:
        ready(args[0])
    elif verb == ["notice"]:
        notice(args[0])
    else:
        sys.exit(
            "usage: host serve BASE INDEX [GRACE_S] | spawn ROOT | run ROOT -- ARGV… "
            "| ready BASE | notice BASE"
        )
