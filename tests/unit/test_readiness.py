"""Waiting for the bootstrap: the one path that reads every node's status file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.boot.readiness import wait_ready
from cloudtrain.errors import BootstrapError
from cloudtrain.executors.base import RunResult
from cloudtrain.executors.fake import Call, FakeExecutor
from cloudtrain.model import Event, NodeInfo
from cloudtrain.providers.fake.provider import _CLOUDS, _HANDLERS, FakeCloud
from tests.conftest import Cli


def node(index: int) -> NodeInfo:
    return NodeInfo("c", index, f"n{index}", "10.0.0.1", None, "running",
                    root=f"/r{index}")  # fmt: skip


def status(phase: str, state: str, log: str = "") -> str:
    phases = [{"name": phase, "state": "failed" if state == "failed" else "running",
               "started": None, "finished": None, "exit_code": 3 if state == "failed" else None,
               "log": log}]  # fmt: skip
    return json.dumps({"phase": phase, "state": state, "phases": phases})


def scripted(answers: Iterator[str | None]) -> FakeExecutor:
    def handle(call: Call) -> RunResult:
        if call.argv[0] == "tail":
            return RunResult(call.argv, 0, "pip: no matching distribution for torch\n", "")
        if call.argv[0] != "cat":  # put, start_detached: the handoff's own calls
            return RunResult(call.argv, 0, "", "")
        answer = next(answers)
        if answer is None:
            return RunResult(call.argv, 1, "", "No such file or directory")
        return RunResult(call.argv, 0, answer, "")

    return FakeExecutor(handle)


def test_waits_through_every_phase_until_all_are_ready() -> None:
    first = scripted(iter([None, status("torch", "running"), status("verify", "ready")]))
    second = scripted(iter([status("verify", "ready")] * 3))
    events: list[Event] = []
    wait_ready([node(0), node(1)], [first, second], on_event=events.append, poll_s=0)
    assert [(e.node, e.message) for e in events] == [
        (1, "verify: ready"), (0, "torch: running"), (0, "verify: ready")]  # fmt: skip
    assert first.calls[0].argv == ("cat", "/r0/bootstrap/status.json")


def test_a_failed_phase_names_node_phase_and_log_tail() -> None:
    failing = scripted(iter([status("torch", "failed", "/r1/bootstrap/logs/torch.log")]))
    with pytest.raises(BootstrapError) as err:
        wait_ready([node(1)], [failing], poll_s=0)
    assert (err.value.node, err.value.phase) == ("1", "torch")
    assert "exit code 3" in str(err.value)
    assert "no matching distribution for torch" in str(err.value)
    assert failing.calls[-1].argv == ("tail", "-n", "20", "/r1/bootstrap/logs/torch.log")


def test_a_bootstrap_that_never_finishes_times_out() -> None:
    slow = scripted(iter([status("nvidia-driver", "running")] * 1000))
    with pytest.raises(BootstrapError, match="not ready after 0 s"):
        wait_ready([node(0)], [slow], timeout_s=0, poll_s=0)


def test_up_reports_a_failed_bootstrap_and_exits_3(run_cli: Cli, home: Path) -> None:
    cloud = _CLOUDS[home] = FakeCloud()

    def broken(call: Call) -> RunResult:
        if call.argv[0] == "cat":
            return RunResult(call.argv, 0, status("torch", "failed", "/x/torch.log"), "")
        return RunResult(call.argv, 0, "pip: no matching distribution for torch\n", "")

    _HANDLERS[home] = broken
    try:
        kept = run_cli("up", "--provider", "fake", "--name", "c1")
        assert kept.exit_code == 3
        assert "node 0: phase 'torch' failed: exit code 3" in kept.output
        assert "no matching distribution for torch" in kept.output
        assert "kept for inspection" in kept.output
        assert len(cloud.live("c1")) == 1
        assert run_cli("down", "c1").exit_code == 0
        gone = run_cli("up", "--provider", "fake", "--name", "c2", "--down-on-failure")
        assert gone.exit_code == 3
        assert "tearing 'c2' down (--down-on-failure)" in gone.output
        assert cloud.live() == []
        skipped = run_cli("up", "--provider", "fake", "--name", "c3", "--no-setup")
        assert skipped.exit_code == 0
        assert run_cli("down", "c3").exit_code == 0
    finally:
        del _HANDLERS[home]


def test_ctrl_c_in_the_bootstrap_wait_says_so(run_cli: Cli, home: Path) -> None:
    """The nodes run on; the record says nobody watched them get ready, and status says what
    to run, instead of "bootstrapping" forever."""
    _CLOUDS[home] = FakeCloud()

    def interrupted(call: Call) -> RunResult:
        raise KeyboardInterrupt

    _HANDLERS[home] = interrupted
    try:
        stopped = run_cli("up", "--provider", "fake", "--name", "c1")
        assert stopped.exit_code == 130
    finally:
        del _HANDLERS[home]
    shown = run_cli("status")
    assert "the wait for the bootstrap of 'c1' was interrupted" in shown.output
    assert "unwatched" in shown.output
    assert run_cli("up", "--provider", "fake", "--name", "c1").exit_code == 0
    assert "interrupted" not in run_cli("status").output
    assert run_cli("down", "c1").exit_code == 0


def waiting_for_wheel(started: str | None = None) -> str:
    phases = [{"name": "cloudtrain", "state": "waiting", "started": started, "finished": None,
               "exit_code": None, "log": "/r0/bootstrap/logs/cloudtrain.log"}]  # fmt: skip
    return json.dumps({"phase": "cloudtrain", "state": "waiting", "waiting_for": "wheel",
                       "wheel": "/r0/dist/cloudtrain-0.1.0-py3-none-any.whl",
                       "phases": phases})  # fmt: skip


def test_a_node_waiting_for_the_wheel_gets_it_and_its_bootstrap_goes_on(tmp_path: Path) -> None:
    from cloudtrain.boot.readiness import hand_over_wheel

    wheel_file = tmp_path / "cloudtrain-0.1.0-py3-none-any.whl"
    wheel_file.write_bytes(b"PK")
    stale = waiting_for_wheel()
    ex = scripted(iter([stale, stale, status("cloudtrain", "running"), status("verify", "ready")]))
    # stale twice: the bootstrap has not seen the wheel yet on the next poll
    events: list[Event] = []
    wait_ready([node(0)], [ex], on_event=events.append, poll_s=0,
               handoff=hand_over_wheel(lambda: wheel_file))  # fmt: skip
    puts = [c for c in ex.calls if c.kind == "put"]  # where the node's status says
    assert [c.argv for c in puts] == [(str(wheel_file), f"/r0/dist/{wheel_file.name}")]
    assert [c for c in ex.calls if c.kind not in ("put", "run")] == []  # nothing run again
    assert (0, "copying the cloudtrain wheel") in [(e.node, e.message) for e in events]

    again = scripted(iter([stale, waiting_for_wheel(started="2026-11-30T18:00:00Z")]))
    with pytest.raises(BootstrapError, match=r"waits for the cloudtrain wheel at \S+ after it"):
        wait_ready([node(0)], [again], poll_s=0, handoff=hand_over_wheel(lambda: wheel_file))


def test_a_waiting_node_is_not_a_failure_and_needs_a_handoff() -> None:
    """The wait for the wheel is a state of its own: no exit code, no log tail; without a
    handoff nothing would ever end it, so it is an error at once."""
    lone = scripted(iter([waiting_for_wheel()]))
    with pytest.raises(BootstrapError, match="nothing hands it over") as err:
        wait_ready([node(0)], [lone], poll_s=0)
    assert err.value.phase == "cloudtrain"
    assert [c.argv[0] for c in lone.calls] == ["cat"]  # no tail of a log: nothing failed


def test_a_failed_cloudtrain_phase_is_a_failure_not_a_wait(tmp_path: Path) -> None:
    """A failed phase is a failure whatever its code (75 once meant waiting for the wheel)."""
    from cloudtrain.boot.readiness import hand_over_wheel

    failed = json.loads(waiting_for_wheel())
    failed.update(state="failed", waiting_for=None)
    failed["phases"][0].update(state="failed", exit_code=75)
    ex = scripted(iter([json.dumps(failed)]))
    with pytest.raises(BootstrapError, match="exit code 75"):
        wait_ready([node(0)], [ex], poll_s=0, handoff=hand_over_wheel(lambda: tmp_path / "w"))
    assert [c for c in ex.calls if c.kind == "put"] == []


def phases(*done: tuple[str, str, str, str | None], state: str = "ready") -> str:
    """A status whose phases ended as given: (name, state, started, finished)."""
    listed = [{"name": n, "state": st, "started": a, "finished": b, "exit_code": 0, "log": ""}
              for n, st, a, b in done]  # fmt: skip
    return json.dumps({"phase": done[-1][0], "state": state, "phases": listed})


def test_a_phase_over_on_every_node_is_one_event_with_the_slowest() -> None:
    t = "2026-12-01T10:00:{:02d}Z"
    first = scripted(iter([
        phases(("base", "done", t.format(0), t.format(12)), state="running"),
        phases(("base", "done", t.format(0), t.format(12)),
               ("driver", "skipped", t.format(12), t.format(12)),
               ("torch", "done", t.format(12), t.format(53))),
    ]))  # fmt: skip
    second = scripted(iter([
        phases(("base", "done", t.format(1), t.format(9)),
               ("driver", "done", t.format(9), t.format(40)),
               ("torch", "done", "", None)),  # a time it cannot read: not the slowest
    ] * 2))  # fmt: skip
    events: list[Event] = []
    wait_ready([node(0), node(1)], [first, second], on_event=events.append, poll_s=0)
    assert [e.message for e in events if e.kind == "phase"] == [
        "bootstrap phase base done on 2 node(s), the slowest in 12 s (node 0)",
        "bootstrap phase driver done on 2 node(s) (skipped on 1), the slowest in 31 s (node 1)",
        "bootstrap phase torch done on 2 node(s), the slowest in 41 s (node 0)",
    ]
    assert all(e.node is None for e in events if e.kind == "phase")


def test_a_phase_skipped_everywhere_says_so() -> None:
    from cloudtrain.boot.readiness import phase_line

    assert phase_line("driver", {0: ("skipped", 0.0), 1: ("skipped", None)}) == (
        "bootstrap phase driver skipped on 2 node(s) (nothing to do)"
    )
    assert phase_line("base", {0: ("done", None)}) == "bootstrap phase base done on 1 node(s)"
