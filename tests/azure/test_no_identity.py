"""Azure answers a VM with no managed identity (an older API version, or a policy that strips
it): a node with limits could not stop itself, so `up` fails, leaves nothing made, and says in
one line what the subscription is missing (issue 28, item 12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.azure.standin import StandIn
from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration
UP = [
    "up",
    "--provider",
    "azure",
    "--gpus",
    "A100-80GB:1",
    "--nodes",
    "2",
    "--name",
    "noid",
    "--no-setup",
    "--ssh-cidr",
    "203.0.113.7/32",
    "--idle-minutes",
    "5",
]


def test_a_vm_without_an_identity_fails_up_and_leaves_nothing(
    azure: StandIn, tmp_path: Path
) -> None:
    cli = Shell(tmp_path / "home")
    cli.env["CLOUDTRAIN_AZURE_POLL_S"] = "0"
    with azure.lock:
        azure.store.omit_identity = True
    up = cli(*UP)
    assert up.returncode == 3, up.stderr
    errors = [line for line in up.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, up.stderr
    assert "NoIdentity" in errors[0]
    assert "without a system-assigned managed identity" in errors[0]
    assert "register Microsoft.ManagedIdentity" in errors[0]
    assert "Traceback" not in up.stderr
    assert azure.leftovers() == {}, "every VM, disk, NIC, address and the group were deleted"
    assert [c["status"] for c in cli.status()["clusters"]] in ([], ["gone"])
