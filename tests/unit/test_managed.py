"""The managed job's watcher against the fake provider: what it decides for each way an
attempt ends, what it starts again, and what it records (exactly once)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.executors.base import RunResult
from cloudtrain.executors.fake import Call
from cloudtrain.jobs import managed, watched
from cloudtrain.jobs.attempts import JobSpec, Verdict
from cloudtrain.jobs.coordinator import Coordinator
from cloudtrain.jobs.torchrun import Launch, read_failure, rendezvous_first
from cloudtrain.model import NodeInfo
from cloudtrain.providers.fake.provider import FakeCloud, FakeProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources, parse_nodes
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
    state.put_cluster(spec, status=ClusterStatus.UP)
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


def test_a_survivor_its_follower_stopped_is_not_stopped_again_by_the_recovery(
    setup: Setup,
) -> None:
    """The follower stops the others as soon as one node fails, and ends once none of them
    runs: the recovery that follows goes straight on (each stop is an agent call, in the
    downtime), unless it was begun by a watcher that died (then nothing saw them stop)."""
    watcher, provider, nodes, _ = setup
    nodes.outcomes = {0: {1: "vanished"}}
    job_id = submit(setup, managed.Policy())
    assert watcher.run(job_id).status == "succeeded"
    kills = [c.argv for ex in provider.executors.values() for c in ex.calls
             if c.argv[1:4] == ("-m", "cloudtrain.node", "kill")]  # fmt: skip
    assert len(kills) == 1, kills  # node 0's, by the follower


def test_an_elastic_job_whose_rendezvous_host_vanished_goes_on_on_its_own_rendezvous(
    setup: Setup,
) -> None:
    """Node 0 hosted the rendezvous and vanished; node 1's agent failed with it (its store was
    gone). One recovery: node 1 starts again alone, hosting a rendezvous of its own."""
    watcher, provider, nodes, state = setup
    nodes.outcomes = {0: {0: "vanished", 1: 1}}
    coord = Coordinator(state, provider, home=watcher.home)
    job = JobSpec(entrypoint=("train.py",), num_nodes=2, min_nodes=1)
    job_id = coord.submit("c1", job, managed=managed.Policy().to_dict()).id
    assert state.job(job_id).detail["head_node"] == 0  # type: ignore[union-attr]
    rec = watcher.run(job_id)
    assert rec.status == "succeeded"
    (recovery,) = rec.detail["recoveries"]
    assert (recovery["cause"], recovery["node"]) == ("vanished", 0)
    starts = [c.argv for ex in provider.executors.values() for c in ex.calls
              if c.kind == "start_detached" and f"{job_id}.1" in c.argv]  # fmt: skip
    assert [argv[argv.index("--rdzv-conf") + 1].split(",")[0] for argv in starts] == [
        "is_host=1"
    ], "one node started again, hosting the rendezvous"
    messages = [e.message for e in state.events(job_id=job_id)]
    assert (f"job {job_id}: recovery 1/3: node 0, the rendezvous host, its processes vanished; "
            "node(s) 1 lost their rendezvous with it and start again on one of their own while "
            "it is made again") in messages  # fmt: skip
    assert not any("the others go on" in m for m in messages)


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


def test_the_rendezvous_is_hosted_by_an_on_demand_node_when_there_is_one() -> None:
    def node(index: int, spot: bool) -> NodeInfo:
        return NodeInfo("c", index, f"i-{index}", "10.0.0.1", None, "running", "z", "t",
                        extra={"spot": spot})  # fmt: skip

    spot0 = [node(0, True), node(1, True), node(2, False), node(3, False)]
    assert [n.index for n in rendezvous_first(spot0)] == [2, 0, 1, 3]
    all_spot = [node(1, True), node(0, True)]
    assert [n.index for n in rendezvous_first(all_spot)] == [0, 1]
    plain = [node(1, False), node(0, False)]
    assert [n.index for n in rendezvous_first(plain)] == [0, 1]


@pytest.mark.parametrize(("text", "parsed"), [("2", (None, 2)), ("1:4", (1, 4)), ("3:3", (3, 3))])
def test_nodes_parse_as_a_count_or_an_elastic_range(text: str, parsed: tuple[int, int]) -> None:
    assert parse_nodes(text) == parsed


@pytest.mark.parametrize(
    "text", ["0", "3:2", "0:2", "a", "1:", ":2", "-1", "1:2:3", "1:2\n", " 2", "+2", "1 :2"]
)
def test_bad_nodes_are_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=rf"--nodes {re.escape(repr(text))}: write a number"):
        parse_nodes(text)


def test_an_elastic_launch_asks_torchrun_for_a_range_and_a_short_last_call() -> None:
    launch = Launch(python="py", num_nodes=4, nproc_per_node=1, head="10.0.0.1:29500",
                    job_id="c-1", is_head=True, local_addr="10.0.0.1", max_restarts=3,
                    args=["t.py"], min_nodes=2)  # fmt: skip
    argv = launch.argv()
    assert argv[argv.index("--nnodes") + 1] == "2:4"
    assert argv[argv.index("--rdzv-conf") + 1] == "is_host=1,last_call_timeout=5"


@pytest.mark.parametrize(
    ("log", "hardware"),
    [
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", True),
        ("torch.distributed.DistBackendError: NCCL error in: x, unhandled system error", True),
        ("NVRM: Xid (PCI:0000:00:1e): 79, GPU has fallen off the bus.", True),
        ("ValueError: bad learning rate", False),
        ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ],
)
def test_a_failure_the_machine_caused_is_told_from_the_scripts_own(
    log: str, hardware: bool
) -> None:
    assert read_failure(f"Traceback (most recent call last):\n{log}\n").hardware is hardware


def test_a_recovery_never_makes_anew_a_cluster_torn_down_meanwhile(tmp_path: Path) -> None:
    """The watcher's `up` waits for the cluster's lock; a `down` that held it went first."""
    from cloudtrain import api
    from cloudtrain.errors import NotFoundError

    cloud = FakeCloud()
    provider = FakeProvider(ProviderContext(home=tmp_path, options={"cloud": cloud}))
    spec = ClusterSpec("gone", "fake", 2, Resources(accelerator="A100", count=8))
    with State.open(tmp_path) as state, pytest.raises(NotFoundError, match="is gone"):
        api.up(state, tmp_path, spec, bootstrap_timeout_s=None, prov=provider,
               complete_only=True)  # fmt: skip
    assert not cloud.live()


def test_one_watcher_per_job(tmp_path: Path) -> None:
    assert watched.watcher_pid(tmp_path, "c1-1") is None
    with watched.watching(tmp_path, "c1-1") as first:
        assert first
        with watched.watching(tmp_path, "c1-1") as second:
            assert not second, "a second watcher of the same job leaves it to the first"
        assert watched.watcher_pid(tmp_path, "c1-1") == os.getpid()
        with watched.watching(tmp_path, "c1-2") as other:
            assert other, "another job has its own"
    assert watched.watcher_pid(tmp_path, "c1-1") is None


def test_a_watcher_started_mid_recovery_finishes_the_recovery(setup: Setup) -> None:
    """The watcher before it died had marked the job recovering; the next one goes on."""
    watcher, provider, _, state = setup
    job_id = submit(setup, managed.Policy())
    state.update_job(job_id, status="recovering", detail={"recovering_cause": "preempted"})
    rec = watcher.run(job_id)
    assert rec.status == "succeeded"
    assert rendezvous_ids(provider) == [job_id, f"{job_id}.1"]
    assert [r["cause"] for r in rec.detail["recoveries"]] == ["preempted"]
    messages = [e.message for e in state.events(job_id=job_id)]
    assert f"job {job_id}: recovery 1/3: again after preempted" in messages


def test_a_node_preempted_in_a_zone_comes_back_in_another_first(tmp_path: Path) -> None:
    """With no node left to pin the cluster's zone, the zone that just preempted it is tried
    last; with nodes left, the replacement joins their zone (the engine's rule)."""
    from cloudtrain import api

    cloud = FakeCloud()
    provider = FakeProvider(ProviderContext(home=tmp_path, options={"cloud": cloud}))
    with State.open(tmp_path) as state:
        spec = ClusterSpec("solo", "fake", 1, Resources(accelerator="A100", count=8))
        (first,) = api.up(state, tmp_path, spec, bootstrap_timeout_s=None, prov=provider)
        assert first.zone == "fake-1a"
        job = state.new_job("solo", "t", num_nodes=1, nproc_per_node=1, command=["t.py"])
        for inst in cloud.live("solo"):
            inst.state = "terminated"  # preempted
        watcher = managed.Watcher(
            state, tmp_path, lambda c: Coordinator(state, provider, home=tmp_path),
            provider=lambda s: provider, bootstrap_timeout_s=None,
        )  # fmt: skip
        assert watcher.complete_cluster(job, zones_last={"fake-1a"}) == [0]
        (again,) = provider.describe("solo")
        assert again.zone == "fake-1b"


def test_down_records_a_job_its_nodes_could_not_account_for_as_cancelled(
    tmp_path: Path,
) -> None:
    """A node that no longer answers keeps a job open; tearing its cluster down ends it, and a
    managed job's watcher is told first (it starts nothing more)."""
    from cloudtrain import api
    from cloudtrain.providers.fake.provider import _CLOUDS, _HANDLERS

    nodes = Nodes()
    _CLOUDS[tmp_path], _HANDLERS[tmp_path] = FakeCloud(), nodes
    try:
        provider = api.provider("fake", tmp_path)
        with State.open(tmp_path) as state:
            spec = ClusterSpec("gone", "fake", 2, Resources(accelerator="A100", count=8))
            api.up(state, tmp_path, spec, bootstrap_timeout_s=None, prov=provider)
            coord = Coordinator(state, provider, home=tmp_path)
            job = coord.submit("gone", JobSpec(entrypoint=("t.py",)),
                               managed=managed.Policy().to_dict())  # fmt: skip

            def deaf(call: Call) -> RunResult:  # its nodes stop answering
                if call.argv[1:4] == ("-m", "cloudtrain.node", "status"):
                    return RunResult(call.argv, 255, "", "ssh: connect: timed out")
                return nodes(call)

            _HANDLERS[tmp_path] = deaf
            assert api.down(state, tmp_path, "gone")
            rec = state.job(job.id)
            assert rec is not None
            assert (rec.status, bool(rec.detail.get("cancel_requested"))) == ("cancelled", True)
            assert not _CLOUDS[tmp_path].live()
    finally:
        _CLOUDS.pop(tmp_path, None)
        _HANDLERS.pop(tmp_path, None)
