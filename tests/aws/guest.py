"""What EC2 does when a node's guest powers itself off, played for the stand-in (moto has no
guest): it reads the instance's ``InstanceInitiatedShutdownBehavior`` and terminates or stops
the instance accordingly. The node's agent runs this as its power-off command (the
``CLOUDTRAIN_HALT_COMMAND`` test hook) with no credential in its environment: the credentials
here are the hypervisor's, not the node's.

    python -m tests.aws.guest --endpoint URL --region R --instance ID
"""

from __future__ import annotations

import argparse
import sys

import boto3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--instance", required=True)
    args = parser.parse_args()
    ec2 = boto3.client("ec2", region_name=args.region, endpoint_url=args.endpoint,
                       aws_access_key_id="hyper", aws_secret_access_key="visor")  # fmt: skip
    found = ec2.describe_instance_attribute(
        InstanceId=args.instance, Attribute="instanceInitiatedShutdownBehavior"
    )
    behaviour = found["InstanceInitiatedShutdownBehavior"]["Value"]
    if behaviour == "terminate":
        ec2.terminate_instances(InstanceIds=[args.instance])
    else:
        ec2.stop_instances(InstanceIds=[args.instance])
    print(f"{args.instance}: guest power-off, {behaviour}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
