"""The resident node agent's preemption watcher against local stand-ins of the three clouds'
metadata endpoints (`tests/metadata.py`): on a notice it records it on the node and a job's process
that registered `runtime.on_preemption` is told at once; a process that did not register is
left alone (the signal would kill it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cloudtrain import node as agent
from cloudtrain.node import agent as resident
from cloudtrain.node import notices
from tests.metadata import serving

pytestmark = pytest.mark.integration

JOB = """
import os, sys, time
from cloudtrain.runtime import on_preemption, preempting
told = sys.argv[1]
def save_now():  # whole or not at all: the test reads it as soon as it is there
    with open(told + ".part", "w") as f:
        f.write(f"{time.monotonic()} {preempting()}")
    os.replace(told + ".part", told)
on_preemption(save_now)
print("registered", flush=True)
for _ in range(600):
    time.sleep(0.1)
"""


def wait_for(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


@pytest.mark.parametrize("source", sorted(notices.ENDPOINTS))
def test_a_notice_is_recorded_and_the_job_is_told_at_once(source: str, tmp_path: Path) -> None:
    root = tmp_path / "node-0"
    root.mkdir()
    node_env = {**os.environ, "CLOUDTRAIN_NODE_ROOT": str(root)}
    env = {**node_env, "CLOUDTRAIN_JOB_ID": "c1-1"}
    told = tmp_path / "told"
    job = subprocess.Popen([sys.executable, "-c", JOB, str(told)], env=env,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    bystander = subprocess.Popen(["sleep", "60"], env=env)  # same node, catches nothing
    # the node's bootstrap is no job's: a bash with an EXIT trap catches the signal, and would
    # die of it
    bootstrap = subprocess.Popen(["bash", "-c", "trap 'echo bye' EXIT; sleep 60"], env=node_env)
    with serving() as (endpoint, meta):
        watcher = subprocess.Popen(  # the resident agent, as a cloud node's unit runs it
            [sys.executable, "-m", "cloudtrain.node", "agent", "--root", str(root),
             "--source", source, "--endpoint", endpoint],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert job.stdout is not None
            assert job.stdout.readline() == "registered\n"
            time.sleep(1.5)  # the watcher has asked at least once, and found nothing
            assert watcher.poll() is None
            assert not (root / notices.NOTICE_FILE).exists()
            announced = meta.announce(source)
            at, seen = wait_for(told).split()
            delay = float(at) - announced
            print(f"{source}: the job was told {delay:.2f} s after the notice")
            time.sleep(2 * resident.BEAT_S)
            assert watcher.poll() is None, "the agent stays after the notice: it still beats"
            assert resident.beat(root)["notice"] is True
            watcher.terminate()
            out, err = watcher.communicate(timeout=30)
        finally:
            for proc in (watcher, job, bystander, bootstrap):
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            for stream in (job.stdout, watcher.stdout, watcher.stderr):
                if stream is not None:
                    stream.close()
    assert watcher.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["signalled"] == [job.pid]
    assert seen == "True", "preempting() says so in the callback"
    assert delay < 5, "bounded by the watcher's interval (1 s), not by a timeout"
    recorded = notices.read(root)
    assert recorded is not None
    assert recorded["source"] == source
    assert bystander.returncode == -signal.SIGKILL, "left alone until the test killed it"
    assert bootstrap.returncode == -signal.SIGKILL, "the bootstrap too: it is no job's"
    if source == notices.IMDSV2:
        assert ("PUT", "/latest/api/token") in meta.requests, "IMDSv2, with its token"


def test_the_status_a_coordinator_reads_carries_the_notice(tmp_path: Path) -> None:
    job_dir = tmp_path / "node-0" / "jobs" / "c1-1"
    job_dir.mkdir(parents=True)
    assert agent.job_status(job_dir)["preemption"] is None
    root = tmp_path / "node-0"
    notices.record(root, notices.Notice(notices.IMDSV2, "terminate", "2026-12-02T10:00Z"))
    assert not notices.record(root, notices.Notice(notices.IMDSV2, "stop")), "the first stands"
    found = agent.job_status(job_dir)["preemption"]
    assert isinstance(found, dict)
    assert (found["source"], found["action"]) == (notices.IMDSV2, "terminate")


def test_a_metadata_server_that_is_away_is_asked_again(tmp_path: Path) -> None:
    errors: list[Exception] = []
    with serving() as (endpoint, meta):
        src = notices.source(notices.SCHEDULED_EVENTS, endpoint)
        meta.announce(notices.SCHEDULED_EVENTS)
    # the server is gone: every ask fails, the watcher keeps asking until stopped
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    assert notices.watch(src, interval_s=0.1, stop=stop, on_error=errors.append) is None
    assert len(errors) >= 2


def test_an_azure_preempt_event_for_another_vm_is_not_this_nodes(tmp_path: Path) -> None:
    """Scheduled Events lists every VM of the availability set: an event whose ``Resources``
    name another VM does not tell this node's job; one naming this VM (the name from the
    metadata server's ``instance/compute``) does."""
    root = tmp_path / "node-0"
    root.mkdir()
    node_env = {**os.environ, "CLOUDTRAIN_NODE_ROOT": str(root)}
    env = {**node_env, "CLOUDTRAIN_JOB_ID": "c1-1"}
    told = tmp_path / "told"
    job = subprocess.Popen([sys.executable, "-c", JOB, str(told)], env=env,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    with serving() as (endpoint, meta):
        meta.azure_vm = "ct-c1-0"
        watcher = subprocess.Popen(
            [sys.executable, "-m", "cloudtrain.node", "agent", "--root", str(root),
             "--source", notices.SCHEDULED_EVENTS, "--endpoint", endpoint],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert job.stdout is not None
            assert job.stdout.readline() == "registered\n"
            meta.announce(notices.SCHEDULED_EVENTS, vm="ct-c1-1")  # the other node's VM
            # The watcher asks every second: three asks saw the other VM's event.
            deadline = time.monotonic() + 30
            while meta.requests.count(("GET", SCHEDULED)) < 4:
                assert time.monotonic() < deadline, meta.requests
                time.sleep(0.05)
            assert not told.exists(), "another VM's preemption told this node's job"
            assert notices.read(root) is None
            announced = meta.announce(notices.SCHEDULED_EVENTS, vm="ct-c1-0")
            at, _ = wait_for(told).split()
            print(f"this VM's event told the job {float(at) - announced:.2f} s after it")
        finally:
            for proc in (watcher, job):
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            for stream in (job.stdout, watcher.stdout, watcher.stderr):
                if stream is not None:
                    stream.close()
    recorded = notices.read(root)
    assert recorded is not None
    assert recorded["source"] == notices.SCHEDULED_EVENTS
    assert ("GET", COMPUTE) in meta.requests, "the VM's name came from instance/compute"


SCHEDULED = "/metadata/scheduledevents?api-version=2020-07-01"
COMPUTE = "/metadata/instance/compute?api-version=2021-02-01&format=json"
