"""Records a failure left half made are read, never crashed on: an ssh node recorded by a
failed `up` while its host did not answer (no port in `extra`), a local node whose `node.json`
was cut short, a local node whose folder goes away while it is made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cloudtrain.boot import bootstrap
from cloudtrain.errors import CommandError, ProviderError
from cloudtrain.executors.local import LocalExecutor
from cloudtrain.executors.ssh import SshExecutor
from cloudtrain.model import NodeInfo
from cloudtrain.node import procs
from cloudtrain.providers.local.provider import LocalProvider
from cloudtrain.providers.ssh.provider import SshProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec
from cloudtrain.state import State

HOSTS = "root@127.0.0.2:2201,root@127.0.0.3:2202"


def ssh_provider(home: Path) -> SshProvider:
    return SshProvider(ProviderContext(home=home, options={"hosts": HOSTS}))


def test_an_ssh_node_recorded_without_its_port_is_reached_as_the_host_list_says(
    tmp_path: Path,
) -> None:
    """What a failed `up` recorded before: node 1 ``unreachable`` with an empty `extra`. It is
    read back from the state file, and its executor is the listed host's (not `KeyError`)."""
    half_made = NodeInfo("c", 1, "root@127.0.0.3:2202", "127.0.0.3", None, "unreachable")
    assert dict(half_made.extra) == {}
    with State.open(tmp_path) as state:
        state.put_cluster(
            ClusterSpec("c", "ssh", 2, extra={"hosts": HOSTS}), status=ClusterStatus.PARTIAL
        )
        state.set_nodes("c", [half_made])
        (read,) = state.nodes("c")
    assert (read.state, dict(read.extra), read.user) == ("unreachable", {}, None)
    ex = ssh_provider(tmp_path).executor(read)
    assert isinstance(ex, SshExecutor)
    assert (ex.user, ex.host, ex.port) == ("root", "127.0.0.3", 2202)


def test_an_ssh_node_no_record_or_host_list_names_is_a_one_line_provider_error(
    tmp_path: Path,
) -> None:
    stray = NodeInfo("c", 2, "root@127.0.0.9:22", "127.0.0.9", None, "unreachable")
    with pytest.raises(ProviderError, match=r"^ssh: UnknownHost: node 2 \(root@127\.0\.0\.9:22\)"):
        ssh_provider(tmp_path).executor(stray)


def test_a_recorded_ssh_node_keeps_its_own_port_and_key(tmp_path: Path) -> None:
    node = NodeInfo("c", 0, "u@10.0.0.5:2222", "10.0.0.5", None, "running", user="u",
                    extra={"port": 2222, "identity": None, "gpus": 0})  # fmt: skip
    ex = ssh_provider(tmp_path).executor(node)
    assert isinstance(ex, SshExecutor)
    assert (ex.user, ex.host, ex.port) == ("u", "10.0.0.5", 2222)


def test_a_local_node_json_cut_short_is_no_node_and_up_makes_it_again(tmp_path: Path) -> None:
    prov = LocalProvider(ProviderContext(home=tmp_path, options={}))
    spec = ClusterSpec("h", "local", 2)
    folder = tmp_path / "local" / "h"
    for index, text in ((0, '{"cluster": "h", "ind'), (1, '{"cluster": "h"}')):
        (folder / f"node-{index}").mkdir(parents=True)
        (folder / f"node-{index}" / "node.json").write_text(text)
    assert prov.describe("h") == []
    try:
        made = prov.apply(prov.plan(spec))
        assert [n.index for n in made] == [0, 1]
        assert json.loads((folder / "node-0" / "node.json").read_text())["index"] == 0
    finally:
        prov.terminate("h")


def test_a_local_node_whose_folder_goes_away_while_it_is_made_is_a_provider_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 1's folder is removed while its bootstrap is being written (at the moment the
    script is rendered): a retryable `ProviderError` (a lost node), not `FileNotFoundError`."""
    prov = LocalProvider(ProviderContext(home=tmp_path, options={}))
    folder = tmp_path / "local" / "g"
    render = bootstrap.script

    def script_while_removed() -> str:
        shutil.rmtree(folder / "node-1", ignore_errors=True)
        return render()

    monkeypatch.setattr(bootstrap, "script", script_while_removed)
    try:
        with pytest.raises(ProviderError, match="NodeLost: a node's folder went away") as err:
            prov.apply(prov.plan(ClusterSpec("g", "local", 2)))
        assert err.value.retryable
        assert str(folder / "node-1") in str(err.value)
        assert [n.index for n in prov.describe("g")] == [0]
    finally:
        for node_dir in folder.glob("node-*"):
            procs.kill_matching({"CLOUDTRAIN_NODE_ROOT": str(node_dir)}, grace_s=1)
        prov.terminate("g")


def test_a_detached_start_in_a_folder_that_is_gone_is_a_command_error(tmp_path: Path) -> None:
    gone = tmp_path / "node-0"
    with pytest.raises(CommandError, match="command exited 127: true"):
        LocalExecutor().start_detached(
            ["true"], env={}, cwd=str(gone), job_dir=str(tmp_path / "run")
        )
