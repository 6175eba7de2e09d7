"""cloudtrain.state against real SQLite files in tmp_path (no mocks)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from cloudtrain import records
from cloudtrain.errors import NotFoundError, StateError
from cloudtrain.model import NodeInfo
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import BUSY_TIMEOUT_S, SCHEMA_VERSION, State, home


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spec(name: str = "exp1", num_nodes: int = 2) -> ClusterSpec:
    return ClusterSpec(
        name=name,
        provider="aws",
        num_nodes=num_nodes,
        resources=Resources(accelerator="A100", count=8, spot=True, region="us-east-1"),
        ssh_cidr="10.0.0.0/8",
        extra={"profile": "research"},
    )


def node(index: int, cluster: str = "exp1") -> NodeInfo:
    return NodeInfo(
        cluster=cluster,
        index=index,
        node_id=f"i-{index:04d}",
        private_ip=f"10.0.0.{index + 1}",
        public_ip=None,
        state="running",
        zone="us-east-1a",
        instance_type="p4d.24xlarge",
        root="/opt/cloudtrain",
        python="/opt/venv/bin/python",
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(tmp_path: Path, clock: Clock) -> Iterator[State]:
    with State.open(tmp_path / "home", clock=clock) as opened:
        yield opened


# -- the file -------------------------------------------------------------------------------


def test_creates_home_0700_and_file_0600(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "home"
    with State.open(folder) as st:
        st.add_event("exp1", "note", "hello")  # makes the -wal file too
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "state.db").stat().st_mode) == 0o600
    for extra in folder.glob("state.db-*"):
        assert stat.S_IMODE(extra.stat().st_mode) & 0o077 == 0, extra


def test_tightens_a_looser_existing_file(tmp_path: Path) -> None:
    State.open(tmp_path).close()
    (tmp_path / "state.db").chmod(0o644)
    State.open(tmp_path).close()
    assert stat.S_IMODE((tmp_path / "state.db").stat().st_mode) == 0o600


def test_wal_foreign_keys_busy_timeout_and_schema_version(state: State) -> None:
    assert BUSY_TIMEOUT_S >= 10
    with closing(sqlite3.connect(state.path)) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 1
    conn = state._conn  # the pragmas below are per connection
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 10_000
    state.check()


def test_a_writer_waits_for_another_process_lock(state: State) -> None:
    other = sqlite3.connect(state.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, lambda: other.execute("COMMIT")).start()
    started = time.monotonic()
    state.add_event("exp1", "note", "after the lock")
    assert time.monotonic() - started >= 0.25
    assert [e.message for e in state.events()] == ["after the lock"]
    other.close()


def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    State.open(tmp_path).close()
    with closing(sqlite3.connect(tmp_path / "state.db")) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StateError, match=rf"schema version {SCHEMA_VERSION + 1}, newer") as err:
        State.open(tmp_path)
    assert str(tmp_path / "state.db") in str(err.value)


def test_garbage_file_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"this is not a database, " * 100)
    with pytest.raises(StateError, match="cannot open the state file") as err:
        State.open(tmp_path)
    assert str(tmp_path / "state.db") in str(err.value)


def test_a_directory_in_the_way_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "state.db").mkdir()
    with pytest.raises(StateError, match=r"state\.db"):
        State.open(tmp_path)


def test_home_honours_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "ct"))
    assert home() == tmp_path / "ct"
    assert not (tmp_path / "ct").exists()  # home() creates nothing
    with State.open() as st:
        assert st.path == tmp_path / "ct" / "state.db"
    assert st.path.is_file()
    monkeypatch.delenv("CLOUDTRAIN_HOME")
    assert home().name == "cloudtrain"


def test_closed_state_raises_state_error(tmp_path: Path) -> None:
    st = State.open(tmp_path)
    st.close()
    st.close()  # idempotent
    with pytest.raises(StateError):
        st.clusters()


# -- records --------------------------------------------------------------------------------


def test_cluster_round_trip_keeps_created_at(state: State, clock: Clock) -> None:
    plan = {"offers": [{"region": "us-east-1", "price": 32.77}]}
    state.put_cluster(spec(), status=ClusterStatus.PROVISIONING, price_per_hour=65.54, plan=plan)
    clock.now = 2000.0
    state.put_cluster(spec(num_nodes=3), status=ClusterStatus.UP)
    rec = state.cluster("exp1")
    assert rec is not None
    assert (rec.name, rec.provider, rec.status) == ("exp1", "aws", "up")
    assert (rec.created_at, rec.updated_at) == (1000.0, 2000.0)
    assert rec.spec == spec(num_nodes=3)
    assert rec.price_per_hour == 65.54  # None keeps what was stored
    assert rec.plan == plan
    clock.now = 3000.0
    state.set_cluster_status("exp1", ClusterStatus.STOPPED)
    assert state.cluster("exp1") == replace(rec, status=ClusterStatus.STOPPED, updated_at=3000.0)
    state.put_cluster(spec("b"), status=ClusterStatus.UP)
    assert [c.name for c in state.clusters()] == ["b", "exp1"]
    assert state.cluster("nope") is None
    with pytest.raises(NotFoundError):
        state.set_cluster_status("nope", ClusterStatus.UP)


def test_a_cluster_status_moves_only_as_the_table_says(state: State) -> None:
    """`records.MOVES` is the one place a cluster's statuses and their moves are: an `up`'s
    walk, a kill's leftovers, what reconcile sees and a stop by itself pass; another move is a
    bug, refused with both statuses named, and the record is left as it was."""
    state.put_cluster(spec(), status=ClusterStatus.PROVISIONING)
    for status in (
        ClusterStatus.BOOTSTRAPPING,
        ClusterStatus.UP,
        ClusterStatus.STOPPED,
        ClusterStatus.PARTIAL,
        ClusterStatus.GONE,
    ):
        state.set_cluster_status("exp1", status)
    with pytest.raises(StateError, match="cluster 'exp1': no move from gone to bootstrapping"):
        state.set_cluster_status("exp1", ClusterStatus.BOOTSTRAPPING)
    rec = state.cluster("exp1")
    assert rec is not None
    assert rec.status == ClusterStatus.GONE
    assert all(records.may_move(s, s) for s in ClusterStatus), "staying is no move"
    assert set(records.MOVES) == set(ClusterStatus), "every status has its moves"


def test_a_damaged_cluster_status_is_one_line_naming_it(state: State) -> None:
    state.put_cluster(spec(), status=ClusterStatus.UP)
    with sqlite3.connect(state.path) as conn:
        conn.execute("UPDATE clusters SET status = 'sideways' WHERE name = 'exp1'")
    with pytest.raises(StateError, match="status of cluster 'exp1' is damaged: 'sideways'"):
        state.cluster("exp1")


def test_nodes_round_trip_replace_and_order(state: State) -> None:
    state.put_cluster(spec(), status=ClusterStatus.UP)
    state.set_nodes("exp1", [node(1), node(0)])
    assert state.nodes("exp1") == [node(0), node(1)]
    assert state.nodes("exp1")[0].root == "/opt/cloudtrain"
    state.set_nodes("exp1", [node(2)])
    assert state.nodes("exp1") == [node(2)]
    assert state.nodes("other") == []
    with pytest.raises(NotFoundError):
        state.set_nodes("other", [node(0, "other")])
    with pytest.raises(ValueError, match="distinct"):
        state.set_nodes("exp1", [node(0), node(0)])


def test_job_round_trip_and_update(state: State, clock: Clock) -> None:
    job = state.new_job("exp1", "train", num_nodes=2, nproc_per_node=8, command=["python", "t.py"])
    assert (job.id, job.status, job.created_at) == ("exp1-1", "pending", 1000.0)
    assert (job.num_nodes, job.nproc_per_node, job.command) == (2, 8, ("python", "t.py"))
    assert not job.finished
    assert dict(job.detail) == {}
    running = state.update_job(job.id, status="running", started_at=1001.0, detail={"pid": 42})
    done = state.update_job(job.id, status="failed", exit_code=3, ended_at=1005, detail={"n": 1})
    assert running.started_at == 1001.0
    assert not running.finished
    assert done == state.job(job.id)
    assert (done.status, done.exit_code, done.started_at, done.ended_at) == (
        "failed",
        3,
        1001,
        1005,
    )
    assert dict(done.detail) == {"pid": 42, "n": 1}
    assert done.finished
    nested = MappingProxyType({"gpus": MappingProxyType({"0": "A100"}), "ips": ("10.0.0.1",)})
    again = state.update_job(job.id, detail={**done.detail, "nested": nested})
    assert again.detail["nested"] == {"gpus": {"0": "A100"}, "ips": ["10.0.0.1"]}
    assert state.job("exp1-99") is None
    with pytest.raises(NotFoundError):
        state.update_job("exp1-99", status="running")
    with pytest.raises(ValueError, match="not one of"):
        state.update_job(job.id, status="done")


def test_jobs_newest_first_and_by_cluster(state: State) -> None:
    ids = [state.new_job(c, "j", num_nodes=1, nproc_per_node=1, command=[]).id for c in "aba"]
    assert ids == ["a-1", "b-2", "a-3"]
    assert [j.id for j in state.jobs()] == ["a-3", "b-2", "a-1"]
    assert [j.id for j in state.jobs("a")] == ["a-3", "a-1"]


def test_delete_cluster_keeps_history_and_ids_are_never_reused(state: State) -> None:
    state.put_cluster(spec(), status=ClusterStatus.UP)
    state.set_nodes("exp1", [node(0)])
    old = state.new_job("exp1", "train", num_nodes=1, nproc_per_node=1, command=["x"])
    state.add_event("exp1", "up", "cluster ready", job_id=old.id)
    state.delete_cluster("exp1")
    state.delete_cluster("exp1")  # idempotent
    assert state.cluster("exp1") is None
    assert state.nodes("exp1") == []
    assert state.job(old.id) == old
    assert [e.job_id for e in state.events("exp1")] == [old.id]
    state.put_cluster(spec(), status=ClusterStatus.UP)
    new = state.new_job("exp1", "train", num_nodes=1, nproc_per_node=1, command=["x"])
    assert new.id != old.id
    assert new.seq > old.seq


def test_events_filters_limit_and_order(state: State, clock: Clock) -> None:
    for i in range(5):
        clock.now = 1000.0 + i
        state.add_event("a" if i % 2 == 0 else "b", "k", f"m{i}", job_id="a-1" if i == 4 else None)
    assert [e.message for e in state.events()] == ["m0", "m1", "m2", "m3", "m4"]
    assert [e.message for e in state.events("a")] == ["m0", "m2", "m4"]
    assert [e.message for e in state.events(job_id="a-1")] == ["m4"]
    assert [e.message for e in state.events(limit=2)] == ["m3", "m4"]  # the latest, oldest first
    assert [e.message for e in state.events(limit=None)] == ["m0", "m1", "m2", "m3", "m4"]
    last = state.events(limit=1)[0]
    assert (last.ts, last.cluster, last.kind, last.job_id) == (1004.0, "a", "k", "a-1")


def test_intents_begin_end_and_open(state: State, clock: Clock) -> None:
    first = state.begin_intent("exp1", "up", {"offer": "us-east-1a"})
    second = state.begin_intent("b", "down")
    assert [(i.id, i.action, dict(i.detail)) for i in state.open_intents()] == [
        (first, "up", {"offer": "us-east-1a"}),
        (second, "down", {}),
    ]
    clock.now = 1010.0
    assert state.end_intent(first, "ok") is True
    assert state.end_intent(first, "later") is False  # first outcome wins
    assert [i.id for i in state.open_intents()] == [second]
    assert state.open_intents("exp1") == []
    with pytest.raises(NotFoundError):
        state.end_intent(9999, "ok")


def test_an_intent_left_open_is_found_by_the_next_process(tmp_path: Path) -> None:
    with State.open(tmp_path) as st:
        st.begin_intent("exp1", "up")  # the process "dies" here
    with State.open(tmp_path) as st:
        (found,) = st.open_intents("exp1")
        assert (found.action, found.closed_at, found.outcome) == ("up", None, None)


def test_intent_context_manager_records_ok_and_errors(state: State, clock: Clock) -> None:
    with state.intent("exp1", "up", {"n": 2}) as ok_id:
        assert [i.id for i in state.open_intents()] == [ok_id]
    with pytest.raises(RuntimeError, match="no capacity"), state.intent("exp1", "up") as err_id:
        raise RuntimeError("no capacity")
    with pytest.raises(KeyboardInterrupt), state.intent("exp1", "down") as ctrl_c_id:
        raise KeyboardInterrupt
    assert state.open_intents() == []
    with closing(sqlite3.connect(state.path)) as conn:
        rows = conn.execute("SELECT id, outcome, closed_at FROM intents").fetchall()
    assert sorted(rows) == [
        (ok_id, "ok", 1000.0),
        (err_id, "error: RuntimeError: no capacity", 1000.0),
        (ctrl_c_id, "error: KeyboardInterrupt: ", 1000.0),
    ]


# -- concurrency ----------------------------------------------------------------------------

WORKERS = 4
PER_WORKER = 30


def _worker(folder: str, worker: int, shared: str, barrier: threading.Barrier) -> None:
    with State.open(Path(folder)) as st:
        barrier.wait()
        for i in range(PER_WORKER):
            job = st.new_job("exp1", f"w{worker}", num_nodes=1, nproc_per_node=1, command=["x"])
            st.add_event("exp1", "job", f"w{worker}-{i}", job_id=job.id)
            st.update_job(shared, detail={f"w{worker}-{i}": i})


def test_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    with State.open(tmp_path) as st:
        shared = st.new_job("exp1", "shared", num_nodes=1, nproc_per_node=1, command=["x"]).id
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [
        ctx.Process(target=_worker, args=(str(tmp_path), w, shared, barrier))
        for w in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * WORKERS
    with State.open(tmp_path) as st:
        jobs = [j for j in st.jobs() if j.id != shared]
        assert len(jobs) == len({j.id for j in jobs}) == WORKERS * PER_WORKER
        assert sorted(j.seq for j in jobs) == list(range(2, WORKERS * PER_WORKER + 2))
        events = st.events(limit=None)
        assert len(events) == WORKERS * PER_WORKER
        assert {e.job_id for e in events} == {j.id for j in jobs}
        shared_job = st.job(shared)
        assert shared_job is not None
        assert len(shared_job.detail) == WORKERS * PER_WORKER  # no read-modify-write lost an update
        st.check()


def test_a_fresh_file_opened_by_many_processes_at_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=_open_once, args=(str(tmp_path), barrier)) for _ in range(WORKERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * WORKERS
    with State.open(tmp_path) as st:
        assert len(st.events(limit=None)) == WORKERS
        st.check()


def _open_once(folder: str, barrier: threading.Barrier) -> None:
    barrier.wait()
    with State.open(Path(folder)) as st:
        st.add_event("exp1", "open", "hi")


def test_threads_sharing_one_state(state: State) -> None:
    def work(n: int) -> None:
        for _ in range(20):
            state.new_job("t", f"n{n}", num_nodes=1, nproc_per_node=1, command=["x"])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({j.id for j in state.jobs("t")}) == 80


def test_node_records_of_the_earlier_shape_are_read_into_the_typed_fields() -> None:
    """Records written before root/python/user/region/jump were fields kept them in extra."""
    old = {
        "cluster": "exp1",
        "index": 1,
        "node_id": "i-1",
        "private_ip": "10.0.0.2",
        "public_ip": None,
        "state": "running",
        "zone": "us-east-1a",
        "instance_type": "p4d.24xlarge",
        "extra": {
            "root": "/home/cloudtrain/.cloudtrain",
            "python": "/v/bin/python",
            "user": "cloudtrain",
            "region": "us-east-1",
            "jump": "198.51.100.4",
            "ifname": "ens5",
            "bootstrap": ["/r/bootstrap/bootstrap.sh", "/r/bootstrap/bootstrap.env"],
            "spot": True,
        },
    }
    read = NodeInfo.from_dict(old)
    assert read.ifname == "ens5"
    assert read.bootstrap == ("/r/bootstrap/bootstrap.sh", "/r/bootstrap/bootstrap.env")
    assert (read.root, read.python, read.user, read.region, read.jump) == (
        "/home/cloudtrain/.cloudtrain",
        "/v/bin/python",
        "cloudtrain",
        "us-east-1",
        "198.51.100.4",
    )
    assert dict(read.extra) == {"spot": True}
    assert NodeInfo.from_dict(read.to_dict()) == read
