"""Owners whose names differ only where GCE's label alphabet cannot write them (``alice@lab``,
``alice.lab``, ``Alice@Lab``) are three owners, and a cluster labelled the older, lossy way
is still its owner's by its cluster id: through the real google-cloud-compute client against
the GCE stand-in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.gcp import _resources as res
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.provision.provider import ProviderContext
from tests.gcp.standin import StandIn
from tests.gcp.test_provider import a100

ID_A = "aaaaaaaaaaaa"
RULES = ["cloudtrain-exp1-deny", "cloudtrain-exp1-internal", "cloudtrain-exp1-ssh"]


def owner(tmp_path: Path, name: str) -> GcpProvider:
    """`name`'s provider, with a home of its own (its keys are its own)."""
    home = tmp_path / name.replace("@", "_at_").replace(".", "_dot_")
    return GcpProvider(ProviderContext(home=home, options={"poll_s": 0.01, "owner": name}))


def decoded(label: str) -> str:
    """The owner a label names, read back as `res.owner_label` wrote it."""
    out, i = bytearray(), 0
    while i < len(label):
        if label[i] == "_":
            out.append(int(label[i + 1 : i + 3], 16))
            i += 3
        else:
            out += label[i].encode()
            i += 1
    return out.decode()


OWNERS = ["alice@lab", "alice.lab", "Alice@Lab", "alice_lab", "alice-lab", "ålice@lab"]


def test_labels_are_lossless_in_the_label_alphabet() -> None:
    labels = [res.owner_label(o) for o in OWNERS]
    assert labels[:3] == ["alice_40lab", "alice_2elab", "_41lice_40_4cab"]
    assert len(set(labels)) == len(OWNERS)
    for name, label in zip(OWNERS, labels, strict=True):
        assert res.label_value(label, "owner") == label  # 1-63 of [a-z0-9_-]
        assert decoded(label) == name
    # the older labels were the same for the first three
    assert {res.legacy_owner_label(o) for o in OWNERS[:3]} == {"alice-lab"}


def test_a_long_owner_is_cut_with_a_hash_and_never_shares_a_label() -> None:
    long_a, long_b = "A" * 40 + "@lab", "A" * 40 + "@lac"
    a, b = res.owner_label(long_a), res.owner_label(long_b)
    assert a != b
    assert len(a) <= 63
    assert len(b) <= 63
    assert "__" in a  # cut: no escape holds "__"
    assert all("__" not in res.owner_label(o) for o in OWNERS)
    assert res.label_value(a, "owner") == a


def test_owners_that_once_wrote_one_label_are_three_owners(gcp: StandIn, tmp_path: Path) -> None:
    alice = owner(tmp_path, "alice@lab")
    alice.apply(alice.plan(a100()))
    labels = {i["labels"][res.LABEL_OWNER] for i in gcp.gce.instances.values()}
    assert labels == {"alice_40lab"}
    before = gcp.leftovers("exp1")
    for other in ("alice.lab", "Alice@Lab"):
        twin = owner(tmp_path, other)
        with pytest.raises(ConfigError, match=r"'exp1' is taken on gcp by another owner"):
            twin.apply(twin.plan(a100()))
        assert twin.describe("exp1") == []
        assert twin.clusters() == []
        assert twin.leftovers("exp1") == []
        twin.terminate("exp1")
        assert gcp.leftovers("exp1") == before, f"{other} touched alice@lab's cluster"
    assert [n.index for n in alice.describe("exp1")] == [0, 1]
    assert alice.clusters() == ["exp1"]
    alice.terminate("exp1")
    assert gcp.is_empty()


def test_a_cluster_labelled_the_older_way_is_its_owner_s_by_its_id(
    gcp: StandIn, tmp_path: Path
) -> None:
    """Made by an older version for alice@lab: every label and description says
    ``alice-lab``. alice@lab, with the id recorded in her home, completes it, describes it and
    removes it all; the label alone (no id) is no proof, as alice.lab could have written it."""
    older = owner(tmp_path / "older", res.legacy_owner_label("alice@lab"))
    spec = dataclasses.replace(a100(), cluster_id=ID_A)
    older.apply(older.plan(spec))
    assert {i["labels"][res.LABEL_OWNER] for i in gcp.gce.instances.values()} == {"alice-lab"}
    assert {gcp.gce.firewalls[r]["description"] for r in RULES} == {
        f"cloudtrain cluster=exp1 owner=alice-lab cluster-id={ID_A}"
    }
    alice = owner(tmp_path, "alice@lab")
    assert [n.index for n in alice.describe("exp1", ID_A)] == [0, 1]
    assert alice.describe("exp1") == []  # by the old label alone: not hers to take
    gcp.delete_instance("cloudtrain-exp1-1")
    nodes = alice.apply(alice.plan(spec))  # completes it, refusing no one
    assert [n.index for n in nodes] == [0, 1]
    stranger = owner(tmp_path, "alice.lab")  # her home never recorded ID_A
    assert stranger.describe("exp1") == []
    assert stranger.clusters() == []
    alice.terminate("exp1", ID_A)
    assert gcp.is_empty()
