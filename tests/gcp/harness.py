"""The GCP provider in the contract suite: against the GCE stand-in, through the real SDK."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources

if TYPE_CHECKING:
    from tests.contract.test_provider_contract import Harness


def harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    from cloudtrain.providers.gcp.provider import GcpProvider
    from tests.contract.test_provider_contract import Harness
    from tests.gcp.standin import StandIn

    gcp: StandIn = request.getfixturevalue("gcp")
    options = {"poll_s": 0.01, "owner": "contract"}
    provider = GcpProvider(ProviderContext(home=home, options=options))

    def remove_node(cluster: str, index: int) -> None:
        """The instance goes away behind cloudtrain's back: deleted in the console, or
        preempted (a spot node's instanceTerminationAction is DELETE: the same thing)."""
        gcp.delete_instance(f"cloudtrain-{cluster}-{index}")

    def spec(name: str, nodes: int) -> ClusterSpec:
        res = Resources(accelerator="V100", count=1, region="us-central1")
        return ClusterSpec(name, "gcp", nodes, res, ssh_cidr="203.0.113.7/32")

    return Harness(provider, remove_node, lambda: gcp.is_empty(), spec, runs_commands=False)
