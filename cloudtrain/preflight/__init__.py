"""The preflight: prove a cluster's network with a real collective before hours of training.

`run` starts `cloudtrain.runtime.preflight_worker` on every node and GPU of a cluster as a job
of its own (the coordinator's real rendezvous, network and logs), reads its result lines and
NCCL's ``NCCL_DEBUG=INFO`` lines from the job's log (`reading`), and `judge`s them (`verdict`):

================  =================================================================================
figure            how it is made
================  =================================================================================
algbw, busbw      as nccl-tests defines them for all-reduce: algbw = bytes / time (the slowest
                  rank's mean per call), busbw = algbw × 2(n−1)/n for n ranks, in GB/s (10^9
                  bytes); the figure judged is the peak busbw over the sizes (1 MiB to 1 GiB on
                  GPU, to 64 MiB on CPU). Two nodes run NCCL's ring (``NCCL_ALGO=Ring``): its tree
                  reads up to twice the NIC rate there
transport         what NCCL said it used (``Using network IB|Socket|AWS Libfabric``, the
                  ``NET/OFI Selected Provider is efa`` line, ``via NET/...`` channels), per node
pairs             every pair of nodes alone (their first ranks, send and receive): a node whose
                  pairs are all under `SLOW_FRACTION` of the others' is named slow (3+ nodes;
                  with two, a slow node and a slow link look the same)
tcp               one plain TCP stream between two nodes on the address the job uses
gpus              ``nvidia-smi``: the count against the machine's, uncorrectable ECC errors
================  =================================================================================

The verdict is PASS, WARN (with the likely causes) or FAIL (the collective did not complete).
Between GPU nodes PASS needs busbw ≥ `PASS_FRACTION` of the NIC rate that
``cloudtrain/data/networks.csv`` gives the instance type (`cloudtrain.plan.networks`), which
is also what names the likely cause: NCCL on sockets on an EFA or InfiniBand machine runs at a
tenth of the speed. A type not in that table is "unknown": the figure is shown, not judged. On
CPU clusters (gloo) PASS needs busbw ≥ `CPU_FRACTION` of the TCP stream measured in the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cloudtrain.spec import ClusterSpec
    from cloudtrain.state import State

from cloudtrain.preflight.reading import (
    MARK,
    SLOW_FRACTION,
    algbw,
    busbw,
    parse_gpus,
    parse_transport,
    read_results,
)
from cloudtrain.preflight.verdict import CPU_FRACTION, PASS_FRACTION, Report, Target, judge

__all__ = [
    "CPU_FRACTION",
    "MARK",
    "PASS_FRACTION",
    "SLOW_FRACTION",
    "Report",
    "Target",
    "algbw",
    "busbw",
    "check",
    "judge",
    "parse_gpus",
    "parse_transport",
    "read_results",
    "run",
    "wanted",
]

#: The worker's module, run under torchrun on every node, and what starts its result lines.
WORKER = "cloudtrain.runtime.preflight_worker"


# -- running it -----------------------------------------------------------------------------------

OnLine = Callable[[int, str], None]


def wanted(num_nodes: int, gpus_per_node: int) -> bool:
    """Whether `up` runs the preflight at its end: a multi-node GPU cluster."""
    return num_nodes > 1 and gpus_per_node > 0


def job_envs(num_nodes: int) -> dict[str, str]:
    """The preflight job's environment: NCCL says what it uses; two nodes run the ring."""
    envs = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV"}
    if num_nodes == 2:
        envs["NCCL_ALGO"] = "Ring"
    return envs


def check(state: State, name: str) -> Target:
    """The cluster `name` as the preflight sees it; `NotFoundError` when there is none,
    `ConfigError` when it is one node with one process (no collective to measure)."""
    return _found(state, name)[1]


def _found(state: State, name: str) -> tuple[ClusterSpec, Target]:
    from cloudtrain.errors import ConfigError, NotFoundError

    record = state.cluster(name)
    if record is None:
        raise NotFoundError(f"no cluster named {name!r}; `cloudtrain status` lists them")
    spec = record.spec
    gpus = spec.resources.count
    if spec.num_nodes * max(gpus, 1) < 2:
        raise ConfigError(
            f"cluster {name!r} is one node with one process: there is no collective to "
            "measure (the preflight needs two ranks or more)"
        )
    types = [n.instance_type for n in state.nodes(name) if n.instance_type]
    offers = (record.plan or {}).get("offers") or [{}]
    instance_type = types[0] if types else offers[0].get("instance_type")
    return spec, Target(name, spec.provider, instance_type, spec.num_nodes, gpus)


def run(
    state: State,
    home: Path,
    name: str,
    on_line: OnLine | None = None,
    *,
    max_bytes: int | None = None,
    timeout_s: float = 600.0,
) -> Report:
    """Run the preflight on every node and GPU of cluster `name` and judge it; blocks until
    the job ends (the worker gives up after `timeout_s`). `on_line(node, line)` gets the job's
    log as it comes. Holds the cluster's lock while the job starts (as `train` does): call it
    after `up` released it. Raises `NotFoundError` for an unknown cluster or one whose nodes
    do not run, `ConfigError` for a cluster of one rank; a preflight that fails is a FAIL
    report, not an exception. Ctrl-C cancels its job."""
    import threading

    from cloudtrain import api
    from cloudtrain.jobs.attempts import JobSpec
    from cloudtrain.jobs.coordinator import Coordinator
    from cloudtrain.plan import networks

    spec, target = _found(state, name)
    args = ["--timeout", f"{timeout_s:g}"]
    if max_bytes is not None:
        args += ["--max-bytes", str(max_bytes)]
    job = JobSpec(
        entrypoint=("-m", WORKER, *args), envs=job_envs(target.num_nodes), name="preflight"
    )
    lines: dict[int, list[str]] = {}
    guard = threading.Lock()

    def collect(node: int, line: str) -> None:
        with guard:
            lines.setdefault(node, []).append(line)
        if on_line is not None:
            on_line(node, line)

    coord = Coordinator(state, api.provider_for(spec, home), home=home)
    try:
        rec = coord.submit(name, job, on_line=collect)
        try:
            rec = coord.follow(rec.id, collect)
        except KeyboardInterrupt:
            coord.cancel(rec.id)
            raise
    finally:
        coord.close()
    failure = None
    if rec.status != "succeeded":
        tail = str(rec.detail.get("log_tail") or "").strip().splitlines()
        failure = (
            f"the preflight job {rec.id} {rec.status}: node {rec.detail.get('failed_node')}"
            f" {rec.detail.get('reason', '')}".rstrip()
            + (f" ({tail[-1].strip()})" if tail else "")
        )
    everything = [ln for node in sorted(lines) for ln in lines[node]]
    gpus = target.gpus_per_node
    transports = {node: parse_transport(found) for node, found in lines.items()} if gpus else {}
    expected = networks.expected(target.provider, target.instance_type) if gpus else None
    return judge(
        target, read_results(everything), transports, expected, failure=failure, job_id=rec.id
    )
