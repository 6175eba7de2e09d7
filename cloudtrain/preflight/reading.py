"""What a preflight's nodes printed, read: the worker's result lines (`MARK`), NCCL's
``NCCL_DEBUG=INFO`` lines (the transport), ``nvidia-smi``'s answer, and the figures made of
them (algbw and busbw as nccl-tests defines them, each pair's rate, a slow node).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

#: A node is slow when the median of its pairs' rates is under this share of the other pairs'.
SLOW_FRACTION = 0.5
MARK = "CLOUDTRAIN_PREFLIGHT "
GB = 1e9


def algbw(nbytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: bytes per second."""
    return nbytes / seconds


def busbw(alg: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce over `ranks` ranks: algbw × 2(n−1)/n, the
    rate each rank's link carries, comparable with the hardware's whatever n is."""
    return alg * 2 * (ranks - 1) / ranks


# -- NCCL's log -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transport:
    """What NCCL said it used between nodes, on one node."""

    #: as NCCL names it: ``IB``, ``Socket``, ``AWS Libfabric`` (the aws-ofi-nccl plugin) ...
    network: str
    #: efa | ib | tcp | ofi (the OFI plugin on a provider other than efa) | other
    fabric: str
    #: the libfabric provider the OFI plugin chose (``efa``, ``tcp``), if it said
    provider: str | None = None
    #: a channel went through GPUDirect RDMA (``/GDRDMA``)
    gdr: bool = False

    @property
    def label(self) -> str:
        """``NET/IB``, ``NET/Socket``, ``NET/OFI (efa)``."""
        if self.fabric in ("efa", "ofi"):
            return f"NET/OFI ({self.provider or 'provider not said'})"
        return f"NET/{self.network}"


_USING = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_VIA = re.compile(r"NCCL INFO Channel .* via NET/(.+?)/\d+(/GDRDMA)?")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([\w;-]+)")


def _fabric(network: str, provider: str | None) -> str:
    if "Libfabric" in network or "OFI" in network:
        return "efa" if provider == "efa" else "ofi"
    return {"IB": "ib", "Socket": "tcp"}.get(network, "other")


def parse_transport(lines: Iterable[str]) -> Transport | None:
    """The transport NCCL's ``NCCL_DEBUG=INFO`` `lines` (one node's) name: the ``Using network``
    line, else the network of the ``via NET/...`` channels; None when they name none."""
    network = provider = None
    gdr = False
    for line in lines:
        if "NCCL INFO" not in line:
            continue
        if found := _USING.search(line):
            network = network or found.group(1)
        elif found := _OFI_PROVIDER.search(line):
            provider = provider or found.group(1)
        elif found := _VIA.search(line):
            network = network or found.group(1)
            gdr = gdr or bool(found.group(2))
    if network is None:
        return None
    return Transport(network, _fabric(network, provider), provider, gdr)


# -- nvidia-smi -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One line of ``nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,
    temperature.gpu,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits``."""

    index: int
    name: str
    bus_id: str
    memory_mib: int | None
    temperature_c: int | None
    ecc_uncorrected: int | None  # None: ECC off or not reported ([N/A])


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def parse_gpus(text: str) -> list[Gpu]:
    """The GPUs in `nvidia-smi`'s CSV; lines that are not a GPU's are skipped."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 6 or not cells[0].isdigit():
            continue
        gpus.append(
            Gpu(int(cells[0]), cells[1], cells[2], _int(cells[3]), _int(cells[4]), _int(cells[5]))
        )
    return gpus


def gpu_problems(node: int, found: Mapping[str, Any]) -> list[str]:
    """What is wrong with `node`'s GPUs, from the worker's ``gpus`` result."""
    if found.get("returncode") != 0:
        said = " ".join(str(found.get("smi") or "").split())[:200]
        return [
            f"node {node}: nvidia-smi failed ({said or 'no output'}): the driver is not "
            "loaded or a GPU is in a bad state; reboot the node or replace it"
        ]
    gpus = parse_gpus(str(found.get("smi") or ""))
    problems = []
    expected = int(found.get("expected") or 0)
    if expected and len(gpus) < expected:
        problems.append(
            f"node {node}: nvidia-smi lists {len(gpus)} GPU(s) of the machine's "
            f"{expected}: a GPU fell off the bus; replace the node"
        )
    for gpu in gpus:
        if gpu.ecc_uncorrected:
            problems.append(
                f"node {node}: GPU {gpu.index} ({gpu.bus_id}) has "
                f"{gpu.ecc_uncorrected} uncorrectable ECC error(s); replace the "
                "node (or reset the GPU)"
            )
    return problems


# -- the worker's results -------------------------------------------------------------------------


@dataclass(frozen=True)
class Results:
    """What the worker printed (`MARK` lines), by kind."""

    meta: Mapping[str, Any] = field(default_factory=dict)
    allreduce: tuple[Mapping[str, Any], ...] = ()
    pairs: tuple[Mapping[str, Any], ...] = ()
    tcp: Mapping[str, Any] | None = None
    gpus: tuple[Mapping[str, Any], ...] = ()
    done: bool = False


def read_results(lines: Iterable[str]) -> Results:
    """The worker's results in `lines` (a job's log, any node's); lines that do not parse are
    skipped."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for line in lines:
        at = line.find(MARK)
        if at < 0:
            continue
        try:
            item = json.loads(line[at + len(MARK) :])
        except ValueError:
            continue
        if isinstance(item, dict):
            found.setdefault(str(item.get("kind")), []).append(item)
    tcp = found.get("tcp")
    return Results(
        meta=(found.get("meta") or [{}])[0],
        allreduce=tuple(found.get("allreduce", ())),
        pairs=tuple(found.get("pair", ())),
        tcp=tcp[0] if tcp else None,
        gpus=tuple(found.get("gpus", ())),
        done=bool(found.get("done")),
    )


@dataclass(frozen=True)
class Size:
    """One message size's figures (GB/s)."""

    nbytes: int
    seconds: float
    algbw: float
    busbw: float


def sizes_of(results: Results) -> list[Size]:
    rows = []
    for item in results.allreduce:
        nbytes, seconds, ranks = int(item["bytes"]), float(item["seconds"]), int(item["ranks"])
        alg = algbw(nbytes, seconds) / GB
        rows.append(Size(nbytes, seconds, alg, busbw(alg, ranks)))
    return sorted(rows, key=lambda s: s.nbytes)


def pair_rates(results: Results) -> dict[tuple[int, int], float]:
    """Each pair of nodes' rate alone, GB/s."""
    return {
        (int(p["a"]), int(p["b"])): float(p["bytes"]) / float(p["seconds"]) / GB
        for p in results.pairs
    }


def slow_nodes(rates: Mapping[tuple[int, int], float]) -> list[tuple[int, float, float]]:
    """The nodes whose pairs' median rate is under `SLOW_FRACTION` of the other pairs'
    median, as (node, its median, the others'); none with fewer than three nodes."""
    nodes = sorted({n for pair in rates for n in pair})
    if len(nodes) < 3:
        return []
    slow = []
    for node in nodes:
        mine = [r for pair, r in rates.items() if node in pair]
        others = [r for pair, r in rates.items() if node not in pair]
        if mine and others:
            m, o = statistics.median(mine), statistics.median(others)
            if m < SLOW_FRACTION * o:
                slow.append((node, m, o))
    return slow
