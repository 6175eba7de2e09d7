"""A Slurm node's host: the one long step that keeps what cloudtrain starts on the node inside
the allocation. Standard library only: it runs before anything is installed on the node, as
``python -c SOURCE serve BASE`` (`SOURCE`, this file's text) in the batch script's step, one task
per node, and as ``python -c SOURCE spawn ROOT`` (a request on its stdin) in a short
``srun --overlap`` step.

Why: Slurm ends a step's processes when the step ends (every one of them where proctrack is
cgroup, which most sites run), so a process that must outlive the command that started it (the
node agent, a job's launcher) cannot be started by a short step of its own. It is started by
this host instead, as the host's child, and stays in the long step until the allocation ends:
``scancel`` then stops every one of them, on every node, as it stops any job.

The host listens on a Unix socket in its node's folder (``ROOT/host.sock``; the folder is the
user's alone, 0700) and serves only its own user (the peer's uid, ``SO_PEERCRED``). A request is
one JSON line: ``{"script", "argv", "env", "cwd", "job_dir"}``; it runs ``/bin/sh -c script
cloudtrain-detach job_dir argv…`` (the executors' detach script) in a new session, with its
environment and the request's ``env``, and answers ``{"pid": N}`` or ``{"error": "…"}``. It is
the child subreaper of what it starts, so a detached process stays its descendant (where
proctrack is linuxproc, that is how Slurm finds it), and it reaps them. On the step's SIGTERM
(``scancel``) it outlives them: it ends once they have, KILLing what is left after a grace.

Once listening, the host writes ``ROOT/host.json`` (its pid, the node's hostname and index)
atomically: the controller waits for that file on every node before it starts their bootstraps.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

SOCKET = "host.sock"
READY = "host.json"
_PR_SET_CHILD_SUBREAPER = 36
#: How long the host lets what it started end by the step's SIGTERM before it KILLs them.
STOP_GRACE_S = 10.0


def _subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: orphans go to init
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


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


def _spawn(request: dict[str, object]) -> dict[str, object]:
    script, argv, env = request["script"], request["argv"], request["env"]
    cwd, job_dir = request["cwd"], request["job_dir"]
    if not (isinstance(script, str) and isinstance(argv, list) and isinstance(env, dict)):
        return {"error": "a request needs script, argv and env"}
    if not (isinstance(cwd, str) and isinstance(job_dir, str)):
        return {"error": "a request needs cwd and job_dir"}
    try:
        os.makedirs(job_dir, mode=0o700, exist_ok=True)
        done = subprocess.run(
            ["/bin/sh", "-c", script, "cloudtrain-detach", job_dir, *map(str, argv)],
            env={**os.environ, **{str(k): str(v) for k, v in env.items()}},
            cwd=cwd,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            check=False,
        )
    except OSError as exc:
        return {"error": f"{exc.strerror}: {exc.filename}"}
    pid = done.stdout.strip()
    if done.returncode != 0 or not pid.isdigit():
        return {"error": (done.stderr or done.stdout).strip()[-2000:] or f"exit {done.returncode}"}
    return {"pid": int(pid)}


def serve(base: str, grace_s: float = STOP_GRACE_S) -> None:
    """Host the node ``BASE/node-$SLURM_NODEID`` until the step ends."""
    index = int(os.environ["SLURM_NODEID"])
    root = os.path.join(base, f"node-{index}")
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
    facts = {"pid": os.getpid(), "hostname": socket.gethostname(), "index": index}
    with open(READY + ".tmp", "w") as f:
        json.dump(facts, f)
    os.replace(READY + ".tmp", READY)
    while True:
        _reap()
        if stopping:
            if _stop(stopping[0], grace_s):
                return
            time.sleep(0.1)
            continue
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(30)
            try:
                if _peer_uid(conn) != os.getuid():
                    continue
                with conn.makefile("rb") as stream:
                    request = json.loads(stream.readline(1 << 24))
                answer = _spawn(request) if isinstance(request, dict) else {"error": "no request"}
            except (OSError, ValueError, KeyError) as exc:
                answer = {"error": f"bad request: {exc}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer).encode() + b"\n")


def spawn(root: str) -> int:
    """Hand the request on stdin to the host of the node at `root`; print the pid it started."""
    request = sys.stdin.read()
    os.chdir(root)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        try:
            conn.connect(SOCKET)
        except OSError as exc:
            print(f"no host on this node ({exc.strerror})", file=sys.stderr)
            return 3
        conn.sendall(request.strip().encode() + b"\n")
        with conn.makefile("rb") as stream:
            answer = json.loads(stream.readline(1 << 20) or b"{}")
    if "pid" not in answer:
        print(answer.get("error", "the host gave no answer"), file=sys.stderr)
        return 1
    print(answer["pid"])
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], *map(float, sys.argv[3:4]))
    elif sys.argv[1:2] == ["spawn"]:
        sys.exit(spawn(sys.argv[2]))
    else:
        sys.exit("usage: host serve BASE [GRACE_S] | spawn ROOT")
