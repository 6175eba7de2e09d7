"""The fake torch's ``version.py``, which the bootstrap's torch phase reads without importing
torch: what the pip stub recorded in ``$STUB_STATE/torch`` ("VERSION CUDA")."""

import os
from pathlib import Path

_record = Path(os.environ["STUB_STATE"]) / "torch"
if not _record.exists():
    raise FileNotFoundError("torch/version.py (stub: not installed)")

__version__, _cuda = _record.read_text().split()
cuda = None if _cuda == "None" else _cuda
