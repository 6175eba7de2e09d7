"""Google Cloud (Compute Engine) provider, through google-cloud-compute (``cloudtrain[gcp]``).

Needs: credentials ``google.auth.default()`` finds (``gcloud auth application-default login``,
``GOOGLE_APPLICATION_CREDENTIALS``, or the metadata server); a project (``--project``,
``CLOUDSDK_CORE_PROJECT``/``GOOGLE_CLOUD_PROJECT``, or the credentials' own); the Compute
Engine API enabled; GPU quota (``GPUS_ALL_REGIONS`` and the region's per-GPU quota); a VPC
network (``default`` unless the ``network`` option names another). ``CLOUDTRAIN_GCP_ENDPOINT``
points every call, operation polling included, at another address (the tests' stand-in).

Modules (the same names as every provider): `provider` (the contract), `_client` (clients,
credentials, operation waits), `_errors` (GCE errors → cloudtrain's), `_instances` (the
bulkInsert request, nodes read back), `_resources` (names, labels, firewall rules, placement
policy); `_store`, the checkpoint store of ``gs://BUCKET/PREFIX`` (google-cloud-storage).
"""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import Option

#: What `up --provider gcp` takes beyond the spec (read by the CLI without importing the SDK).
OPTIONS = (
    Option(
        "project",
        "GCP: the project (default CLOUDSDK_CORE_PROJECT or gcloud's).",
        account=True,
    ),
    Option("network", "GCP: the VPC network the nodes join (default 'default')."),
)

PLUGIN = laid_out(__name__, "GcpProvider", OPTIONS, cloud=True, store="gs")
