"""The one table from GPU to NVIDIA driver, CUDA and PyTorch wheel index.

Every node's software stack is chosen here and nowhere else: the bootstrap renderer turns a
`GpuStack` into the ``CT_*`` keys of ``templates/bootstrap.sh``. Stdlib only; nothing is computed
at import time beyond these constants.

Why these values (PyTorch 2.12–2.14 publish cu126, cu130 and the experimental cu132 wheels; the
cu128 builds dropped Volta in 2.11 and are not built at all since 2.12):

- **V100, V100-32GB** (Volta, sm_70). CUDA 13 removed Volta, and PyTorch's only CUDA 12 build
  that still ships sm_70 kernels is **cu126** (its support matrix: Maxwell 5.0 … Hopper 9.0).
  A cu128/cu130 wheel installs fine and then fails at the first kernel with "no kernel image is
  available". Driver branch **580**: the last branch that supports Volta at all, and NVIDIA's
  long-term support branch (maintained to August 2028); 570 and 575 are end of life. Never move
  a Volta row past 580.
- **A100, A100-80GB** (Ampere, sm_80): the newest stable build, **cu130**, on driver branch 580,
  the first branch that runs CUDA 13.
- ``min_driver`` is the driver the CUDA toolkit itself was released with (12.6 GA: 560.28.03;
  13.0 GA: 580.65.06). A node whose ``nvidia-smi`` reports at least this keeps its driver (Deep
  Learning images); anything older gets ``nvidia-driver-<branch>-server``. We do not lean on
  CUDA minor-version compatibility (which would accept 525.60.13 for 12.x): it does not cover
  JIT-compiling PTX newer than the driver.
- CPU: the ``cpu`` wheel index, no driver, no CUDA.

EFA (Elastic Fabric Adapter) is a property of the AWS instance type, not of the GPU: only
p3dn.24xlarge, p4d.24xlarge and p4de.24xlarge among the catalog's types have it. InfiniBand is
the same on Azure (ND40rs_v2, ND96asr_v4, ND96amsr_A100_v4): `FABRIC_NCCL` holds the NCCL
settings Azure documents for them, which the bootstrap's ``nccl`` phase writes to the node's
``nccl.env`` and every job on the node gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

TORCH_INDEX = "https://download.pytorch.org/whl"

#: The instance types (all AWS) with an Elastic Fabric Adapter.
EFA_INSTANCE_TYPES = frozenset({"p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge"})


_NDV4_NCCL = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "NCCL_TOPO_FILE": "/opt/microsoft/ndv4-topo.xml",
}

#: Instance types with an InfiniBand fabric, and the NCCL settings that use it (Azure's).
FABRIC_NCCL: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "Standard_ND40rs_v2": MappingProxyType(
            {"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0"}
        ),
        "Standard_ND96asr_v4": MappingProxyType(_NDV4_NCCL),
        "Standard_ND96amsr_A100_v4": MappingProxyType(_NDV4_NCCL),
    }
)


@dataclass(frozen=True)
class GpuStack:
    """What a node with this accelerator runs: driver branch, CUDA build and wheel index."""

    accelerator: str | None  # None = CPU
    architecture: str  # "volta" | "ampere" | "cpu"
    compute_capability: str  # "7.0" | "8.0" | "" on CPU
    driver_branch: str | None  # "580" -> apt package nvidia-driver-580-server; None on CPU
    min_driver: str | None  # the lowest driver version the CUDA build needs; None on CPU
    cuda: str | None  # CUDA version of the torch build ("12.6"); None on CPU
    torch_index: str  # pip --index-url for torch
    efa: bool = False  # the instance type has EFA; set by `stack_for`
    #: NCCL settings of the instance type's fabric (InfiniBand); set by `stack_for`
    nccl: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def _gpu(accelerator: str, architecture: str, cc: str, cuda: str, min_driver: str) -> GpuStack:
    tag = "cu" + cuda.replace(".", "")
    return GpuStack(accelerator, architecture, cc, "580", min_driver, cuda, f"{TORCH_INDEX}/{tag}")


#: One row per accelerator the catalog sells, keyed by its name.
TABLE: Mapping[str, GpuStack] = MappingProxyType(
    {
        "V100": _gpu("V100", "volta", "7.0", "12.6", "560.28.03"),
        "V100-32GB": _gpu("V100-32GB", "volta", "7.0", "12.6", "560.28.03"),
        "A100": _gpu("A100", "ampere", "8.0", "13.0", "580.65.06"),
        "A100-80GB": _gpu("A100-80GB", "ampere", "8.0", "13.0", "580.65.06"),
    }
)

#: The stack of a node without a GPU.
CPU = GpuStack(None, "cpu", "", None, None, None, f"{TORCH_INDEX}/cpu")


def stack_for(accelerator: str | None, instance_type: str | None = None) -> GpuStack:
    """The stack for ``accelerator`` (None = CPU) on ``instance_type``; pure.

    Raises ValueError, naming the allowed accelerators, for an unknown one.
    """
    if accelerator is None:
        stack = CPU
    else:
        try:
            stack = TABLE[accelerator]
        except KeyError:
            allowed = ", ".join(TABLE)
            message = f"no GPU stack for accelerator {accelerator!r}; allowed: {allowed}"
            raise ValueError(message + " (or none for CPU)") from None
    fabric = FABRIC_NCCL.get(instance_type or "", MappingProxyType({}))
    return replace(stack, efa=instance_type in EFA_INSTANCE_TYPES, nccl=fabric)
