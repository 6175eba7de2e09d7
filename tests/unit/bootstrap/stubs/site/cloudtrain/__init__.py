"""A fake node agent: its version is in $STUB_STATE/cloudtrain-version once pip installed it."""

import os
from pathlib import Path

_version = Path(os.environ["STUB_STATE"]) / "cloudtrain-version"
if not _version.exists():
    raise ImportError("No module named 'cloudtrain' (stub: not installed)")
__version__ = _version.read_text().strip()
