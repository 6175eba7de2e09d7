"""The wheel of the running cloudtrain that nodes install: complete, valid, installable."""

from __future__ import annotations

import base64
import csv
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import cloudtrain
from cloudtrain.boot import wheel
from tests.conftest import require_tool


def test_the_wheel_holds_every_package_tree_with_a_valid_record(tmp_path: Path) -> None:
    built = wheel.build(tmp_path)
    assert built.name == f"cloudtrain-{cloudtrain.__version__}-py3-none-any.whl"
    assert wheel.build(tmp_path) == built  # cached by content
    with zipfile.ZipFile(built) as archive:
        names = set(archive.namelist())
        for expected in ("cloudtrain/node/__init__.py", "cloudtrain/runtime/dist.py",
                         "cloudtrain/providers/local/provider.py",
                         "cloudtrain/templates/bootstrap.sh"):  # fmt: skip
            assert expected in names
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        entry_points = archive.read(
            f"cloudtrain-{cloudtrain.__version__}.dist-info/entry_points.txt"
        )
        assert b"[torchrun.handlers]" in entry_points, "a node's torchrun finds the backend"
        info = f"cloudtrain-{cloudtrain.__version__}.dist-info"
        record = list(csv.reader(archive.read(f"{info}/RECORD").decode().splitlines()))
        for name, digest, size in record:
            if name.endswith("RECORD"):
                continue
            data = archive.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}"
            assert int(size) == len(data)
        assert {r[0] for r in record} == names


def test_a_node_python_installs_it_and_runs_the_agent(tmp_path: Path) -> None:
    python = require_tool("/usr/bin/python3")  # a Python without this checkout's cloudtrain
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel.build(tmp_path))], check=True)  # fmt: skip
    done = subprocess.run(
        [python, "-c", "import cloudtrain, cloudtrain.node as n; print(cloudtrain.__version__,"
         " cloudtrain.__file__); n.main(['port'])"],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    version, path, port = done.stdout.split()
    assert version == cloudtrain.__version__
    assert path.startswith(str(target))
    assert port.isdigit()


def test_every_folder_of_python_is_a_package_that_pip_ships() -> None:
    """setuptools ships the packages it finds under ``cloudtrain*`` (`packages.find`); a folder of
    modules without an ``__init__.py`` would be a namespace that `find` passes over."""
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    find = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert find == {"find": {"include": ["cloudtrain*"]}}
    folders = {p.parent for p in (repo / "cloudtrain").rglob("*.py")} - {repo / "cloudtrain"}
    assert {
        f for f in folders if "__pycache__" not in f.parts and not (f / "__init__.py").exists()
    } == set()
