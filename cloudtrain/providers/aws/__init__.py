"""The AWS provider: V100/A100 instance groups on EC2 through boto3.

Prerequisites: ``pip install 'cloudtrain[aws]'`` and credentials from boto3's default chain
(``--profile`` / ``AWS_PROFILE``). ``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL`` point it at a
private endpoint or a local stand-in (boto3 reads them itself). Supports GPUs, spot, multi-node
clusters, cluster placement groups and EFA on p3dn/p4d/p4de.
"""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import Option

#: What `up --provider aws` takes beyond the spec (read by the CLI without importing boto3).
OPTIONS = (Option("profile", "AWS: the credentials profile (default AWS_PROFILE).", account=True),)

PLUGIN = laid_out(__name__, "AwsProvider", OPTIONS, cloud=True, store="s3")
