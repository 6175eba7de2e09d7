"""A preflight's verdict: PASS, WARN with the likely causes, or FAIL, from its figures and
what the cluster's machine type should give (`cloudtrain.plan.networks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.plan.networks import Network

if TYPE_CHECKING:
    pass

from cloudtrain.preflight.reading import (
    GB,
    Results,
    Size,
    Transport,
    gpu_problems,
    pair_rates,
    sizes_of,
    slow_nodes,
)

#: PASS between GPU nodes: peak busbw ≥ this share of the NIC rate. nccl-tests on a healthy
#: fabric reaches 70–95% of it at large sizes (EFA on p4d ≈ 40 of 50 GB/s, HDR InfiniBand
#: ≈ 90%); NCCL fallen back to sockets on an EFA or InfiniBand machine reaches 5–15%, one
#: degraded link or node about half. 0.5 sits between a working fabric and a broken one, with
#: room for the small messages and a busy cluster.
PASS_FRACTION = 0.5
#: PASS between CPU nodes: gloo's peak busbw ≥ this share of one TCP stream's rate between the
#: same nodes. gloo's ring moves the same bytes a stream does but also reduces them on the
#: CPU; measured at 0.2–0.7 on this project's 2-core machine (two local nodes over loopback,
#: sharing the cores). Below a tenth, gloo is not on the path the stream took
#: (GLOO_SOCKET_IFNAME) or a node is starved of CPU.
CPU_FRACTION = 0.1


# -- the verdict ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The cluster a preflight ran on, as its record says."""

    name: str
    provider: str
    instance_type: str | None
    num_nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Report:
    """A preflight's figures and verdict; `to_dict` is ``--json``'s output."""

    target: Target
    verdict: str  # PASS | WARN | FAIL
    causes: tuple[str, ...]
    notes: tuple[str, ...]
    backend: str | None
    ranks: int
    sizes: tuple[Size, ...]
    expected: Network | None
    transports: Mapping[int, Transport | None]
    tcp: Mapping[str, Any] | None
    pairs: Mapping[tuple[int, int], float]
    slow: tuple[tuple[int, float, float], ...]
    job_id: str | None = None

    @property
    def peak(self) -> Size | None:
        """The size with the highest busbw: the figure judged."""
        return max(self.sizes, key=lambda s: s.busbw, default=None)

    @property
    def tcp_rate(self) -> float | None:
        """The TCP stream's rate, GB/s."""
        if not self.tcp:
            return None
        return float(self.tcp["bytes"]) / float(self.tcp["seconds"]) / GB

    @property
    def fraction(self) -> float | None:
        """The peak busbw over what it is judged against (the NIC rate on GPU nodes, the TCP
        stream on CPU nodes); None when there is nothing to judge it against."""
        peak = self.peak
        if peak is None:
            return None
        if self.backend == "gloo":
            rate = self.tcp_rate
            return peak.busbw / rate if rate else None
        if self.expected is None or self.target.num_nodes < 2:
            return None
        return peak.busbw / self.expected.gbyte_per_s

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def to_dict(self) -> dict[str, Any]:
        peak, rate = self.peak, self.tcp_rate
        return {
            "cluster": self.target.name,
            "job_id": self.job_id,
            "verdict": self.verdict,
            "causes": list(self.causes),
            "notes": list(self.notes),
            "provider": self.target.provider,
            "instance_type": self.target.instance_type,
            "nodes": self.target.num_nodes,
            "ranks": self.ranks,
            "backend": self.backend,
            "sizes": [
                {
                    "bytes": s.nbytes,
                    "seconds": s.seconds,
                    "algbw_gb_s": s.algbw,
                    "busbw_gb_s": s.busbw,
                }
                for s in self.sizes
            ],
            "busbw_gb_s": peak.busbw if peak else None,
            "expected": None
            if self.expected is None
            else {**dataclasses.asdict(self.expected), "gb_s": self.expected.gbyte_per_s},
            "fraction": self.fraction,
            "pass_fraction": CPU_FRACTION if self.backend == "gloo" else PASS_FRACTION,
            "transport": {
                str(n): None if t is None else {**dataclasses.asdict(t), "label": t.label}
                for n, t in sorted(self.transports.items())
            },
            "tcp": None if not self.tcp else {**self.tcp, "gb_s": rate},
            "pairs": [{"a": a, "b": b, "gb_s": r} for (a, b), r in sorted(self.pairs.items())],
            "slow_nodes": [{"node": n, "gb_s": m, "others_gb_s": o} for n, m, o in self.slow],
        }


def _nodes(nodes: Iterable[int]) -> str:
    listed = sorted(nodes)
    return ("node " if len(listed) == 1 else "nodes ") + ", ".join(map(str, listed))


def _transport_causes(transports: Mapping[int, Transport | None], expected: Network) -> list[str]:
    """NCCL on another transport than the machine's fabric, by transport."""
    wrong: dict[str, list[int]] = {}
    for node, t in transports.items():
        if t is None or expected.fabric == "tcp" or t.fabric == expected.fabric:
            continue
        wrong.setdefault(t.label, []).append(node)
    causes = []
    for label, nodes in sorted(wrong.items()):
        if expected.fabric == "efa":
            why = (
                "the EFA interfaces are not attached, or NCCL does not find the aws-ofi-nccl "
                "plugin (libnccl-net.so): check `fi_info -p efa` on the nodes and that the "
                "plugin's folder is on LD_LIBRARY_PATH"
            )
            if label.startswith("NET/OFI"):
                why = (
                    "the OFI plugin runs, but not on the efa provider: the EFA interfaces "
                    "are not attached or FI_PROVIDER names another"
                )
            fabric = "EFA"
        else:
            why, fabric = "the InfiniBand devices are not usable: " + expected.note, "InfiniBand"
        causes.append(
            f"NCCL used {label} on {_nodes(nodes)}, on {expected.instance_type}, an "
            f"{fabric} machine: {why}"
        )
    return causes


def judge(
    target: Target,
    results: Results,
    transports: Mapping[int, Transport | None],
    expected: Network | None,
    *,
    failure: str | None = None,
    job_id: str | None = None,
) -> Report:
    """The verdict on a preflight's `results` (PASS, WARN with causes, FAIL when it did not
    complete), with `expected` the network `target`'s machine should give (None: unknown)."""
    sizes = sizes_of(results)
    backend = results.meta.get("backend")
    ranks = int(results.meta.get("world_size") or 0)
    causes: list[str] = []
    notes: list[str] = []
    if failure or not results.done:
        causes.append(failure or "the preflight job ended before its last result")
    for found in results.gpus:
        causes.extend(gpu_problems(int(found["node"]), found))
    rates = pair_rates(results)
    slow = slow_nodes(rates)
    for node, mine, others in slow:
        causes.append(
            f"node {node} is slow: its pairs move {mine:.2f} GB/s, the other pairs "
            f"{others:.2f} GB/s; replace it (`cloudtrain down` and `up` again)"
        )
    if len(rates) == 1:
        notes.append(
            "two nodes: a slow node and a slow link look the same; three or more tell them apart"
        )
    report = Report(
        target=target,
        verdict="PASS",
        causes=(),
        notes=(),
        backend=backend,
        ranks=ranks,
        sizes=tuple(sizes),
        expected=expected,
        transports=dict(transports),
        tcp=results.tcp,
        pairs=rates,
        slow=tuple(slow),
        job_id=job_id,
    )
    peak, fraction = report.peak, report.fraction
    if peak is None:
        pass
    elif backend == "gloo":
        if fraction is None:
            notes.append("no TCP stream was measured: gloo's figure is not judged")
        elif fraction < CPU_FRACTION:
            causes.append(
                f"gloo's bus bandwidth {peak.busbw:.2f} GB/s is {fraction:.0%} of one TCP "
                f"stream's {report.tcp_rate:.2f} GB/s between the same nodes: gloo is not on "
                "the stream's path (set GLOO_SOCKET_IFNAME to the interface of the nodes' "
                "addresses) or a node is short of CPU"
            )
    elif target.num_nodes < 2:
        notes.append(
            "one node: nothing crossed the network; the figure is the GPUs' own links "
            "(NVLink, PCIe)"
        )
    else:
        if not any(t is not None for t in transports.values()):
            notes.append("NCCL named no transport (its NCCL_DEBUG=INFO lines are missing)")
        if expected is None:
            notes.append(
                f"expected bandwidth unknown: {target.instance_type or 'the machine type'} of "
                f"{target.provider} is not in networks.csv; the figure is not judged"
            )
        else:
            wrong = _transport_causes(transports, expected)
            causes.extend(wrong)
            if fraction is not None and fraction < PASS_FRACTION:
                why = f"{expected.instance_type}'s network"
                if not wrong and not slow:  # nothing named yet: the usual suspects
                    why += (
                        ": the nodes are not in one placement group, or a link is degraded or "
                        f"shared; {expected.note}"
                    )
                causes.append(
                    f"bus bandwidth {peak.busbw:.1f} GB/s is {fraction:.0%} of the "
                    f"{expected.gbyte_per_s:g} GB/s ({expected.gbit_per_s:g} Gb/s) of {why}"
                )
    verdict = "FAIL" if failure or not results.done else ("WARN" if causes else "PASS")
    return dataclasses.replace(report, verdict=verdict, causes=tuple(causes), notes=tuple(notes))
