"""A host's teardown (`cloudtrain.node.procs`, run from its source by an interpreter that has no
cloudtrain, as `down` on an ssh host runs it): every process of the cluster's nodes is stopped,
the warm client's hidden marker and a supervisor's late child included, and waited for; other
clusters' processes are left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from cloudtrain.node import procs

#: Ignores TERM, and on a TERM starts a child of the same node (a supervisor's restart).
RESPAWNS = """
import os, signal, subprocess, sys, time
def respawn(*_):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                     start_new_session=True)
    print("respawned", flush=True)
signal.signal(signal.SIGTERM, respawn)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_teardown_stops_every_process_of_the_clusters_nodes(tmp_path: Path) -> None:
    base, other = tmp_path / "lab1", tmp_path / "lab10"  # a name that starts the same
    plain = {"PATH": os.environ["PATH"]}
    started: list[subprocess.Popen[str]] = []

    def start(env: dict[str, str], code: str = "import time; time.sleep(60)") -> int:
        argv = [sys.executable, "-c", code]
        env = {**plain, **env}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        return proc.pid

    try:
        node0 = start({"CLOUDTRAIN_NODE_ROOT": f"{base}/node-0"})
        client = start({"_LOUDTRAIN_NODE_ROOT": f"{base}/node-1"})  # the warm client, hidden
        respawner = start({"CLOUDTRAIN_NODE_ROOT": f"{base}/node-1"}, RESPAWNS)
        foreign = start({"CLOUDTRAIN_NODE_ROOT": f"{other}/node-0"})
        said = started[2].stdout
        assert said is not None
        assert said.readline() == "ready\n"
        assert sorted(procs.find_nodes(str(base))) == sorted([node0, client, respawner])

        source = Path(procs.__file__).read_text()
        argv = [sys.executable, "-S", "-c", source, "stop-nodes", str(base), "1"]
        # -S: no site-packages, so no cloudtrain to import
        done = subprocess.run(argv, env=plain, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["left"] == 0
        assert said.readline() == "respawned\n"
        assert procs.find_nodes(str(base)) == []  # the child it started on the TERM too
        assert [p.wait(timeout=5) for p in started[:3]] == [-15, -15, -9]
        assert procs.alive(foreign), "another cluster's process is left alone"
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": f"{base}/node-1"}, grace_s=0)


def test_one_node_is_stopped_and_its_neighbours_are_not(tmp_path: Path) -> None:
    """``stop-node ROOT``, a cancelled recovery's removal of the node it made: that node's
    processes (its warm client's hidden marker too) and no other node's, ``node-10`` included."""
    base = tmp_path / "lab"
    plain = {"PATH": os.environ["PATH"]}
    roots = [
        ("CLOUDTRAIN_NODE_ROOT", "node-1"),
        ("_LOUDTRAIN_NODE_ROOT", "node-1"),
        ("CLOUDTRAIN_NODE_ROOT", "node-10"),
        ("CLOUDTRAIN_NODE_ROOT", "node-0"),
    ]
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = [subprocess.Popen(sleep, env={**plain, k: f"{base}/{n}"}) for k, n in roots]
    try:
        assert sorted(procs.find_node(f"{base}/node-1/")) == sorted(p.pid for p in started[:2])
        source = Path(procs.__file__).read_text()
        argv = [sys.executable, "-S", "-c", source, "stop-node", f"{base}/node-1", "1"]
        done = subprocess.run(argv, env=plain, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"terminated": 2, "killed": 0, "left": 0}
        assert [p.wait(timeout=5) for p in started[:2]] == [-15, -15]
        assert all(procs.alive(p.pid) for p in started[2:]), "node-10 and node-0 stay"
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_a_stopped_process_acts_on_its_term(tmp_path: Path) -> None:
    """A process stopped (^Z, a debugger, a test holding a bootstrap where it is) gets CONT
    after its TERM: it ends by the TERM, within the grace, not by the KILL after it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "CT_TEST_STOPPED": str(tmp_path)},
    )
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        counts = procs.kill_matching({"CT_TEST_STOPPED": str(tmp_path)}, grace_s=5)
        assert counts == {"terminated": 1, "killed": 0}
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
