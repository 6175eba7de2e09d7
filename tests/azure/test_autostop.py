"""An idle Azure cluster deletes itself with the user's machine off and no credential on a node:
each VM has a system-assigned managed identity that may read, deallocate or delete its own VM
and nothing else (a custom role of the cluster, assigned at the VM's own scope); its agent gets
a token from its metadata server and deletes its own VM; the next command removes the group, the
role assignments and the role (which would outlive it). The stand-in checks each identity's
scope and actions."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import guest_agent
from tests.azure.standin import SUBSCRIPTION, StandIn
from tests.integration.conftest import Shell, wait_for

pytestmark = pytest.mark.integration
NAME = "idle-az"
GROUP = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/cloudtrain-{NAME}"
UP = ["up", "--provider", "azure", "--gpus", "A100-80GB:1", "--nodes", "2", "--name", NAME,
      "--no-setup", "--ssh-cidr", "203.0.113.7/32"]  # fmt: skip


@pytest.fixture
def cli(azure: StandIn, tmp_path: Path) -> Shell:
    shell = Shell(tmp_path / "home")
    shell.env["CLOUDTRAIN_AZURE_POLL_S"] = "0"
    return shell


def vms(azure: StandIn) -> list[dict[str, object]]:
    with azure.lock:
        return azure.store.of_type("Microsoft.Compute/virtualMachines")


def identity_token(azure: StandIn, vm: str) -> str:
    """What the node `vm` gets from its metadata server."""
    url = f"{azure.base}/_imds/{vm}/metadata/identity/oauth2/token?api-version=2018-02-01"
    request = urllib.request.Request(url, headers={"Metadata": "true"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.loads(answer.read())["access_token"])


def arm(azure: StandIn, method: str, path: str, token: str) -> int:
    request = urllib.request.Request(f"{azure.base}{path}?api-version=2024-07-01", method=method,
                                     headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_an_idle_azure_cluster_deletes_itself_as_its_own_identity(
    cli: Shell, azure: StandIn, tmp_path: Path
) -> None:
    up = cli(*UP, "--idle-minutes", "0.05", "--down-when-idle")
    assert up.returncode == 0, up.stderr
    made = vms(azure)
    assert [vm["identity"]["type"] for vm in made] == ["SystemAssigned"] * 2  # type: ignore[index]
    with azure.lock:
        grants = azure.store.of_type("Microsoft.Authorization/roleAssignments")
        (role,) = azure.store.of_type("Microsoft.Authorization/roleDefinitions")
    assert sorted(a.lower() for a in role["properties"]["permissions"][0]["actions"]) == [
        "microsoft.compute/virtualmachines/deallocate/action",
        "microsoft.compute/virtualmachines/delete",
        "microsoft.compute/virtualmachines/read",
    ], "what self-stop needs, and nothing else"
    assert role["properties"]["assignableScopes"] == [GROUP]
    by_principal = {g["properties"]["principalId"]: g for g in grants}
    assert len(grants) == 2
    for vm in made:
        grant = by_principal[vm["identity"]["principalId"]]  # type: ignore[index]
        assert str(grant["id"]).lower().startswith(f"{vm['id']}/providers/".lower()), "its own VM"
        assert grant["properties"]["roleDefinitionId"] == role["id"]
        assert grant["properties"]["description"].startswith(f"cloudtrain: {NAME} (")

    # a node's identity may stop its own VM and touch nothing else: not a sibling, not a new
    # VM billed to the user, not a command on another node, not the network or the group
    token = identity_token(azure, f"{NAME}-0")
    vm_path = f"{GROUP}/providers/Microsoft.Compute/virtualMachines"
    assert arm(azure, "GET", f"{vm_path}/{NAME}-0", token) == 200, "its own VM"
    assert arm(azure, "GET", f"{vm_path}/{NAME}-1", token) == 403, "not a sibling's"
    assert arm(azure, "DELETE", f"{vm_path}/{NAME}-1", token) == 403, "not a sibling"
    assert arm(azure, "POST", f"{vm_path}/{NAME}-1/runCommand", token) == 403
    assert arm(azure, "PUT", f"{vm_path}/miner", token) == 403, "no VM billed to the user"
    assert arm(azure, "DELETE", GROUP, token) == 403, "not the group itself"
    other = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/someone-else"
    assert arm(azure, "DELETE", f"{other}/providers/Microsoft.Compute/virtualMachines/x",
               token) == 403  # fmt: skip
    nsg = f"{GROUP}/providers/Microsoft.Network/networkSecurityGroups/cloudtrain-{NAME}-nsg"
    assert arm(azure, "DELETE", nsg, token) == 403, "not the network (its SSH rule)"

    custom = next(c for c in azure.requests("PUT", "virtualMachines")).body["properties"]
    unit = guest_agent.unit_of(base64.b64decode(custom["osProfile"]["customData"]))
    assert " --halt arm " in unit
    agents: list[subprocess.Popen[bytes]] = [
        guest_agent.start(
            tmp_path / f"node-{i}", unit,
            more=["--endpoint", f"{azure.base}/_imds/{NAME}-{i}", "--arm", azure.base],
            env={"SSL_CERT_FILE": str(azure.ca_file)},
        )
        for i in range(2)
    ]  # fmt: skip
    with guest_agent.running(agents):
        wait_for(lambda: not vms(azure), timeout=60, what="the idle VMs to delete themselves")
    assert (tmp_path / "node-1.stopped.json").exists()
    deleted = [c.path for c in azure.requests("DELETE") if c.status < 300]
    assert GROUP not in deleted, "the nodes deleted their VMs, not the group"

    after = cli("status", NAME)
    assert after.returncode == 0, after.stderr
    assert f"{NAME} stopped itself (it was idle); removed what was left: " in after.stderr
    revoked = [c for c in azure.requests("DELETE", "roleAssignments") if c.status < 300]
    assert len(revoked) == 2, "the role assignments are deleted: they would outlive the group"
    assert [c for c in azure.requests("DELETE", "roleDefinitions") if c.status < 300], "the role"
    assert cli.status()["clusters"] == []
    assert azure.leftovers() == {}
