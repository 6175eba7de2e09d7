"""The coordinator against the fake provider: the exact commands each node is asked to run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError, JobError, NotFoundError
from cloudtrain.executors.base import RunResult
from cloudtrain.executors.fake import Call
from cloudtrain.jobs import warm
from cloudtrain.jobs.attempts import JobSpec
from cloudtrain.jobs.coordinator import Coordinator
from cloudtrain.jobs.runtimes import Runtime, Start
from cloudtrain.jobs.torchrun import entrypoint_args
from cloudtrain.providers.fake.provider import FakeCloud, FakeProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State

#: What a p4d node's bootstrap writes to <root>/nccl.env.
NCCL_ENV = "# cloudtrain: NCCL settings\nFI_PROVIDER='efa'\nNCCL_PROTO='simple'\n"


class Node:
    """What the fake nodes answer: a port, and job states set per node by the test."""

    def __init__(self) -> None:
        self.exit_codes: dict[str, int | None] = {}
        #: node roots whose host no longer answers (ssh exits 255)
        self.lost: set[str] = set()
        #: node roots whose agent recorded a preemption notice
        self.notices: dict[str, dict[str, object]] = {}

    def __call__(self, call: Call) -> RunResult:
        argv = call.argv
        if any(root in arg for root in self.lost for arg in argv):
            return RunResult(argv, 255, "", "Timeout, server 10.0.0.2 not responding.")
        if argv[1:4] == ("-m", "cloudtrain.node", "port"):
            return RunResult(argv, 0, "29555\n", "")
        if argv[1:4] == ("-m", "cloudtrain.node", "status"):
            root = argv[4].split("/jobs/")[0]
            code = self.exit_codes.get(root, 0)
            status = {
                "exit_code": code,
                "cancelled": False,
                "alive": code is None,
                "pid": 7,
                "ended": 1.0,
                "log_bytes": 0,
                "preemption": self.notices.get(root),
            }
            return RunResult(argv, 0, json.dumps(status), "")
        if argv[1:4] == ("-m", "cloudtrain.node", "follow"):
            return RunResult(argv, 0, "line one\nline two\n", "")
        if argv[0] == "cat" and argv[1].endswith("/nccl.env"):
            return RunResult(argv, 0, NCCL_ENV, "")
        return RunResult(argv, 0, "", "")


Setup = tuple[Coordinator, FakeProvider, Node, State]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    node = Node()
    provider = FakeProvider(
        ProviderContext(home=tmp_path, options={"cloud": FakeCloud(), "handler": node})
    )
    state = State.open(tmp_path)
    spec = ClusterSpec("c1", "fake", 2, Resources(accelerator="A100", count=8))
    nodes = provider.apply(provider.plan(spec))
    state.put_cluster(spec, status=ClusterStatus.UP)
    state.set_nodes("c1", nodes)
    return Coordinator(state, provider, home=tmp_path), provider, node, state


def started(provider: FakeProvider) -> list[Call]:
    return [c for ex in provider.executors.values() for c in ex.calls if c.kind == "start_detached"]


def test_entrypoint_forms() -> None:
    assert entrypoint_args(["train.py", "--lr", "1"]) == ["train.py", "--lr", "1"]
    assert entrypoint_args(["python", "train.py"]) == ["train.py"]
    assert entrypoint_args(["python3", "-m", "pkg.train"]) == ["--module", "pkg.train"]
    assert entrypoint_args(["bash", "run.sh"]) == ["--no-python", "bash", "run.sh"]
    with pytest.raises(ConfigError, match="nothing to run"):
        entrypoint_args(["python"])


def test_spawn_and_commands_are_torchrun_itself(setup: Setup) -> None:
    coord, provider, _, _ = setup
    coord.submit("c1", JobSpec(entrypoint=("train.py",), start_method="spawn"))
    assert {c.argv[1:3] for c in started(provider)} == {("-m", "torch.distributed.run")}
    coord.cancel("c1-1")
    coord.submit("c1", JobSpec(entrypoint=("bash", "run.sh")))
    assert {c.argv[1:3] for c in started(provider)[2:]} == {("-m", "torch.distributed.run")}


def test_submit_starts_one_torchrun_agent_per_node_with_the_env_contract(setup: Setup) -> None:
    coord, provider, _, state = setup
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py", "--epochs", "3"), max_restarts=2))
    assert rec.status == "running"
    assert rec.id == "c1-1"
    assert rec.nproc_per_node == 8
    calls = started(provider)
    assert len(calls) == 2
    nodes = state.nodes("c1")
    head = f"{nodes[0].private_ip}:29555"
    for call, node in zip(calls, nodes, strict=True):
        assert call.argv == (
            "python3",
            "-m",
            "cloudtrain.jobs.warm",  # torchrun, its agent warm, its workers forked from it
            "--start-method",
            "fork",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "8",
            "--rdzv-backend",
            "cloudtrain",
            "--rdzv-endpoint",
            head,
            "--rdzv-id",
            "c1-1",
            "--rdzv-conf",
            f"is_host={int(node.index == 0)}",
            "--local-addr",
            node.private_ip,
            "--max-restarts",
            "2",
            "train.py",
            "--epochs",
            "3",
        )
        assert call.extra["job_dir"] == f"{node.root}/jobs/c1-1"
        assert call.cwd == f"{node.root}/workdir"
        env = call.env
        assert env["CLOUDTRAIN_CLUSTER"] == "c1"
        assert env["CLOUDTRAIN_JOB_ID"] == "c1-1"
        assert env["CLOUDTRAIN_NODE_RANK"] == str(node.index)
        assert env["CLOUDTRAIN_NUM_NODES"] == "2"
        assert env["CLOUDTRAIN_NODE_IPS"] == f"{nodes[0].private_ip},{nodes[1].private_ip}"
        assert env["CLOUDTRAIN_HEAD_IP"] == nodes[0].private_ip
        assert env["CLOUDTRAIN_GPUS_PER_NODE"] == "8"
        assert env["CLOUDTRAIN_CHECKPOINT_DIR"] == f"{node.root}/checkpoints/c1-1"
        assert "OMP_NUM_THREADS" not in env  # GPU nodes keep torchrun's own choice
        assert (env["FI_PROVIDER"], env["NCCL_PROTO"]) == ("efa", "simple")  # the bootstrap's


def test_setup_runs_once_per_node_and_workdir_is_synced(setup: Setup, tmp_path: Path) -> None:
    coord, provider, _, _ = setup
    (tmp_path / "proj").mkdir()
    coord.submit(
        "c1",
        JobSpec(
            entrypoint=("t.py",), workdir=tmp_path / "proj", setup="pip install x", envs={"A": "b"}
        ),
    )
    for ex in provider.executors.values():
        puts = [c for c in ex.calls if c.kind == "put"]
        assert [c.argv[0] for c in puts] == [str(tmp_path / "proj")]
        setups = [
            c for c in ex.calls if c.argv[:2] == ("/bin/sh", "-c") and c.argv[2] == "pip install x"
        ]
        assert len(setups) == 1
        assert setups[0].env["A"] == "b"


def test_a_failed_node_fails_the_job_with_its_log_tail(setup: Setup) -> None:
    coord, provider, node, state = setup
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",)))
    node.exit_codes[state.nodes("c1")[1].root] = 3
    lines: list[tuple[int, str]] = []
    done = coord.follow(rec.id, lambda i, line: lines.append((i, line)))
    assert done.status == "failed"
    assert done.exit_code == 3
    assert done.detail["failed_node"] == 1
    assert "line two" in done.detail["log_tail"]
    assert (0, "line one") in lines
    assert (1, "line two") in lines
    kills = [
        c
        for c in provider.executors[state.nodes("c1")[0].node_id].calls
        if c.argv[1:4] == ("-m", "cloudtrain.node", "kill")
    ]
    assert kills, "the healthy node is stopped when another fails"
    with pytest.raises(JobError, match="node 1 exited 3"):
        coord.raise_for_status(done)


def test_success_and_unknown_names(setup: Setup) -> None:
    coord, _, _, _ = setup
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",)))
    assert coord.refresh(rec.id).status == "succeeded"
    with pytest.raises(NotFoundError):
        coord.submit("nope", JobSpec(entrypoint=("train.py",)))
    with pytest.raises(NotFoundError):
        coord.refresh("nope-9")


def test_refresh_records_each_node_s_state_and_waits_for_an_unreachable_one(
    setup: Setup,
) -> None:
    coord, _, node, state = setup
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",)))
    roots = [n.root for n in state.nodes("c1")]
    node.exit_codes[roots[0]] = None  # still running
    node.lost.add(roots[1])
    now = coord.refresh(rec.id)
    assert now.status == "running"
    assert now.detail["nodes"] == [
        {"state": "running", "exit_code": None},
        {"state": "unreachable", "exit_code": None,
         "why": "Timeout, server 10.0.0.2 not responding."},
    ]  # fmt: skip
    node.exit_codes[roots[0]] = 0
    assert coord.refresh(rec.id).status == "running", "a silent node is no verdict"
    node.lost.clear()
    done = coord.refresh(rec.id)
    assert done.status == "succeeded"
    assert done.detail["nodes"] == [{"state": "exited", "exit_code": 0}] * 2


def test_a_job_on_fewer_nodes_than_its_cluster_is_judged_by_its_own(setup: Setup) -> None:
    """`--nodes 1` on a two-node cluster: the node it never ran on (no job folder there:
    "vanished" to its agent) neither fails it nor is asked for it."""
    coord, _, node, state = setup
    roots = [n.root for n in state.nodes("c1")]
    node.exit_codes[roots[1]] = None  # what its agent would say: no exit code, no process
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",), num_nodes=1))
    assert rec.detail["ran_on"] == [0]
    done = coord.refresh(rec.id)
    assert done.status == "succeeded"
    assert done.detail["nodes"] == [{"state": "exited", "exit_code": 0}]


def test_a_preemption_notice_is_one_event_of_the_job_and_marks_the_node(setup: Setup) -> None:
    coord, _, node, state = setup
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",)))
    roots = [n.root for n in state.nodes("c1")]
    for root in roots:
        node.exit_codes[root] = None
    node.notices[roots[1]] = {"source": "imdsv2", "action": "terminate",
                              "not_before": "2026-12-02T10:00:00Z", "noticed_at": 1.0}  # fmt: skip
    for _ in range(2):
        now = coord.refresh(rec.id)
    assert now.detail["nodes"][1] == {"state": "running", "exit_code": None, "preempted": True}
    said = [e.message for e in state.events(job_id=rec.id) if e.kind == "preemption"]
    assert said == [
        f"job {rec.id}: node 1's cloud will terminate it at 2026-12-02T10:00:00Z (imdsv2 "
        "notice); the job was told to checkpoint"
    ]


def test_a_host_that_goes_away_while_followed_fails_the_job_and_stops_the_others(
    setup: Setup,
) -> None:
    coord, provider, node, state = setup
    rec = coord.submit("c1", JobSpec(entrypoint=("train.py",)))
    head, other = state.nodes("c1")
    node.lost.add(other.root)
    done = coord.follow(rec.id, lambda i, line: None)
    assert done.status == "failed"
    assert done.detail["failed_node"] == 1
    assert done.detail["reason"] == ("went away (Timeout, server 10.0.0.2 not responding.)")
    kills = [c for c in provider.executors[head.node_id].calls
             if c.argv[1:4] == ("-m", "cloudtrain.node", "kill")]  # fmt: skip
    assert kills, "the reachable node is stopped"
    with pytest.raises(JobError, match="node 1 went away"):
        coord.raise_for_status(done)


def test_down_terminates_even_when_a_node_cannot_be_reached_to_stop_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing may keep billing because a node stopped answering: `down` warns and goes on."""
    from cloudtrain import api
    from cloudtrain.model import Event
    from cloudtrain.providers.fake import provider as fake

    node = Node()
    monkeypatch.setitem(fake._CLOUDS, tmp_path, FakeCloud())
    monkeypatch.setitem(fake._HANDLERS, tmp_path, node)
    provider = FakeProvider(ProviderContext(home=tmp_path))
    state = State.open(tmp_path)
    spec = ClusterSpec("c1", "fake", 2, Resources(accelerator="A100", count=8))
    state.put_cluster(spec, status=ClusterStatus.UP)
    state.set_nodes("c1", provider.apply(provider.plan(spec)))
    rec = Coordinator(state, provider, home=tmp_path).submit("c1", JobSpec(("train.py",)))
    node.exit_codes[state.nodes("c1")[0].root] = None
    node.lost.add(state.nodes("c1")[1].root)
    events: list[Event] = []
    assert api.down(state, tmp_path, "c1", on_event=events.append)
    (warning,) = [e.message for e in events if e.kind == "warning"]
    assert warning.startswith(f"could not stop job {rec.id} on every node (")
    assert warning.endswith("; terminating anyway")
    assert provider.describe("c1") == []
    assert state.cluster("c1") is None


class Echo(Runtime):
    """A runtime from a plugin (one class, one entry point): each node runs `echo` once."""

    name = "echo"
    wired = ("ECHO_RANK",)

    def workers_per_node(self, gpus: int) -> int:
        return 1

    def argvs(self, start: Start) -> list[list[str]]:
        return [["echo", start.attempt_id, str(start.nproc), str(n.index)] for n in start.nodes]


def test_a_runtime_from_an_entry_point_starts_the_job_with_no_edit_in_core(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloudtrain.spec import frameworks

    monkeypatch.setattr(frameworks, "_plugins", lambda: {"echo": f"{__name__}:Echo"})
    assert frameworks.validate_runtime("echo") == "echo"
    coord, provider, _, _ = setup
    with pytest.raises(ConfigError, match=r"^envs: ECHO_RANK='1': cloudtrain sets ECHO_RANK"):
        coord.submit("c1", JobSpec(entrypoint=("t.py",), runtime="echo", envs={"ECHO_RANK": "1"}))
    assert started(provider) == []
    rec = coord.submit("c1", JobSpec(entrypoint=("t.py",), runtime="echo"))
    argvs = [c.argv for c in started(provider)]
    assert argvs == [("echo", rec.id, "1", "0"), ("echo", rec.id, "1", "1")]
    assert {c.env["CLOUDTRAIN_RUNTIME"] for c in started(provider)} == {"echo"}
    runtime_calls = [c.argv[3:5] for ex in provider.executors.values() for c in ex.calls
                     if c.argv[1:4] == ("-m", "cloudtrain.node", "runtime")]  # fmt: skip
    assert runtime_calls == [("runtime", "echo")] * 2  # its nodes are asked to install it


def _import_time(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(warm.IMPORT_TIME)}


@pytest.mark.parametrize("gpus", [8, 0])
def test_a_cluster_just_up_is_readied_with_what_its_first_job_has_at_import_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int
) -> None:
    """`up` readies each node for the jobs to come (`prewarm_cluster`: a warm server). The
    server serves only a job whose import-time variables are its own: had it started with
    others, the first job would find it stale and start cold."""
    monkeypatch.delenv(warm.SWITCH, raising=False)
    provider = FakeProvider(
        ProviderContext(home=tmp_path, options={"cloud": FakeCloud(), "handler": Node()})
    )
    state = State.open(tmp_path)
    spec = ClusterSpec(
        "c1", "fake", 2, Resources(accelerator="A100", count=gpus) if gpus else Resources()
    )
    state.put_cluster(spec, status=ClusterStatus.UP)
    state.set_nodes("c1", provider.apply(provider.plan(spec)))
    coord = Coordinator(state, provider, home=tmp_path)
    nodes = state.nodes("c1")

    def readied() -> list[Call]:
        calls = [c for ex in provider.executors.values() for c in ex.calls]
        return [c for c in calls if c.argv[1:] == ("-m", "cloudtrain.jobs.warm", "--start")]

    coord.prewarm_cluster("c1", nodes)
    ready = {c.env["CLOUDTRAIN_NODE_ROOT"]: c for c in readied()}
    assert sorted(ready) == sorted(n.root for n in nodes)
    coord.submit("c1", JobSpec(entrypoint=("train.py",)))
    for call in started(provider):
        server = ready[call.env["CLOUDTRAIN_NODE_ROOT"]]
        assert _import_time(call.env) == _import_time(server.env)
        assert _import_time(call.env).get("OMP_NUM_THREADS") == (None if gpus else "1")
    monkeypatch.setenv(warm.SWITCH, "0")  # as a job's own `CLOUDTRAIN_WARM=0`: none readied
    coord.prewarm_cluster("c1", nodes)
    assert len(readied()) == 2
