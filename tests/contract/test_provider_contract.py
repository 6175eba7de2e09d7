"""One suite over every provider: the guarantees of `cloudtrain.provision.provider`'s contract.

Each provider joins with a `Harness` that builds it and can damage a cluster the way a crash
or a user would (remove one node behind cloudtrain's back)."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.model import Capability, Event
from cloudtrain.node import procs
from cloudtrain.providers.fake.provider import FakeCloud, FakeProvider
from cloudtrain.providers.local.provider import LocalProvider
from cloudtrain.provision.engine import Engine
from cloudtrain.provision.provider import Provider, ProviderContext, RemovesNodes
from cloudtrain.spec import ClusterSpec, Resources


@dataclass
class Harness:
    provider: Provider
    remove_node: Callable[[str, int], None]
    is_empty: Callable[[], bool]
    #: the provider's own spec of an N-node cluster called `name`
    spec: Callable[[str, int], ClusterSpec] = lambda name, nodes: ClusterSpec(name, "x", nodes)
    #: False where the stand-in's nodes cannot run commands (moto's instances are records)
    runs_commands: bool = True


def local_harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    provider = LocalProvider(ProviderContext(home=home))

    def remove_node(cluster: str, index: int) -> None:
        """The node's machine goes away: its processes (the bootstrap apply started) die with
        its files; removing the files alone races the bootstrap still writing into them."""
        node_dir = home / "local" / cluster / f"node-{index}"
        procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node_dir)}, grace_s=5.0)
        shutil.rmtree(node_dir)

    def is_empty() -> bool:
        root = home / "local"
        return not root.exists() or not any(root.iterdir())

    return Harness(provider, remove_node, is_empty)


def fake_harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    cloud = FakeCloud()
    provider = FakeProvider(ProviderContext(home=home, options={"cloud": cloud}))

    def remove_node(cluster: str, index: int) -> None:
        for inst in cloud.live(cluster):
            if inst.tags["cloudtrain:node"] == str(index):
                inst.state = "terminated"

    return Harness(provider, remove_node, lambda: not cloud.live())


def aws_harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    """The AWS provider against the stand-in (moto's server and its shims)."""
    from cloudtrain.providers.aws.provider import AwsProvider
    from tests.aws.standin import leftovers, put_dlami_parameter, register_dlami

    aws = request.getfixturevalue("aws")
    put_dlami_parameter(aws.client("ssm"), register_dlami(aws.client("ec2")))
    options = {"poll_s": 0.01, "regions": ["us-east-1"], "owner": "contract"}
    provider = AwsProvider(ProviderContext(home=home, options=options))
    ec2 = aws.client("ec2")

    def remove_node(cluster: str, index: int) -> None:
        node = next(n for n in provider.describe(cluster) if n.index == index)
        ec2.terminate_instances(InstanceIds=[node.node_id])

    def is_empty() -> bool:
        return not any(any(leftovers(ec2, c).values()) for c in ("c1", "a", "b"))

    def aws_spec(name: str, nodes: int) -> ClusterSpec:
        res = Resources(accelerator="V100", count=1, region="us-east-1")
        return ClusterSpec(name, "aws", nodes, res, ssh_cidr="203.0.113.7/32")

    return Harness(provider, remove_node, is_empty, aws_spec, runs_commands=False)


def ssh_harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    """The ssh provider over three real sshd hosts (127.0.0.4-6) on this machine."""
    import sys

    from cloudtrain.providers.ssh.provider import SshProvider

    lab = request.getfixturevalue("ssh_lab")
    options = {
        "hosts": lab.host_list(),
        "identity": str(lab.identity),
        "known_hosts": str(lab.known_hosts),
        "python": sys.executable,
        "bootstrap_phases": "python cloudtrain",
    }  # fmt: skip  (torch: the CLI tests)
    provider = SshProvider(ProviderContext(home=home, options=options))
    base = lab.home / ".cloudtrain"

    def remove_node(cluster: str, index: int) -> None:
        (base / cluster / f"node-{index}" / "node.json").unlink()

    def is_empty() -> bool:
        return not any((base / c).exists() for c in ("c1", "a", "b"))

    return Harness(provider, remove_node, is_empty,
                   lambda name, nodes: ClusterSpec(name, "ssh", nodes))  # fmt: skip


def gcp_harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    from tests.gcp.harness import harness

    return harness(home, request)


def azure_harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    from tests.azure.harness import harness

    return harness(home, request)


HARNESSES = {
    "local": local_harness,
    "fake": fake_harness,
    "aws": aws_harness,
    "ssh": ssh_harness,
    "gcp": gcp_harness,
    "azure": azure_harness,
}


@pytest.fixture(scope="module")
def ssh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.sshd import Lab

    lab = Lab(tmp_path_factory.mktemp("contract-ssh") / "lab", addresses=(4, 5, 6))
    yield lab
    lab.stop()


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    built = HARNESSES[request.param](tmp_path, request)
    yield built
    for cluster in ("c1", "a", "b"):  # machines that outlive a test (ssh hosts) start clean
        built.provider.terminate(cluster)


def test_plan_has_no_side_effects(harness: Harness) -> None:
    plan = harness.provider.plan(harness.spec("c1", 3))
    assert plan.offers, "a plan has at least one offer"
    assert len(plan.requests) >= 1
    assert harness.provider.describe("c1") == []
    assert harness.is_empty()


def test_apply_creates_every_node_and_describe_finds_them_by_tag(harness: Harness) -> None:
    events: list[Event] = []
    nodes = harness.provider.apply(harness.provider.plan(harness.spec("c1", 3)), events.append)
    assert [n.index for n in nodes] == [0, 1, 2]
    assert {n.state for n in nodes} == {"running"}
    assert len({n.node_id for n in nodes}) == 3
    assert all(n.cluster == "c1" and n.private_ip for n in nodes)
    assert all(n.root for n in nodes)
    assert harness.provider.describe("c1") == nodes
    assert events, "apply reports progress"


def test_apply_is_idempotent(harness: Harness) -> None:
    plan = harness.provider.plan(harness.spec("c1", 2))
    first = harness.provider.apply(plan)
    second = harness.provider.apply(plan)
    assert [n.node_id for n in first] == [n.node_id for n in second]


def test_apply_completes_a_half_made_cluster(harness: Harness) -> None:
    plan = harness.provider.plan(harness.spec("c1", 3))
    before = harness.provider.apply(plan)
    harness.remove_node("c1", 1)
    assert [n.index for n in harness.provider.describe("c1")] == [0, 2]
    after = harness.provider.apply(plan)
    assert [n.index for n in after] == [0, 1, 2]
    kept = {n.index: n.node_id for n in before}
    assert after[0].node_id == kept[0]
    assert after[2].node_id == kept[2]


def test_more_nodes_than_asked_is_an_error_not_a_silent_bill(harness: Harness) -> None:
    harness.provider.apply(harness.provider.plan(harness.spec("c1", 3)))
    with pytest.raises(ConfigError, match="more than"):
        harness.provider.apply(harness.provider.plan(harness.spec("c1", 2)))


def test_terminate_removes_everything_and_is_idempotent(harness: Harness) -> None:
    harness.provider.apply(harness.provider.plan(harness.spec("c1", 2)))
    harness.provider.terminate("c1")
    assert harness.provider.describe("c1") == []
    assert harness.is_empty()
    harness.provider.terminate("c1")
    harness.provider.terminate("never-existed")


def test_clusters_are_isolated(harness: Harness) -> None:
    harness.provider.apply(harness.provider.plan(harness.spec("a", 1)))
    harness.provider.apply(harness.provider.plan(harness.spec("b", 2)))
    assert harness.provider.clusters() == ["a", "b"]
    harness.provider.terminate("a")
    assert harness.provider.clusters() == ["b"]
    assert harness.provider.describe("a") == []
    assert len(harness.provider.describe("b")) == 2
    harness.provider.terminate("b")
    assert harness.is_empty()


def test_capabilities_and_executor(harness: Harness) -> None:
    caps = type(harness.provider).capabilities
    assert isinstance(caps, frozenset)
    assert all(isinstance(c, Capability) for c in caps)
    assert Capability.MULTI_NODE in caps
    node = harness.provider.apply(harness.provider.plan(harness.spec("c1", 1)))[0]
    if not harness.runs_commands:  # e.g. moto's instances: addresses nobody answers on
        assert callable(harness.provider.executor(node).run)
        harness.provider.terminate("c1")
        return
    executor = harness.provider.executor(node)
    result = executor.run(["true"])
    assert result.returncode == 0
    executor.close()


def test_while_a_node_lives_its_name_is_held(harness: Harness) -> None:
    """`apply` asks `describe` only when `holders` is not empty: a node left alone by a
    crash (the others removed) must still hold the name, so that `apply` completes it."""
    if not isinstance(harness.provider, Engine):
        pytest.skip("no `holders`: the nodes are this machine or the user's hosts")
    prov = harness.provider
    spec = dataclasses.replace(harness.spec("c1", 2), cluster_id="aaaaaaaaaaaa")
    assert prov.holders("c1") == set()
    nodes = prov.apply(prov.plan(spec))
    harness.remove_node("c1", 0)
    assert prov.holders("c1") == {(prov.owner_key, "aaaaaaaaaaaa")}
    again = prov.apply(prov.plan(spec))
    assert [n.index for n in again] == [0, 1]
    assert again[1].node_id == nodes[1].node_id


def test_a_recorded_incarnation_acts_only_on_itself(harness: Harness) -> None:
    """A cloud on the engine tags everything with the cluster id: a record's id finds and
    removes only its own incarnation, and `apply` of another id of the same owner is refused
    before any write. Without an id, every incarnation of the name is this owner's."""
    if not isinstance(harness.provider, Engine):
        pytest.skip("one incarnation per name: the nodes are this machine or the user's hosts")
    prov = harness.provider
    spec = dataclasses.replace(harness.spec("c1", 2), cluster_id="aaaaaaaaaaaa")
    nodes = prov.apply(prov.plan(spec))
    assert prov.describe("c1", "aaaaaaaaaaaa") == nodes == prov.describe("c1")
    assert prov.describe("c1", "bbbbbbbbbbbb") == []
    assert prov.leftovers("c1", "bbbbbbbbbbbb") == []
    prov.terminate("c1", "bbbbbbbbbbbb")
    assert prov.describe("c1", "aaaaaaaaaaaa") == nodes, "another id's terminate left it"
    other = dataclasses.replace(spec, cluster_id="bbbbbbbbbbbb")
    with pytest.raises(ConfigError, match=r"another cluster of owner .* \(id aaaaaaaaaaaa\)"):
        prov.apply(prov.plan(other))
    assert prov.describe("c1") == nodes, "the refused apply made nothing"
    prov.terminate("c1", "aaaaaaaaaaaa")
    assert prov.describe("c1") == []
    assert harness.is_empty()


def test_some_nodes_are_removed_and_the_others_stay(harness: Harness) -> None:
    """What a cancelled recovery does with the nodes it made (`RemovesNodes`, every provider):
    the nodes named go with everything of theirs and the others stay as they were; a node
    already gone is nothing to do, and another incarnation's nodes are never touched."""
    prov = harness.provider
    assert isinstance(prov, RemovesNodes)
    before = prov.apply(prov.plan(harness.spec("c1", 3)))
    prov.remove_nodes("c1", None, [1])
    after = prov.describe("c1")
    assert [(n.index, n.node_id) for n in after] == [(0, before[0].node_id),
                                                     (2, before[2].node_id)]  # fmt: skip
    prov.remove_nodes("c1", None, [1])
    if isinstance(prov, Engine):  # clouds hold incarnations of a name apart
        prov.remove_nodes("c1", "bbbbbbbbbbbb", [0, 2])
        assert [n.index for n in prov.describe("c1")] == [0, 2], "another id's nodes stay"
    prov.remove_nodes("c1", None, [0, 2])
    assert prov.describe("c1") == []
    prov.terminate("c1")
    assert harness.is_empty()


def test_a_managed_jobs_watcher_gets_a_lost_node_back_where_the_others_are(
    harness: Harness, tmp_path: Path
) -> None:
    """What a managed job's recovery asks of every provider: the node removed behind
    cloudtrain's back is made again (the same index, the others' zone), and a teardown then
    leaves nothing."""
    from cloudtrain import api
    from cloudtrain.jobs.coordinator import Coordinator
    from cloudtrain.jobs.managed import Policy, Watcher
    from cloudtrain.state import State

    state = State.open(tmp_path / "watcher-home")
    home = tmp_path / "watcher-home"
    spec = dataclasses.replace(harness.spec("c1", 3), provider=harness.provider.name)
    api.up(state, home, spec, bootstrap_timeout_s=None, prov=harness.provider)
    record = state.cluster("c1")
    assert record is not None
    job = state.new_job("c1", "t", num_nodes=3, nproc_per_node=1, command=["t.py"])
    state.update_job(job.id, detail={"managed": Policy().to_dict()})
    harness.remove_node("c1", 1)

    watcher = Watcher(
        state,
        home,
        lambda cluster: Coordinator(state, harness.provider, home=home),
        provider=lambda s: harness.provider,
        bootstrap_timeout_s=None,
    )
    assert watcher.complete_cluster(job) == [1]
    nodes = harness.provider.describe("c1", record.spec.cluster_id)
    assert [n.index for n in nodes] == [0, 1, 2]
    assert len({n.zone for n in nodes}) == 1, "the new node joins the others' zone"
    assert watcher.complete_cluster(job) == [], "nothing is missing any more"

    harness.provider.terminate("c1", record.spec.cluster_id)
    assert harness.is_empty()
    state.close()
