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
It prints wall times and their ratio, the seconds the stand-in itself spent answering each side
(moto's work, in this process: what neither side's client code costs), and cloudtrain's calls:
creation must be O(1) calls in N (one RunInstances) and waiting one paginated DescribeInstances
per poll.

The stand-in looks up a resource's tags in moto's per-resource table (`moto_gaps.
index_tag_lookups`); `--moto-tag-scan` measures with moto's own lookup instead, which scans every
tag of the region for each resource, once per `tag:` filter and once for the answer, so that a
describe of N tagged instances costs O(N × all tags) in the stand-in (the figures before
2026-12-02 were measured that way).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from wsgiref.types import StartResponse, WSGIEnvironment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.aws import moto_gaps  # noqa: E402
from tests.aws.standin import (  # noqa: E402
    StandIn,
    StandInApp,
    put_dlami_parameter,
    register_dlami,
)

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


class TimedApp(StandInApp):
    """The stand-in, adding up the seconds it spends answering (moto's work and the shims')."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start = time.perf_counter()
        try:
            return [b"".join(super().__call__(environ, start_response))]
        finally:
            self.seconds += time.perf_counter() - start


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
    parser.add_argument(
        "--moto-tag-scan", action="store_true", help="moto's own tag lookup (a scan per resource)"
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes = [4]
    rows = []
    app = TimedApp()
    with StandIn(app) as aws, tempfile.TemporaryDirectory(prefix="cloudtrain-bench-") as tmp:
        env = aws.subprocess_env({**os.environ, "CLOUDTRAIN_HOME": str(Path(tmp) / "home")})
        cli = [sys.executable, "-m", "cloudtrain.cli"]
        for n in args.sizes:
            aws.reset()
            if args.moto_tag_scan:
                moto_gaps.index_tag_lookups(False)
            image = register_dlami(aws.client("ec2"))
            put_dlami_parameter(aws.client("ssm"), image)
            before, app.seconds = len(aws.app.calls()), 0.0
            ours = timed([*cli, "up", "--provider", "aws", "--gpus", "V100:1", "--nodes", str(n),
                          "--name", f"bench{n}", "--region", "us-east-1", "--no-setup",
                          "--ssh-cidr", "203.0.113.7/32"], env)  # fmt: skip
            ours_served = app.seconds
            calls: dict[str, int] = {}
            for call in aws.app.calls()[before:]:
                calls[call.action] = calls.get(call.action, 0) + 1
            timed([*cli, "down", f"bench{n}"], env)
            app.seconds = 0.0
            bare = timed([sys.executable, "-c", BARE, str(n), image], env)
            served = (ours_served, app.seconds)
            rows.append((n, ours, bare, served, calls))
            print(f"N={n}: cloudtrain {ours:.2f} s, boto3 {bare:.2f} s (stand-in "
                  f"{served[0]:.2f} s / {served[1]:.2f} s)", flush=True)  # fmt: skip

    print()
    print(f"{'nodes':>6} {'cloudtrain s':>13} {'boto3 s':>8} {'ratio':>6}  "
          f"{'stand-in s (cloudtrain / boto3)':>31}  "
          "cloudtrain's EC2 calls (RunInstances / DescribeInstances / all)")  # fmt: skip
    for n, ours, bare, served, calls in rows:
        print(f"{n:>6} {ours:13.2f} {bare:8.2f} {ours / bare:6.2f}  "
              f"{f'{served[0]:.2f} / {served[1]:.2f}':>31}  "
              f"{calls.get('RunInstances', 0)} / {calls.get('DescribeInstances', 0)} / "
              f"{sum(calls.values())}")  # fmt: skip


if __name__ == "__main__":
    main()
