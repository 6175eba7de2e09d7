"""The Azure provider: A100, A100-80GB and V100-32GB VMs through the azure-mgmt-* SDK.

Prerequisites: ``pip install 'cloudtrain[azure]'``; credentials from azure-identity's
`DefaultAzureCredential` (environment variables ``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/
``AZURE_CLIENT_SECRET``, workload or managed identity, ``az login`` …); the subscription from
``--subscription`` or ``AZURE_SUBSCRIPTION_ID``. ``CLOUDTRAIN_AZURE_ENDPOINT`` (https only) points
it at another ARM endpoint or a local stand-in; ``CLOUDTRAIN_AZURE_POLL_S`` sets the polling
interval of long-running operations. Supports GPUs, Spot (``priority: Spot``, evicted VMs are
deleted), multi-node clusters in a proximity placement group, and InfiniBand sizes (Ubuntu-HPC
image; their NCCL settings come with the bootstrap). Azure's V100 NCv3 sizes were retired on
2025-09-30 and are refused with the alternatives.
"""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import Option

#: What `up --provider azure` takes beyond the spec (read by the CLI without the SDK).
OPTIONS = (
    Option("subscription", "Azure: the subscription (AZURE_SUBSCRIPTION_ID).", account=True),
)

PLUGIN = laid_out(
    __name__,
    "AzureProvider",
    OPTIONS,
    cloud=True,
    store="az",
    store_form="ACCOUNT/CONTAINER/PREFIX",
)
