"""A fake cloudtrain: its version is in $STUB_STATE/cloudtrain-version once pip installed it.
Its node code is the real one ($STUB_AGENT: the real package's folder), so the bootstrap's Python
phases run for real over the fake torch."""

import os
from pathlib import Path

_version = Path(os.environ["STUB_STATE"]) / "cloudtrain-version"
if not _version.exists():
    raise ImportError("No module named 'cloudtrain' (stub: not installed)")
__version__ = _version.read_text().strip()
if os.environ.get("STUB_AGENT"):
    __path__.append(os.environ["STUB_AGENT"])
