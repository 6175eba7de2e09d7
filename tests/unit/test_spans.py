"""Node spans in the state file: opened and ended with the recorded nodes, priced from the plan,
kept after `down`, and made for the nodes of a state file written before spans were."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from cloudtrain.model import NodeInfo
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import _MIGRATIONS, SCHEMA_VERSION, State


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spec(name: str = "exp1", spot: bool = False) -> ClusterSpec:
    return ClusterSpec(
        name=name,
        provider="aws",
        num_nodes=2,
        resources=Resources(accelerator="A100", count=8, spot=spot),
        cluster_id="c0ffee000001",
    )


def node(index: int, node_id: str | None = None, state: str = "running", **kw: str) -> NodeInfo:
    return NodeInfo(
        cluster="exp1",
        index=index,
        node_id=node_id or f"i-{index}",
        private_ip=None,
        public_ip=None,
        state=state,
        zone=kw.get("zone", "us-east-1a"),
        instance_type="p4d.24xlarge",
        region=kw.get("region", "us-east-1"),
    )


#: Two offers, as `up` records the plan: a failover to us-west-2 bills at its own price.
PLAN = {
    "offers": [
        {
            "region": "us-east-1",
            "zones": ["us-east-1a"],
            "instance_type": "p4d.24xlarge",
            "price_per_node_hour": 32.77,
            "spot": False,
        },
        {
            "region": "us-west-2",
            "zones": ["us-west-2b"],
            "instance_type": "p4d.24xlarge",
            "price_per_node_hour": 30.5,
            "spot": False,
        },
    ]
}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(tmp_path: Path, clock: Clock) -> Iterator[State]:
    with State.open(tmp_path / "home", clock=clock) as opened:
        opened.put_cluster(spec(), status=ClusterStatus.UP, price_per_hour=65.54, plan=PLAN)
        yield opened


def story(state: State) -> list[tuple[int, str, float, float | None, str | None]]:
    return [(s.index, s.node_id, s.started_at, s.ended_at, s.end_reason) for s in state.spans()]


def test_a_span_opens_with_a_billing_node_and_ends_when_it_goes(state: State, clock: Clock) -> None:
    state.set_nodes("exp1", [node(0), node(1)], since=990.0)  # asked for at 990
    clock.now = 1100.0
    state.set_nodes("exp1", [node(0), node(1)])  # the same nodes: nothing new
    assert story(state) == [(0, "i-0", 990.0, None, None), (1, "i-1", 990.0, None, None)]
    first = state.spans()[0]
    assert (first.cluster, first.cluster_id, first.provider) == ("exp1", "c0ffee000001", "aws")
    assert (first.region, first.zone, first.instance_type) == (
        "us-east-1",
        "us-east-1a",
        "p4d.24xlarge",
    )
    assert (first.price_per_hour, first.spot, first.bills_until) == (32.77, False, None)

    clock.now = 1200.0  # node 1 replaced, node 0 stopped
    state.set_nodes("exp1", [node(0, state="stopped"), node(1, "i-1b")], since=1150.0)
    clock.now = 1300.0  # node 0 started again; node 1 gone
    state.set_nodes("exp1", [node(0)])
    assert story(state) == [
        (0, "i-0", 990.0, 1200.0, "stopped"),
        (1, "i-1", 990.0, 1200.0, "replaced"),
        (1, "i-1b", 1150.0, 1300.0, "gone"),
        (0, "i-0", 1300.0, None, None),
    ]


def test_a_span_is_priced_from_the_offer_its_node_runs_under(state: State) -> None:
    state.set_nodes("exp1", [node(0, region="us-west-2", zone="us-west-2b")])
    assert [s.price_per_hour for s in state.spans()] == [30.5]


def test_without_a_plan_the_clusters_price_is_shared_and_spot_is_the_specs(
    tmp_path: Path,
) -> None:
    with State.open(tmp_path / "h", clock=lambda: 5.0) as st:
        st.put_cluster(spec(spot=True), status=ClusterStatus.UP, price_per_hour=3.0)
        st.set_nodes("exp1", [node(0), node(1)])
        assert [(s.price_per_hour, s.spot) for s in st.spans()] == [(1.5, True), (1.5, True)]


def test_spans_jobs_and_events_outlive_down(state: State, clock: Clock) -> None:
    state.set_nodes("exp1", [node(0), node(1)])
    job = state.new_job("exp1", "train", num_nodes=2, nproc_per_node=8, command=["t.py"])
    state.add_event("exp1", "up", "2 node(s) running")
    clock.now = 4600.0
    state.delete_cluster("exp1")
    state.add_event("exp1", "down", "cluster 'exp1' terminated")
    assert state.cluster("exp1") is None
    assert story(state) == [(0, "i-0", 1000.0, 4600.0, "down"), (1, "i-1", 1000.0, 4600.0, "down")]
    assert state.job(job.id) == job
    assert [e.kind for e in state.events("exp1")] == ["up", "down"]
    clock.now = 9000.0
    state.delete_cluster("exp1")  # idempotent: nothing more ends
    assert [s.ended_at for s in state.spans("exp1")] == [4600.0, 4600.0]


def test_spans_since_keeps_the_open_and_the_recent(state: State, clock: Clock) -> None:
    state.set_nodes("exp1", [node(0), node(1)])
    clock.now = 2000.0
    state.set_nodes("exp1", [node(0)])
    assert [s.index for s in state.spans(since=2000.0)] == [0, 1], "ended at that moment"
    assert [s.index for s in state.spans(since=2500.0)] == [0], "still open"
    assert state.spans("other") == []


def test_the_event_log_by_name_after_an_id_and_since(state: State, clock: Clock) -> None:
    for i, (cluster, job) in enumerate(
        [("exp1", None), ("b", None), ("exp1", "exp1-1"), ("b", "b-2")]
    ):
        clock.now = 2000.0 + i
        state.add_event(cluster, "k", f"m{i}", job_id=job)
    assert [e.message for e in state.event_log()] == ["m0", "m1", "m2", "m3"]
    assert [e.message for e in state.event_log("exp1")] == ["m0", "m2"]
    assert [e.message for e in state.event_log("b-2")] == ["m3"]
    first = state.event_log()[0].id
    assert [e.message for e in state.event_log(after=first + 1)] == ["m2", "m3"]
    assert [e.message for e in state.event_log("exp1", since=2001.0)] == ["m2"]


# -- a state file written before spans were ----------------------------------------------------


def v1_file(home: Path) -> None:
    """A state file as cloudtrain with schema version 1 wrote it: a live cluster, one that
    stopped itself, a job and events."""
    home.mkdir(mode=0o700)
    live = spec("live")
    idle = replace(spec("idle", spot=True), cluster_id=None)
    with closing(sqlite3.connect(home / "state.db")) as conn:
        for statement in _MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        for s, status, created, updated, plan in (
            (live, "up", 100.0, 150.0, json.dumps(PLAN)),
            (idle, "stopped", 200.0, 900.0, None),
        ):
            conn.execute(
                "INSERT INTO clusters VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (s.name, s.provider, json.dumps(s.to_dict()), status, created, updated, 8.0, plan),
            )
        rows = [
            ("live", 0, node(0)),
            ("live", 1, node(1, state="running")),
            ("idle", 0, replace(node(0), cluster="idle", region=None)),
        ]
        for cluster, index, n in rows:
            record = replace(n, cluster=cluster).to_dict()
            if cluster == "idle":  # an older shape: the region in extra
                record["extra"] = {"region": "us-east-2"}
                del record["region"]
            conn.execute("INSERT INTO nodes VALUES (?, ?, ?)", (cluster, index, json.dumps(record)))
        conn.execute("INSERT INTO nodes VALUES ('broken', 0, 'not json')")
        conn.execute(
            "INSERT INTO jobs (id, seq, cluster, name, status, created_at, num_nodes, "
            "nproc_per_node, command_json) VALUES ('live-1', 1, 'live', 't', 'succeeded', 120, "
            "2, 8, '[\"t.py\"]')"
        )
        conn.execute(
            "INSERT INTO events (ts, cluster, job_id, kind, message) "
            "VALUES (110, 'live', NULL, 'up', '2 node(s) running')"
        )
        conn.commit()


def test_a_v1_state_file_is_migrated_with_its_data_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    v1_file(home)
    with State.open(home, clock=lambda: 1000.0) as st:
        assert SCHEMA_VERSION == 2
        assert [c.name for c in st.clusters()] == ["idle", "live"]
        assert [n.node_id for n in st.nodes("live")] == ["i-0", "i-1"]
        assert st.job("live-1") is not None
        assert [e.message for e in st.events("live")] == ["2 node(s) running"]
        spans = {(s.cluster, s.index): s for s in st.spans()}
        assert set(spans) == {("live", 0), ("live", 1), ("idle", 0)}, "a damaged record: none"
        live = spans["live", 0]
        assert (live.started_at, live.ended_at, live.price_per_hour, live.spot) == (
            100.0,
            None,
            32.77,
            False,
        )
        assert (live.cluster_id, live.region, live.zone) == (
            "c0ffee000001",
            "us-east-1",
            "us-east-1a",
        )
        idle = spans["idle", 0]  # no plan: the cluster's $8/h over its 2 nodes; spot from its spec
        assert (idle.started_at, idle.ended_at, idle.end_reason) == (200.0, 900.0, "stopped")
        assert (idle.price_per_hour, idle.spot, idle.region) == (4.0, True, "us-east-2")
        st.set_nodes("live", [replace(node(0), cluster="live"), replace(node(1), cluster="live")])
        assert len(st.spans("live")) == 2, "the migrated spans go on"
    with closing(sqlite3.connect(home / "state.db")) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
