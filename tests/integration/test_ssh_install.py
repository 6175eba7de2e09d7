"""The ssh provider's install path through the CLI, over two real sshd hosts (127.0.0.2 and
127.0.0.3) without the coordinator's Python: a venv per node, torch, this cloudtrain's wheel.
Apart from test_ssh_cluster because it is mostly pip, not a job on a clock: it runs beside the
jobs that train (`tests.conftest.BESIDE`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import SCRIPTS, Shell, down_leaves_nothing, torch_index
from tests.sshd import Lab

pytestmark = pytest.mark.integration


def test_without_python_each_node_gets_a_venv_with_torch_and_this_cloudtrain(
    sh: Shell, lab: Lab, name: str, tmp_path: Path
) -> None:
    """The install path: a venv per node, torch from a (local) index, the coordinator's wheel
    copied over SSH when the bootstrap asks for it, then the verify phase; `launch` sends the
    workdir and runs the setup on each node once it is past torch, while the bootstrap
    finishes, and the job's start does not run it again; `down` removes it."""
    args = [a for a in lab.up_args(name) if a not in ("--python", sys.executable)]
    # a SkyPilot user's first task: `setup: pip install ...`, then a job that imports it
    work = tmp_path / "proj"
    wheel = tiny_wheel(work)
    (work / "uses_it.py").write_text("import tinyct\nprint('tinyct says', tinyct.VALUE)\n")
    task = work / "task.yaml"
    task.write_text(f"workdir: .\nsetup: pip install --no-index {wheel.name}\nrun: uses_it.py\n")
    launch = sh("launch", str(task), *args[1:], "--torch-index", torch_index(tmp_path), timeout=900)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    assert "copying the cloudtrain wheel" in launch.stderr
    assert "verify: ready" in launch.stderr
    for i in (0, 1):
        assert f"node {i}: workdir and setup in place while the bootstrap finishes" in (
            launch.stderr
        ), launch.stderr
    assert launch.stdout.count("Successfully installed tinyct-1.0") == 2, "once per node"
    assert launch.stdout.count("tinyct says 42") == 2, launch.stdout
    for i in (0, 1):
        venv = lab.home / ".cloudtrain" / name / f"node-{i}" / "venv"
        probe = "import cloudtrain, torch; print(cloudtrain.__file__)"
        done = subprocess.run([venv / "bin" / "python", "-c", probe], cwd=tmp_path,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(str(venv)), "cloudtrain is the venv's own copy"
    train = sh("train", "-c", name, str(SCRIPTS / "countdown.py"))
    assert train.returncode == 0, train.stdout + train.stderr
    down_leaves_nothing(sh, name, lab.home / ".cloudtrain" / name)  # its venv's processes too


def tiny_wheel(folder: Path) -> Path:
    """A one-module wheel (``tinyct``) that pip installs with no index and no build step."""
    import base64
    import hashlib
    import zipfile

    files = {
        "tinyct.py": "VALUE = 42\n",
        "tinyct-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinyct\nVersion: 1.0\n",
        "tinyct-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: cloudtrain-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    record = "".join(f"{n},{digest(t)},{len(t.encode())}\n" for n, t in files.items())
    files["tinyct-1.0.dist-info/RECORD"] = record + "tinyct-1.0.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "tinyct-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel
