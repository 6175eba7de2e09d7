"""A fake torch for the bootstrap tests, driven by files in $STUB_STATE.

``torch`` holds "VERSION CUDA" once the pip stub installed it (no file: not installed);
``gpus`` the number of GPUs; ``arches`` the kernels the build has (default sm_70 sm_80).
"""

import os
from pathlib import Path
from types import SimpleNamespace

_state = Path(os.environ["STUB_STATE"])
if not (_state / "torch").exists():
    raise ImportError("No module named 'torch' (stub: not installed)")

__version__, _cuda = (_state / "torch").read_text().split()
_gpus = int((_state / "gpus").read_text()) if (_state / "gpus").exists() else 0
_arches = (_state / "arches").read_text().split() if (_state / "arches").exists() else []

version = SimpleNamespace(cuda=None if _cuda == "None" else _cuda)
cuda = SimpleNamespace(
    is_available=lambda: version.cuda is not None and _gpus > 0,
    device_count=lambda: _gpus,
    get_arch_list=lambda: _arches or ["sm_70", "sm_80"],
    get_device_capability=lambda i: (7, 0),
    get_device_name=lambda i: "Tesla V100-SXM2-16GB (stub)",
)


class _Tensor:
    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


def ones(n: int, device: str = "cpu") -> _Tensor:
    return _Tensor(1.0)
