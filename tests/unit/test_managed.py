"""The managed job's watcher against the fake provider: what it decides for each way an
attempt ends, what it starts again, and what it records (exactly once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.executors.base import RunResult
from cloudtrain.executors.fake import Call
from cloudtrain.jobs import managed
from cloudtrain.jobs.coordinator import Coordinator, JobSpec, Verdict
from cloudtrain.providers.fake.provider import FakeCloud, FakeProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State


class Nodes:
    """What the fake nodes answer. `outcomes[attempt][node]`: an exit code, or "vanished"
    (no exit code, no process); an attempt not listed succeeds everywhere."""

    def __init__(self) -> None:
        self.outcomes: dict[int, dict[int, int | str]] = {}

    def __call__(self, call: Call) -> RunResult:
        argv = call.argv
        if argv[1:4] == ("-m", "cloudtrain.node", "port"):
            return RunResult(argv, 0, "29555\n", "")
        if argv[1:4] == ("-m", "cloudtrain.node", "status"):
            root, job = argv[4].split("/jobs/")
            attempt = int(job.rsplit(".", 1)[1]) if "." in job else 0
            index = int(root.rsplit("-", 1)[1]) - 1  # the fake's roots: /fake/fi-000001 ...
            outcome = self.outcomes.get(attempt, {}).get(index, 0)
            code = None if outcome == "vanished" else outcome
            status = {"exit_code": code, "cancelled": False, "alive": False, "pid": 7,
                      "ended": 1.0, "log_bytes": 0, "preemption": None}  # fmt: skip
            return RunResult(argv, 0, json.dumps(status), "")
        if argv[1:4] == ("-m", "cloudtrain.node", "follow"):
            return RunResult(argv, 0, "Traceback (most recent call last):\nValueError: x\n", "")
        return RunResult(argv, 0, "", "")


Setup = tuple[managed.Watcher, FakeProvider, Nodes, State]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    nodes = Nodes()
    provider = FakeProvider(
        ProviderContext(home=tmp_path, options={"cloud": FakeCloud(), "handler": nodes})
    )
    state = State.open(tmp_path)
    spec = ClusterSpec("c1", "fake", 2, Resources(accelerator="A100", count=8))
    state.put_cluster(spec, status="up")
    state.set_nodes("c1", provider.apply(provider.plan(spec)))
    managed.RETRY_PAUSE_S = 0
    watcher = managed.Watcher(
        state,
        tmp_path,
        lambda cluster: Coordinator(state, provider, home=tmp_path),
        provider=lambda spec: provider,
    )
    return watcher, provider, nodes, state


def submit(setup: Setup, policy: managed.Policy) -> str:
    watcher, provider, _, state = setup
    coord = Coordinator(state, provider, home=watcher.home)
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",)), managed=policy.to_dict())
    return rec.id


def rendezvous_ids(provider: FakeProvider) -> list[str]:
    starts = [c for ex in provider.executors.values() for c in ex.calls
              if c.kind == "start_detached"]  # fmt: skip
    return sorted({c.argv[c.argv.index("--rdzv-id") + 1] for c in starts})


def test_a_vanished_node_is_recovered_as_the_next_attempt(setup: Setup) -> None:
    watcher, provider, nodes, state = setup
    nodes.outcomes = {0: {0: 1, 1: "vanished"}}  # node 0's ranks fail because node 1 died
    job_id = submit(setup, managed.Policy())
    rec = watcher.run(job_id)
    assert rec.status == "succeeded"
    assert rendezvous_ids(provider) == [job_id, f"{job_id}.1"]
    (recovery,) = rec.detail["recoveries"]
    assert (recovery["cause"], recovery["node"], recovery["replaced"]) == ("vanished", 1, [])
    messages = [e.message for e in state.events(job_id=job_id)]
    assert f"job {job_id}: recovery 1/3: node 1 its processes vanished" in messages


def test_the_budget_bounds_the_recoveries(setup: Setup) -> None:
    watcher, provider, nodes, _ = setup
    nodes.outcomes = {a: {1: "vanished"} for a in range(5)}
    job_id = submit(setup, managed.Policy(max_recoveries=2))
    rec = watcher.run(job_id)
    assert rec.status == "failed"
    assert rec.detail["reason"] == "its processes vanished; its 2 recoveries are spent"
    assert len(rec.detail["recoveries"]) == 2
    assert rendezvous_ids(provider) == [job_id, f"{job_id}.1", f"{job_id}.2"]


def test_the_scripts_own_failure_is_retried_only_when_asked(setup: Setup) -> None:
    watcher, _, nodes, _ = setup
    nodes.outcomes = {0: {1: 1}}
    plain = watcher.run(submit(setup, managed.Policy()))
    assert (plain.status, plain.detail["cause"]) == ("failed", "exit")
    assert "recoveries" not in plain.detail
    retried = watcher.run(submit(setup, managed.Policy(retry_on_failure=True)))
    assert retried.status == "succeeded", "its second attempt succeeded"
    assert [r["cause"] for r in retried.detail["recoveries"]] == ["exit"]


def test_a_cancel_asked_during_a_recovery_starts_nothing(setup: Setup) -> None:
    watcher, provider, nodes, state = setup
    nodes.outcomes = {0: {1: "vanished"}}
    job_id = submit(setup, managed.Policy())
    state.update_job(job_id, detail={"cancel_requested": 1.0})
    rec = watcher.run(job_id)
    assert rec.status == "cancelled"
    assert rendezvous_ids(provider) == [job_id]


def test_a_final_status_is_recorded_once(setup: Setup) -> None:
    _, _, _, state = setup
    job_id = submit(setup, managed.Policy())
    assert state.finish_job(job_id, "cancelled")
    assert not state.finish_job(job_id, "failed", detail={"reason": "cleanup failed"})
    rec = state.job(job_id)
    assert rec is not None
    assert (rec.status, rec.detail.get("reason")) == ("cancelled", None)
    with pytest.raises(ValueError, match="not how a job ends"):
        state.finish_job(job_id, "running")


def test_a_vanished_node_is_named_whatever_the_others_said_first(setup: Setup) -> None:
    watcher, provider, nodes, state = setup
    nodes.outcomes = {0: {0: 1, 1: "vanished"}}
    coord = Coordinator(state, provider, home=watcher.home)
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",)))
    done = coord.follow(rec.id, lambda i, line: None)
    assert (done.status, done.detail["failed_node"], done.detail["cause"]) == (
        "failed", 1, "vanished"
    )  # fmt: skip
    assert Verdict("failed", "vanished").lost_node
    assert not Verdict("failed", "exit").lost_node


def test_job_spec_round_trips_through_the_record(tmp_path: Path) -> None:
    job = JobSpec(entrypoint=("t.py", "--x"), workdir=tmp_path, setup="pip install x",
                  envs={"A": "1"}, nproc_per_node=2, max_restarts=1, name="t")  # fmt: skip
    assert JobSpec.from_dict(json.loads(json.dumps(job.to_dict()))) == job
