"""The cluster id through the library's verbs on the fake cloud: given by `up` to a new
record, kept by the record, on every node's tags, and what `down` of a record acts on."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cloudtrain import api
from cloudtrain.errors import ConfigError
from cloudtrain.model import TAG_CLUSTER_ID
from cloudtrain.providers.fake.provider import FakeCloud, FakeProvider
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec
from cloudtrain.state import State


def cloud_of(home: Path) -> FakeCloud:
    prov = api.provider("fake", home)
    assert isinstance(prov, FakeProvider)
    return prov.cloud


def recorded_id(state: State, name: str) -> str | None:
    record = state.cluster(name)
    assert record is not None, f"{name} is recorded"
    return record.spec.cluster_id


def owner_of(home: Path) -> str:
    prov = api.provider("fake", home)
    assert isinstance(prov, FakeProvider)
    return prov.owner


def test_up_gives_a_new_record_an_id_that_a_second_up_keeps(tmp_path: Path) -> None:
    state = State.open(tmp_path)
    spec = ClusterSpec("c1", "fake", 2)
    api.up(state, tmp_path, spec, bootstrap_timeout_s=None)
    cid = str(recorded_id(state, "c1"))
    assert re.fullmatch(r"[0-9a-f]{12}", cid)
    assert {i.tags[TAG_CLUSTER_ID] for i in cloud_of(tmp_path).live("c1")} == {cid}
    api.up(state, tmp_path, spec, bootstrap_timeout_s=None)  # completes, makes nothing new
    assert recorded_id(state, "c1") == cid
    assert len(cloud_of(tmp_path).live("c1")) == 2
    assert spec.differences(dataclasses.replace(spec, cluster_id=cid)) == []
    assert api.down(state, tmp_path, "c1")
    assert cloud_of(tmp_path).live() == []
    api.up(state, tmp_path, spec, bootstrap_timeout_s=None)
    assert recorded_id(state, "c1") not in (cid, None), "a new record is a new incarnation"


def test_down_of_a_stale_record_leaves_the_names_other_incarnation(tmp_path: Path) -> None:
    """The record's incarnation is gone; the cloud holds another of the same name and owner
    (made from another machine): `down` drops the record and deletes nothing, `up` is
    refused before any write, and `down --provider` with no record removes it."""
    state = State.open(tmp_path)
    api.up(state, tmp_path, ClusterSpec("c1", "fake", 1), bootstrap_timeout_s=None)
    cloud, owner = cloud_of(tmp_path), owner_of(tmp_path)
    for inst in cloud.live("c1"):
        inst.state = "terminated"
    cloud.create("c1", [0, 1], "fake-1a", "fake-cpu", owner, cluster_id="0123456789ab")
    assert api.down(state, tmp_path, "c1")
    assert state.cluster("c1") is None
    assert len(cloud.live("c1")) == 2, "another incarnation is not the record's to delete"
    requests = len(cloud.requests)
    with pytest.raises(ConfigError, match=r"another cluster of owner .* \(id 0123456789ab\)"):
        api.up(state, tmp_path, ClusterSpec("c1", "fake", 2), bootstrap_timeout_s=None)
    assert len(cloud.requests) == requests, "refused before any write"
    assert state.cluster("c1") is None, "a refused up keeps no record"
    assert api.down(state, tmp_path, "c1", provider_name="fake")
    assert cloud.live() == []


def test_a_record_of_an_older_version_has_no_id_and_acts_on_the_name(tmp_path: Path) -> None:
    state = State.open(tmp_path)
    cloud = cloud_of(tmp_path)
    cloud.create("old", [0], "fake-1a", "fake-cpu", owner_of(tmp_path))
    state.put_cluster(ClusterSpec("old", "fake", 1), status=ClusterStatus.UP)
    api.up(state, tmp_path, ClusterSpec("old", "fake", 1), bootstrap_timeout_s=None)
    assert recorded_id(state, "old") is None
    assert len(cloud.live("old")) == 1, "completed, not made again"
    assert api.down(state, tmp_path, "old")
    assert cloud.live() == []
