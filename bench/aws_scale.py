"""How does `cloudtrain up` on AWS scale with the cluster size, against the bare SDK?

    python bench/aws_scale.py [--sizes 16 256 1000] [--repeat K] [--cold] [--quick]

For each N, against a local AWS stand-in (moto's server behind the shims in tests/aws/):
  (a) `cloudtrain up --provider aws --gpus V100:1 --nodes N --no-setup` as a user runs it (a
      new process), counting the EC2 API calls it makes by operation, then `cloudtrain down`
      (`--no-setup`: the stand-in's instances are records, with no sshd to bootstrap; the
      stand-in's environment also sets CLOUDTRAIN_SSH_LOOPBACK_ONLY, so no SSH packet can
      leave the machine for the addresses moto invents);
  (b) the bare boto3 equivalent in a new process: one `run_instances(MinCount=MaxCount=N)` and
      the `instance_running` waiter (2 s delay, cloudtrain's poll interval).
cloudtrain's plan reads (the zones that offer the type, the image) are cached for a day under
CLOUDTRAIN_HOME, which the run shares, and so are botocore's parsed models
(`cloudtrain/providers/aws/_models.py`): the first `up` of a run reads the JSON and asks
("cold"), the later ones do not ("warm"), as a user's second `up` of the day; `--cold` empties
the plan's cache before each. (The stand-in is reset between sizes and registers its image
anew; moto
does not check the image id a launch names, so a cached one still launches, as a real cached
id would.)

With `--repeat K`, each size is measured K times, the two sides taking turns, and a last
table gives the median of the ratios by size and cache state: on a shared machine one pair
can be off by 1.5× either way.

moto builds a region's EC2 backend (its default VPC, subnets, groups…) on the first call there
after a reset, 0.1–0.9 s of the stand-in's time on this machine; real AWS has no such cost.
cloudtrain looks in every catalog region (whether anyone holds the name), the bare call in
one, so the bench makes that first call in each of them before it starts the clock (the
figures before 2026-12-03 charged it to cloudtrain). It also compiles cloudtrain's modules
first, as pip does at install: a checkout with
PYTHONDONTWRITEBYTECODE set (as on the machine that measured before 2026-12-03, late) has no
bytecode for them, and every `up` compiled ≈45 modules from source.

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
import compileall
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from wsgiref.types import StartResponse, WSGIEnvironment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cloudtrain.plan import catalog  # noqa: E402
from tests.aws import moto_gaps  # noqa: E402
from tests.aws.standin import (  # noqa: E402
    StandIn,
    StandInApp,
    put_dlami_parameter,
    register_dlami,
)

#: the plan's read-only calls, which a warm cache saves
PLAN_READS = ("DescribeInstanceTypeOfferings", "GetParameter", "DescribeImages")

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


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The wall seconds of a run of `argv`, and the CPU seconds (user + system) it used: on a
    busy machine the first varies by 1.5× and more, the second much less."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    wall = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1000])
    parser.add_argument("--quick", action="store_true", help="one small size (what CI runs)")
    parser.add_argument(
        "--moto-tag-scan", action="store_true", help="moto's own tag lookup (a scan per resource)"
    )
    parser.add_argument(
        "--cold", action="store_true", help="empty cloudtrain's plan cache before each `up`"
    )
    parser.add_argument("--repeat", type=int, default=1, help="pairs measured per size")
    args = parser.parse_args()
    if args.quick:
        args.sizes = [4]
    rows = []
    # As a wheel's install leaves it: cloudtrain's modules compiled once (the bare side's
    # boto3 was, by pip). A checkout run with PYTHONDONTWRITEBYTECODE (or read-only) would
    # charge every `up` with compiling ≈45 of them from source, ≈0.07 s.
    compileall.compile_dir(REPO / "cloudtrain", quiet=1)
    regions = sorted({r.region for r in catalog.load().rows if r.provider == "aws"})
    app = TimedApp()
    with StandIn(app) as aws, tempfile.TemporaryDirectory(prefix="cloudtrain-bench-") as tmp:
        home = Path(tmp) / "home"
        env = aws.subprocess_env({**os.environ, "CLOUDTRAIN_HOME": str(home)})
        cli = [sys.executable, "-m", "cloudtrain.cli"]
        for n in [n for n in args.sizes for _ in range(args.repeat)]:
            aws.reset()
            if args.moto_tag_scan:
                moto_gaps.index_tag_lookups(False)
            for region in regions:  # moto's first call in a region builds it: not timed
                aws.client("ec2", region).describe_security_groups(GroupNames=["default"])
            image = register_dlami(aws.client("ec2"))
            put_dlami_parameter(aws.client("ssm"), image)
            if args.cold:
                shutil.rmtree(home / "cache", ignore_errors=True)
            before, app.seconds = len(aws.app.calls(service=None)), 0.0
            up = ["up", "--provider", "aws", "--gpus", "V100:1", "--nodes", str(n)]
            up += ["--name", f"bench{n}", "--region", "us-east-1", "--no-setup"]
            up += ["--ssh-cidr", "203.0.113.7/32"]
            ours, ours_cpu = timed([*cli, *up], env)
            ours_served = app.seconds
            calls: dict[str, int] = {}
            for call in aws.app.calls(service=None)[before:]:
                calls[call.action] = calls.get(call.action, 0) + 1
            cache = "cold" if set(calls) & set(PLAN_READS) else "warm"
            timed([*cli, "down", f"bench{n}"], env)
            app.seconds = 0.0
            bare, bare_cpu = timed([sys.executable, "-c", BARE, str(n), image], env)
            served = (ours_served, app.seconds)
            rows.append((n, cache, ours, bare, served, calls, (ours_cpu, bare_cpu)))
            print(
                f"N={n} ({cache}): cloudtrain {ours:.2f} s, boto3 {bare:.2f} s (stand-in "
                f"{served[0]:.2f} s / {served[1]:.2f} s; CPU {ours_cpu:.2f} s / {bare_cpu:.2f} s)",
                flush=True,
            )

    print()
    print(
        f"{'nodes':>6} {'cache':>5} {'cloudtrain s':>13} {'boto3 s':>8} {'ratio':>6}  "
        f"{'stand-in s (cloudtrain / boto3)':>31}  {'CPU s (cloudtrain / boto3)':>26}  "
        "cloudtrain's calls (RunInstances / DescribeInstances / all)"
    )
    for n, cache, ours, bare, served, calls, cpu in rows:
        print(
            f"{n:>6} {cache:>5} {ours:13.2f} {bare:8.2f} {ours / bare:6.2f}  "
            f"{f'{served[0]:.2f} / {served[1]:.2f}':>31}  {f'{cpu[0]:.2f} / {cpu[1]:.2f}':>26}  "
            f"{calls.get('RunInstances', 0)} / {calls.get('DescribeInstances', 0)} / "
            f"{sum(calls.values())}"
        )
    if args.repeat > 1:
        print()
        print(
            f"{'nodes':>6} {'cache':>5} {'pairs':>5} {'median ratio':>12} {'range':>11} "
            f"{'fastest / fastest':>17} {'CPU ratio':>9}"
        )
        for key in dict.fromkeys((n, cache) for n, cache, *_ in rows):
            pairs = [(r[2], r[3], r[6]) for r in rows if (r[0], r[1]) == key]
            ratios = sorted(ours / bare for ours, bare, _ in pairs)
            fastest = min(p[0] for p in pairs) / min(p[1] for p in pairs)
            cpu_ratio = statistics.median(c[0] for *_, c in pairs) / statistics.median(
                c[1] for *_, c in pairs
            )
            print(
                f"{key[0]:>6} {key[1]:>5} {len(pairs):>5} {statistics.median(ratios):12.2f} "
                f"{f'{ratios[0]:.2f}–{ratios[-1]:.2f}':>11} {fastest:17.2f} {cpu_ratio:9.2f}"
            )


if __name__ == "__main__":
    main()
