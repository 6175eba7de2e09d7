"""The azure provider in the contract suite: against the ARM stand-in, through the real SDK."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.azure.standin import StandIn
from tests.contract.test_provider_contract import Harness


def harness(home: Path, request: pytest.FixtureRequest) -> Harness:
    from cloudtrain.providers.azure.provider import AzureProvider

    azure: StandIn = request.getfixturevalue("azure")
    options = {"poll_s": 0, "owner": "contract"}
    provider = AzureProvider(ProviderContext(home=home, options=options))

    def remove_node(cluster: str, index: int) -> None:
        """The VM is deleted behind cloudtrain's back (with its disk, NIC and IP): in the
        portal, or evicted (a Spot VM's evictionPolicy is Delete: the same thing)."""
        node = next(n for n in provider.describe(cluster) if n.index == index)
        with azure.lock:
            azure.store.delete_vm(str(node.extra["id"]))

    def is_empty() -> bool:
        return not azure.leftovers()

    def spec(name: str, nodes: int) -> ClusterSpec:
        res = Resources(accelerator="A100-80GB", count=1, region="eastus")
        return ClusterSpec(name, "azure", nodes, res, ssh_cidr="203.0.113.7/32")

    return Harness(provider, remove_node, is_empty, spec, runs_commands=False)
