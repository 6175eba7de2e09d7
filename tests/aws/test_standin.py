"""The AWS stand-in works as the provider's tests will use it: through real boto3 over HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.aws.standin import (
    CLUSTER_TAG,
    DLAMI_NAME,
    DLAMI_NAME_PATTERN,
    DLAMI_OWNER_ID,
    DLAMI_SSM_PARAMETER,
    StandIn,
    assert_empty,
    leftovers,
    put_dlami_parameter,
    register_dlami,
)

AMI = "ami-12345678"


def tags(cluster: str, *resource_types: str) -> list[dict[str, Any]]:
    return [
        {"ResourceType": r, "Tags": [{"Key": CLUSTER_TAG, "Value": cluster}]}
        for r in resource_types
    ]


def error_code(excinfo: pytest.ExceptionInfo[ClientError]) -> str:
    return str(excinfo.value.response["Error"]["Code"])


def launch(ec2: Any, **kwargs: Any) -> list[str]:
    reply = ec2.run_instances(
        ImageId=AMI, InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1, **kwargs
    )
    return [i["InstanceId"] for i in reply["Instances"]]


def test_the_environment_routes_ec2_ssm_and_sts_to_the_standin(aws: StandIn) -> None:
    # Plain clients: only the environment that the `aws` fixture set points them here.
    assert boto3.client("ec2").describe_availability_zones()["AvailabilityZones"]
    assert boto3.client("sts").get_caller_identity()["Account"] == "123456789012"
    ssm = boto3.client("ssm")
    with pytest.raises(ClientError) as excinfo:
        ssm.get_parameter(Name=DLAMI_SSM_PARAMETER)
    assert error_code(excinfo) == "ParameterNotFound"

    assert aws.app.count_by_action() == {"DescribeAvailabilityZones": 1}
    assert [c.action for c in aws.app.calls(service=None)] == [
        "DescribeAvailabilityZones",
        "GetCallerIdentity",
        "GetParameter",
    ]
    assert aws.app.calls(service="ssm")[0].params == {"Name": DLAMI_SSM_PARAMETER}


def test_a_cli_subprocess_reaches_the_standin_through_its_environment(aws: StandIn) -> None:
    script = (
        "import boto3; print(boto3.client('ec2').describe_placement_groups()['PlacementGroups'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=aws.subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]"
    assert aws.app.count_by_action() == {"DescribePlacementGroups": 1}


def test_placement_groups_are_created_described_and_deleted(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    made = ec2.create_placement_group(
        GroupName="c1-pg", Strategy="cluster", TagSpecifications=tags("c1", "placement-group")
    )["PlacementGroup"]
    assert made["GroupName"] == "c1-pg"
    assert re.fullmatch(r"pg-[0-9a-f]{17}", made["GroupId"])
    assert made["State"] == "available"
    assert made["Tags"] == [{"Key": CLUSTER_TAG, "Value": "c1"}]
    ec2.create_placement_group(GroupName="other", Strategy="spread")
    aws.client("ec2", "us-west-2").create_placement_group(GroupName="west", Strategy="cluster")

    def names(**kwargs: Any) -> list[str]:
        return [g["GroupName"] for g in ec2.describe_placement_groups(**kwargs)["PlacementGroups"]]

    assert names() == ["c1-pg", "other"]  # placement groups are per region
    assert names(GroupNames=["other"]) == ["other"]
    assert names(GroupIds=[made["GroupId"]]) == ["c1-pg"]
    assert names(Filters=[{"Name": "strategy", "Values": ["spread"]}]) == ["other"]
    assert names(Filters=[{"Name": "group-name", "Values": ["c1-*"]}]) == ["c1-pg"]
    assert names(Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": ["c1"]}]) == ["c1-pg"]
    assert names(Filters=[{"Name": "tag-key", "Values": [CLUSTER_TAG]}]) == ["c1-pg"]
    assert names(Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": ["c2"]}]) == []

    with pytest.raises(ClientError) as excinfo:
        ec2.create_placement_group(GroupName="c1-pg", Strategy="cluster")
    assert error_code(excinfo) == "InvalidPlacementGroup.Duplicate"
    with pytest.raises(ClientError) as excinfo:
        ec2.describe_placement_groups(GroupNames=["nope"])
    assert error_code(excinfo) == "InvalidPlacementGroup.Unknown"

    ec2.delete_placement_group(GroupName="c1-pg")
    assert names() == ["other"]
    with pytest.raises(ClientError) as excinfo:
        ec2.delete_placement_group(GroupName="c1-pg")
    assert error_code(excinfo) == "InvalidPlacementGroup.Unknown"


def test_a_placement_group_in_use_is_not_deleted(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    with pytest.raises(ClientError) as excinfo:
        launch(ec2, Placement={"GroupName": "missing"})
    assert error_code(excinfo) == "InvalidPlacementGroup.Unknown"

    group_id = ec2.create_placement_group(GroupName="pg", Strategy="cluster")["PlacementGroup"][
        "GroupId"
    ]
    ids = launch(ec2, Placement={"GroupName": "pg", "AvailabilityZone": "us-east-1b"})
    described = ec2.describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"][0]
    assert described["Placement"]["GroupName"] == "pg"  # moto alone would say ""
    assert described["Placement"]["GroupId"] == group_id

    with pytest.raises(ClientError) as excinfo:
        ec2.delete_placement_group(GroupName="pg")
    assert error_code(excinfo) == "InvalidPlacementGroup.InUse"
    ec2.terminate_instances(InstanceIds=ids)
    ec2.delete_placement_group(GroupName="pg")


def test_a_fault_for_one_zone_fails_launches_there_only(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    fault = aws.app.add_fault(
        "RunInstances",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient p4d.24xlarge capacity in zone us-east-1a.",
        zone="us-east-1a",
    )
    with pytest.raises(ClientError) as excinfo:
        launch(ec2, Placement={"AvailabilityZone": "us-east-1a"})
    assert error_code(excinfo) == "InsufficientInstanceCapacity"
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert "us-east-1a" in excinfo.value.response["Error"]["Message"]

    # A zone given through the subnet of an (EFA) network interface counts too.
    subnet = ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]}])
    interface = {"DeviceIndex": 0, "SubnetId": subnet["Subnets"][0]["SubnetId"]}
    with pytest.raises(ClientError):
        launch(ec2, NetworkInterfaces=[{**interface, "InterfaceType": "efa"}])

    assert launch(ec2, Placement={"AvailabilityZone": "us-east-1b"})
    assert launch(aws.client("ec2", "us-west-2"), Placement={"AvailabilityZone": "us-west-2a"})
    assert fault.hits == 2
    # Every attempt is recorded, the refused ones too.
    assert aws.app.count_by_action()["RunInstances"] == 4


def test_a_limited_fault_is_hidden_by_botocore_retries(aws: StandIn) -> None:
    aws.app.add_fault("RunInstances", "InsufficientInstanceCapacity", times=2)
    retrying = boto3.client(
        "ec2", config=Config(retries={"mode": "standard", "total_max_attempts": 3})
    )
    assert launch(retrying)
    assert aws.app.count_by_action() == {"RunInstances": 3}

    aws.app.add_fault("RunInstances", "Unsupported", status=400, times=1)
    with pytest.raises(ClientError):  # a 4xx that is not throttling is not retried
        launch(retrying)


def test_faults_speak_each_protocol(aws: StandIn) -> None:
    aws.app.add_fault("GetParameter", "ThrottlingException", status=400, service="ssm")
    aws.app.add_fault("GetCallerIdentity", "ExpiredToken", status=403, service="sts")
    with pytest.raises(ClientError) as excinfo:
        aws.client("ssm").get_parameter(Name="x")
    assert error_code(excinfo) == "ThrottlingException"
    with pytest.raises(ClientError) as excinfo:
        aws.client("sts").get_caller_identity()
    assert error_code(excinfo) == "ExpiredToken"


def test_run_instances_is_recorded_as_sent(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    ec2.create_placement_group(GroupName="pg", Strategy="cluster")
    ec2.run_instances(
        ImageId=AMI,
        InstanceType="p4d.24xlarge",
        MinCount=2,
        MaxCount=2,
        ClientToken="c1-launch-1",
        Placement={"GroupName": "pg"},
        NetworkInterfaces=[
            {"DeviceIndex": 0, "NetworkCardIndex": 0, "SubnetId": subnet, "InterfaceType": "efa"}
        ],
        MetadataOptions={"HttpTokens": "required"},
        BlockDeviceMappings=[
            {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 500, "Encrypted": True}}
        ],
        TagSpecifications=tags("c1", "instance", "volume"),
    )
    [call] = aws.app.calls("RunInstances", region="us-east-1")
    assert call.params["Placement.GroupName"] == "pg"
    assert call.params["MinCount"] == call.params["MaxCount"] == "2"
    assert call.params["ClientToken"] == "c1-launch-1"
    assert call.params["MetadataOptions.HttpTokens"] == "required"
    assert call.params["BlockDeviceMapping.1.Ebs.Encrypted"] == "true"
    assert [n["InterfaceType"] for n in call.indexed("NetworkInterface")] == ["efa"]
    assert call.subnet_ids == [subnet]
    assert [s["ResourceType"] for s in call.indexed("TagSpecification")] == ["instance", "volume"]


def test_a_repeated_client_token_launches_nothing_new(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    first = launch(ec2, ClientToken="once")
    assert launch(ec2, ClientToken="once") == first  # moto alone would launch again
    running = ec2.describe_instances()["Reservations"]
    assert [i["InstanceId"] for r in running for i in r["Instances"]] == first
    with pytest.raises(ClientError) as excinfo:
        launch(ec2, ClientToken="once", Placement={"AvailabilityZone": "us-east-1c"})
    assert error_code(excinfo) == "IdempotentParameterMismatch"


def test_p3_types_are_offered_and_described(aws: StandIn) -> None:
    ec2 = aws.client("ec2")

    def zones(instance_type: str) -> list[str]:
        offers = ec2.describe_instance_type_offerings(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )["InstanceTypeOfferings"]
        return sorted(o["Location"] for o in offers)

    every = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]
    assert zones("p3.2xlarge") == every
    assert zones("p4de.24xlarge") == every
    by_region = aws.client("ec2", "eu-west-1").describe_instance_type_offerings(
        Filters=[{"Name": "instance-type", "Values": ["p3.8xlarge"]}]
    )["InstanceTypeOfferings"]
    assert [o["Location"] for o in by_region] == ["eu-west-1"]

    [p3] = ec2.describe_instance_types(InstanceTypes=["p3.2xlarge"])["InstanceTypes"]
    assert p3["GpuInfo"]["Gpus"][0]["Count"] == 1
    assert p3["VCpuInfo"]["DefaultVCpus"] == 8
    assert p3["NetworkInfo"]["EfaSupported"] is False


def test_the_deep_learning_ami_is_found_as_in_aws(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    image_id = register_dlami(ec2)
    [image] = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": [DLAMI_NAME_PATTERN]}]
    )["Images"]
    assert (image["ImageId"], image["Name"]) == (image_id, DLAMI_NAME)
    assert image["OwnerId"] == DLAMI_OWNER_ID
    assert image["Architecture"] == "x86_64"

    ssm = aws.client("ssm")
    put_dlami_parameter(ssm, image_id)
    assert ssm.get_parameter(Name=DLAMI_SSM_PARAMETER)["Parameter"]["Value"] == image_id


def test_reset_empties_everything_but_keeps_the_shims(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    ec2.create_placement_group(GroupName="pg", Strategy="cluster")
    launch(ec2)
    aws.app.add_fault("DescribeInstances", "Unsupported", status=400)

    aws.reset()

    assert aws.app.calls() == []
    assert ec2.describe_instances()["Reservations"] == []  # and no fault any more
    assert ec2.describe_placement_groups()["PlacementGroups"] == []
    offers = ec2.describe_instance_type_offerings(
        Filters=[{"Name": "instance-type", "Values": ["p3.16xlarge"]}]
    )["InstanceTypeOfferings"]
    assert offers


def test_leftovers_finds_what_a_cluster_left(aws: StandIn) -> None:
    ec2 = aws.client("ec2")
    group_id = ec2.create_security_group(
        GroupName="c1-sg", Description="c1", TagSpecifications=tags("c1", "security-group")
    )["GroupId"]
    ec2.create_key_pair(
        KeyName="cloudtrain-c1", KeyType="ed25519", TagSpecifications=tags("c1", "key-pair")
    )
    ec2.create_placement_group(
        GroupName="c1-pg", Strategy="cluster", TagSpecifications=tags("c1", "placement-group")
    )
    ids = launch(ec2, Placement={"GroupName": "c1-pg"}, TagSpecifications=tags("c1", "instance"))
    ec2.create_security_group(GroupName="other", Description="not c1")

    left = leftovers(ec2, "c1")
    assert left["instances"] == ids
    assert left["security_groups"] == [group_id]
    assert left["key_pairs"] == ["cloudtrain-c1"]
    assert left["placement_groups"] == ["c1-pg"]
    with pytest.raises(AssertionError, match="c1-pg"):
        assert_empty(ec2, "c1")

    ec2.terminate_instances(InstanceIds=ids)
    ec2.delete_placement_group(GroupName="c1-pg")
    ec2.delete_key_pair(KeyName="cloudtrain-c1")
    ec2.delete_security_group(GroupId=group_id)
    assert_empty(ec2, "c1")
