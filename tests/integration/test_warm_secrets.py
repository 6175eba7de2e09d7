"""The node's warm server (`cloudtrain.jobs.warm`) holds no job's environment: a job's `--env`
secret is in neither the server's ``/proc/PID/environ`` nor anywhere in its writable memory (its
``os.environ``, the C library's ``environ``, its heap, its stack) while it lives on after the job,
and a later job, forked by it, sees its own environment and nothing of the first's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cloudtrain.jobs import warm
from cloudtrain.node import procs
from tests.integration.test_warm_start import job_env

pytestmark = pytest.mark.integration

SHOW = """
import json, os, sys
if __name__ == "__main__":
    block = open("/proc/self/environ", "rb").read()
    names = ("SECRET_TOKEN", "ONLY_FIRST")
    sys.stdout.write("SEEN " + json.dumps({
        "env": {k: os.environ.get(k) for k in names},
        "proc": {k: k.encode() + b"=" in block for k in names},
        "block": block.decode(errors="replace"),
    }) + chr(10))
"""


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether `needle` is anywhere in `pid`'s writable memory (heap, stack, anonymous maps:
    every place a copy of an environment can be)."""
    chunk = 16 << 20
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            low, high = (int(x, 16) for x in span.split("-"))
            for at in range(low, high, chunk):
                try:
                    mem.seek(at)
                    data = mem.read(min(chunk + len(needle), high - at))
                except OSError:  # a guard page, [vvar]
                    break
                if needle in data:
                    return True
    return False


def run_job(workdir: Path, env: dict[str, str]) -> dict[str, object]:
    flags = ["--standalone", "--nproc-per-node", "1", "--start-method", "fork", "show.py"]
    argv = [sys.executable, "-m", "cloudtrain.jobs.warm", *flags]
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [line.split("SEEN ", 1)[1] for line in done.stdout.splitlines() if "SEEN " in line]
    assert len(seen) == 1, done.stdout + done.stderr
    return dict(json.loads(seen[0]))


def test_the_warm_server_keeps_no_jobs_secret(tmp_path: Path) -> None:
    node, workdir = tmp_path / "node", tmp_path / "work"
    node.mkdir()
    workdir.mkdir()
    (workdir / "show.py").write_text(SHOW)
    first, second = f"xyz-{uuid.uuid4().hex}", f"abc-{uuid.uuid4().hex}"
    try:
        # the node's first fork job is cold, and its end starts the server
        seen = run_job(workdir, job_env(node, SECRET_TOKEN=first, ONLY_FIRST="1"))
        assert seen["env"] == {"SECRET_TOKEN": first, "ONLY_FIRST": "1"}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (warm.folder(node) / "sock").exists():
            time.sleep(0.2)
        assert (warm.folder(node) / "sock").exists(), "the first job started no server"
        [server] = procs.find_processes({"CLOUDTRAIN_NODE_ROOT": str(node)})
        assert b"cloudtrain.jobs.warmserver" in Path(f"/proc/{server}/cmdline").read_bytes()
        environ = Path(f"/proc/{server}/environ").read_bytes()
        assert first.encode() not in environ
        assert b"ONLY_FIRST=" not in environ
        assert not memory_holds(server, first.encode())

        # the next job is forked by it, and sees its own environment, and only its own
        seen = run_job(workdir, job_env(node, SECRET_TOKEN=second))
        assert "forked agent" in (warm.folder(node) / "server.log").read_text()
        assert seen["env"] == {"SECRET_TOKEN": second, "ONLY_FIRST": None}
        assert seen["proc"] == {"SECRET_TOKEN": True, "ONLY_FIRST": False}
        assert first not in str(seen["block"])

        assert procs.alive(server), "the server lives on for the next job"
        environ = Path(f"/proc/{server}/environ").read_bytes()
        for secret in (first, second):
            assert secret.encode() not in environ
            assert not memory_holds(server, secret.encode()), secret
    finally:
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node)}, grace_s=5)
