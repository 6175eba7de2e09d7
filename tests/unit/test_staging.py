"""A launch's workdir and setup staged on each node past its torch phase, once, with the
submit's own setup then skipped (`cloudtrain.jobs.staging`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.executors.base import RunResult
from cloudtrain.executors.fake import Call, FakeExecutor
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.coordinator import run_setup
from cloudtrain.jobs.staging import Stager, past_torch, readying
from cloudtrain.model import Event, NodeInfo


def node(index: int) -> NodeInfo:
    return NodeInfo(
        cluster="c1",
        index=index,
        node_id=f"n{index}",
        private_ip="10.0.0.1",
        public_ip=None,
        state="running",
        root=f"/r{index}",
    )


class Disk:
    """A node's files, as far as the setup's marker goes (`cat` and the `printf` writing it)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def __call__(self, call: Call) -> RunResult:
        if call.argv[:1] == ("cat",):
            text = self.files.get(call.argv[1])
            return RunResult(call.argv, 0 if text else 1, text or "", "")
        if call.argv[:2] == ("/bin/sh", "-c") and call.argv[2].startswith("printf"):
            self.files[call.argv[-1]] = call.argv[-2] + "\n"
        return RunResult(call.argv, 0, "", "")


def setups(ex: FakeExecutor) -> list[Call]:
    return [c for c in ex.calls if c.argv[:3] == ("/bin/sh", "-c", "pip install x")]


@pytest.mark.parametrize(
    ("message", "node_index", "kind", "past"),
    [
        ("torch: running", 0, "bootstrap", False),
        ("cloudtrain: done", 0, "bootstrap", False),
        ("nccl: running", 0, "bootstrap", True),
        ("verify: running", 1, "bootstrap", True),
        ("verify: ready", 1, "bootstrap", True),
        ("nccl: running", None, "bootstrap", False),
        ("nccl: running", 0, "phase", False),
    ],
)
def test_a_node_is_past_torch_in_its_last_phases(
    message: str, node_index: int | None, kind: str, past: bool
) -> None:
    assert past_torch(Event(kind, message, node=node_index)) is past


def test_each_node_is_staged_once_and_the_submits_setup_is_then_skipped(tmp_path: Path) -> None:
    disks = {0: Disk(), 1: Disk()}
    executors: list[FakeExecutor] = []

    def executor(n: NodeInfo) -> FakeExecutor:
        executors.append(FakeExecutor(disks[n.index]))
        return executors[-1]

    shown: list[Event] = []
    job = JobSpec(entrypoint=("t.py",), workdir=tmp_path, setup="pip install x", envs={"A": "b"})
    stager = Stager(job, node, executor, shown.append)
    for message in ("torch: running", "nccl: running", "verify: running", "verify: ready"):
        for index in (0, 1):
            stager.tap(Event("bootstrap", message, node=index))
    stager.join()
    assert stager.outcome == {0: "staged", 1: "staged"}
    assert len(executors) == 2, "one staging per node, whatever it said after"
    for ex in executors:
        assert [c.argv for c in ex.calls if c.kind == "put"] == [
            (str(tmp_path), f"{ex_root(ex)}/workdir")
        ]
        assert len(setups(ex)) == 1
        assert setups(ex)[0].env["A"] == "b"
        assert ex.closed
    assert sum(e.kind == "stage" for e in shown) == 2
    assert sum(e.kind == "bootstrap" for e in shown) == 8, "every event is passed on"
    again = FakeExecutor(disks[0])  # what the submit does next on node 0
    run_setup(again, node(0), "pip install x", {"A": "b"}, None)
    assert setups(again) == []
    changed = FakeExecutor(disks[0])  # another setup is run
    run_setup(changed, node(0), "pip install x", {"A": "c"}, None)
    assert len(setups(changed)) == 1


def ex_root(ex: FakeExecutor) -> str:
    put = next(c for c in ex.calls if c.kind == "put")
    return put.argv[1].rsplit("/", 1)[0]


def test_a_staging_that_fails_is_left_to_the_submit(tmp_path: Path) -> None:
    def refuse(call: Call) -> RunResult:
        return RunResult(call.argv, 1 if call.kind == "put" else 0, "", "no space left")

    shown: list[Event] = []
    job = JobSpec(entrypoint=("t.py",), workdir=tmp_path, setup="pip install x")
    stager = Stager(job, node, lambda n: FakeExecutor(refuse), shown.append)
    stager.tap(Event("bootstrap", "nccl: running", node=0))
    stager.join()
    assert stager.outcome[0].startswith("failed: ")
    assert [e.kind for e in shown] == ["bootstrap"], "no word of a staging that did not happen"


def test_a_node_not_recorded_yet_is_not_staged(tmp_path: Path) -> None:
    job = JobSpec(entrypoint=("t.py",), workdir=tmp_path)
    stager = Stager(job, lambda i: None, lambda n: FakeExecutor(), lambda e: None)
    stager.tap(Event("bootstrap", "verify: ready", node=0))
    stager.join()
    assert stager.outcome == {}


def test_the_workdir_goes_at_the_first_status_and_the_setup_waits_for_torch(
    tmp_path: Path,
) -> None:
    executors: list[FakeExecutor] = []

    def executor(n: NodeInfo) -> FakeExecutor:
        executors.append(FakeExecutor(Disk()))
        return executors[-1]

    job = JobSpec(entrypoint=("t.py",), workdir=tmp_path, setup="pip install x")
    stager = Stager(job, node, executor, lambda e: None)
    stager.tap(Event("bootstrap", "python: running", node=0))
    stager.tap(Event("bootstrap", "torch: running", node=0))
    stager.join()  # `up` ended (failed) before the node got past torch
    assert stager.outcome == {0: "synced"}
    (ex,) = executors
    assert [c.kind for c in ex.calls if c.kind == "put"] == ["put"]
    assert setups(ex) == [], "no setup beside the torch phase, nor after a failed up"
    assert ex.closed


def test_up_runs_before_unlock_under_the_clusters_lock_however_it_ends(tmp_path: Path) -> None:
    """`launch` joins its staging there: no other command's setup runs beside a staged one."""
    from cloudtrain import api, locks
    from cloudtrain.errors import ConfigError
    from cloudtrain.spec import ClusterSpec
    from cloudtrain.state import State

    state = State.open(tmp_path)
    holders: list[int | None] = []

    def before_unlock() -> None:
        holders.append(locks.holder(tmp_path, "c1"))

    api.up(state, tmp_path, ClusterSpec("c1", "fake", 1), bootstrap_timeout_s=None,
           before_unlock=before_unlock)  # fmt: skip
    with pytest.raises(ConfigError):  # another spec for the same name: refused
        api.up(state, tmp_path, ClusterSpec("c1", "fake", 3), bootstrap_timeout_s=None,
               before_unlock=before_unlock)  # fmt: skip
    assert len(holders) == 2
    assert None not in holders, "held (by this process) when it ran"
    assert locks.holder(tmp_path, "c1") is None, "and the lock is free after"
    assert api.down(state, tmp_path, "c1")


def test_a_replacement_is_readied_once_when_past_its_torch_phase_and_every_event_passes_on() -> (
    None
):
    import threading

    heard: list[Event] = []
    readied: list[int] = []
    done = threading.Event()

    def ready(n: NodeInfo) -> None:
        readied.append(n.index)
        done.set()

    tap = readying(heard.append, [node(1)], ready)
    events = [
        Event("bootstrap", "torch: running", node=1),
        Event("bootstrap", "verify: running", node=0),  # not one of the replacements
        Event("bootstrap", "verify: running", node=1),
        Event("bootstrap", "verify: ready", node=1),
        Event("phase", "verify: 3 s"),
    ]
    for event in events:
        tap(event)
    assert done.wait(10)
    assert heard == events
    assert readied == [1]
