"""What a GPU machine's network should give: its NIC rate per node and its fabric.

The data ships as ``cloudtrain/data/networks.csv`` (``# `` comment lines, then a header
`FIELDS` and one row per provider and instance type), read on first use by `load` (cached)
through `importlib.resources`; nothing is read at import time. `cloudtrain preflight` compares
the all-reduce bus bandwidth it measures between nodes with `Network.gbit_per_s`, and names the
likely cause from `Network.fabric` and `Network.note` when it falls short.

=========  ====================================================================================
fabric     what NCCL should use between nodes
=========  ====================================================================================
``efa``    NET/OFI with the ``efa`` provider (the aws-ofi-nccl plugin); Socket means the EFA
           interfaces or the plugin are missing
``ib``     NET/IB (InfiniBand verbs); Socket means the IB devices are not reachable
``tcp``    NET/Socket: the machine has no RDMA fabric, sockets are the expected transport
=========  ====================================================================================
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, fields
from importlib import resources

from cloudtrain.errors import ConfigError

#: The fabrics a row may name.
FABRICS = ("efa", "ib", "tcp")


@dataclass(frozen=True)
class Network:
    """One machine type's network between nodes."""

    provider: str
    instance_type: str
    #: the NIC rate of one node, all its NICs together, in Gbit/s
    gbit_per_s: float
    fabric: str
    note: str

    @property
    def gbyte_per_s(self) -> float:
        """`gbit_per_s` in GB/s (10^9 bytes), the unit nccl-tests prints bandwidth in."""
        return self.gbit_per_s / 8


#: The CSV header: the fields of `Network`, in order.
FIELDS = tuple(f.name for f in fields(Network))


def parse(text: str, source: str = "networks.csv") -> dict[tuple[str, str], Network]:
    """The rows of `text` by (provider, instance type). Raises `ConfigError` naming the line
    for a bad header, rate or fabric, or a type listed twice."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    reader = csv.DictReader(lines)
    if tuple(reader.fieldnames or ()) != FIELDS:
        raise ConfigError(f"{source}: the header must be {','.join(FIELDS)}")
    rows: dict[tuple[str, str], Network] = {}
    for number, row in enumerate(reader, start=2):
        where = f"{source}: row {number}"
        try:
            rate = float(row["gbit_per_s"])
        except (TypeError, ValueError):
            raise ConfigError(
                f"{where}: gbit_per_s {row['gbit_per_s']!r} is not a number"
            ) from None
        if not rate > 0:
            raise ConfigError(f"{where}: gbit_per_s must be above 0, not {rate:g}")
        if row["fabric"] not in FABRICS:
            raise ConfigError(
                f"{where}: fabric {row['fabric']!r} is not one of {', '.join(FABRICS)}"
            )
        net = Network(
            provider=row["provider"],
            instance_type=row["instance_type"],
            gbit_per_s=rate,
            fabric=row["fabric"],
            note=row["note"] or "",
        )
        key = (net.provider, net.instance_type)
        if key in rows:
            raise ConfigError(f"{where}: {net.provider} {net.instance_type} is listed twice")
        rows[key] = net
    return rows


@functools.cache
def load() -> dict[tuple[str, str], Network]:
    """The shipped table (read once)."""
    text = resources.files("cloudtrain.data").joinpath("networks.csv").read_text("utf-8")
    return parse(text)


def expected(provider: str, instance_type: str | None) -> Network | None:
    """What `instance_type` of `provider` should give between nodes; None when unknown."""
    if not instance_type:
        return None
    return load().get((provider, instance_type))
