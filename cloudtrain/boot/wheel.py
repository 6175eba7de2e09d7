"""A wheel of the running cloudtrain, for nodes: the node agent there is then exactly the
coordinator's version, with no package index involved. `readiness.hand_over_wheel` copies it to
nodes whose bootstrap waits for it.

Built from the imported package's tree, so it works the same for a wheel install and an
editable one. Cached under ``<home>/dist/<content hash>/``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from importlib import metadata
from pathlib import Path

import cloudtrain

SKIP = ("__pycache__", ".pyc")


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build(home: Path) -> Path:
    """The wheel of the running cloudtrain, made once per content (an edited checkout gets a
    new one even at the same version). Returns its path."""
    version = cloudtrain.__version__
    files = _files()
    # the entry points (torchrun's rendezvous plugin, the providers) come with it: a node's
    # torchrun finds `--rdzv-backend cloudtrain` only through them
    entry_points = metadata.distribution("cloudtrain").read_text("entry_points.txt")
    if entry_points:
        files[f"cloudtrain-{version}.dist-info/entry_points.txt"] = entry_points.encode()
    content = hashlib.sha256(b"".join(k.encode() + v for k, v in sorted(files.items())))
    target = home / "dist" / content.hexdigest()[:16] / f"cloudtrain-{version}-py3-none-any.whl"
    if target.exists():
        return target
    _add_metadata(files, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    partial.replace(target)
    return target


def _files() -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    folder = Path(cloudtrain.__file__).parent
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not any(s in path.parts[-1] or s in path.parts for s in SKIP):
            files[f"cloudtrain/{path.relative_to(folder).as_posix()}"] = path.read_bytes()
    return files


def _add_metadata(files: dict[str, bytes], version: str) -> None:
    info = f"cloudtrain-{version}.dist-info"
    requires = metadata.distribution("cloudtrain").requires or []
    files[f"{info}/METADATA"] = (
        "Metadata-Version: 2.1\nName: cloudtrain\n"
        f"Version: {version}\nRequires-Python: >=3.11\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: cloudtrain\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        writer.writerow([name, _digest(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
