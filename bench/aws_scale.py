"""How does `cloudtrain up` on AWS scale with the cluster size, against the bare SDK?

    python bench/aws_scale.py [--sizes 16 256 1000] [--quick]

For each N, against a local AWS stand-in (moto's server behind the shims in tests/aws/):
  (a) `cloudtrain up --provider aws --gpus V100:1 --nodes N --no-setup` as a user runs it (a
      new process), counting the EC2 API calls it makes by operation, then `cloudtrain down`
      (`--no-setup`: the stand-in's instances are records, with no sshd to bootstrap; the
      stand-in's environment also sets CLOUDTRAIN_SSH_LOOPBACK_ONLY, so no SSH packet can
      leave the machine for the addresses moto invents);
  (b) the bare boto3 equivalent in a new process: one `run_instances(MinCount=MaxCount=N)` and
      the `instance_running` waiter (2 s delay, cloudtrain's poll interval).
It prints wall times and their ratio, and cloudtrain's calls: creation must be O(1) calls in N
(one RunInstances) and waiting one paginated DescribeInstances per poll.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.aws.standin import StandIn, put_dlami_parameter, register_dlami  # noqa: E402

BARE = """
import sys, boto3
n, image = int(sys.argv[1]), sys.argv[2]
ec2 = boto3.client("ec2", region_name="us-east-1")
tags = [{"ResourceType": "instance", "Tags": [{"Key": "bench", "Value": "bare"}]}]
out = ec2.run_instances(ImageId=image, InstanceType="p3.2xlarge", MinCount=n, MaxCount=n,
                        Placement={"AvailabilityZone": "us-east-1a"}, TagSpecifications=tags)
ids = [i["InstanceId"] for i in out["Instances"]]
ec2.get_waiter("instance_running").wait(InstanceIds=ids, WaiterConfig={"Delay": 2})
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1000])
    parser.add_argument("--quick", action="store_true", help="one small size (what CI runs)")
    args = parser.parse_args()
    if args.quick:
        args.sizes = [4]
    rows = []
    with StandIn() as aws, tempfile.TemporaryDirectory(prefix="cloudtrain-bench-") as tmp:
        env = aws.subprocess_env({**os.environ, "CLOUDTRAIN_HOME": str(Path(tmp) / "home")})
        cli = [sys.executable, "-m", "cloudtrain.cli"]
        for n in args.sizes:
            aws.reset()
            image = register_dlami(aws.client("ec2"))
            put_dlami_parameter(aws.client("ssm"), image)
            before = len(aws.app.calls())
            ours = timed([*cli, "up", "--provider", "aws", "--gpus", "V100:1", "--nodes", str(n),
                          "--name", f"bench{n}", "--region", "us-east-1", "--no-setup",
                          "--ssh-cidr", "203.0.113.7/32"], env)  # fmt: skip
            calls: dict[str, int] = {}
            for call in aws.app.calls()[before:]:
                calls[call.action] = calls.get(call.action, 0) + 1
            timed([*cli, "down", f"bench{n}"], env)
            bare = timed([sys.executable, "-c", BARE, str(n), image], env)
            rows.append((n, ours, bare, calls))
            print(f"N={n}: cloudtrain {ours:.2f} s, boto3 {bare:.2f} s", flush=True)

    print()
    print(f"{'nodes':>6} {'cloudtrain s':>13} {'boto3 s':>8} {'ratio':>6}  "
          "cloudtrain's EC2 calls (RunInstances / DescribeInstances / all)")  # fmt: skip
    for n, ours, bare, calls in rows:
        print(f"{n:>6} {ours:13.2f} {bare:8.2f} {ours / bare:6.2f}  "
              f"{calls.get('RunInstances', 0)} / {calls.get('DescribeInstances', 0)} / "
              f"{sum(calls.values())}")  # fmt: skip


if __name__ == "__main__":
    main()
