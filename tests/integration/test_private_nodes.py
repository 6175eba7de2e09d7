"""What cloudtrain puts on a node is the node user's alone, and what holds credentials never
gets there: over a real sshd host and on the local provider, a job whose workdir holds the
secret files users keep (and cloudtrain's own home) runs, none of them arrives, the CLI names
what it left out, and on the ssh host nothing cloudtrain wrote is readable by another user."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.node import procs
from tests.conftest import require_tool
from tests.integration.conftest import Shell
from tests.sshd import Lab

pytestmark = pytest.mark.integration

#: the secret files of issue 27 and a few more, as a user's workdir holds them
SECRETS = [
    ".huggingface/token",
    ".config/gh/hosts.yml",
    ".pypirc",
    ".npmrc",
    "certs/server.key",
    "terraform.tfstate",
    "prod.tfvars",
    ".vault-token",
    ".boto",
    ".s3cfg",
    "kubeconfig",
    ".envrc",
    ".dockercfg",
    ".kaggle/kaggle.json",
    ".databrickscfg",
    ".my.cnf",
    ".env",
]
TOKEN = "tok-" + uuid.uuid4().hex
JOB = """\
import os
from pathlib import Path

if os.environ.get("RANK") == "0":
    Path("output.txt").write_text("the job's own output\\n")
    print("token arrived" if os.environ.get("API_TOKEN") == "{token}" else "no token", flush=True)
"""
TASK = f"""\
name: private
num_nodes: 1
workdir: .
run: job.py
envs:
  API_TOKEN: "{TOKEN}"
"""


def workdir(root: Path) -> Path:
    """The job's folder: its script and task file, every secret file, and (as the caller
    makes it) cloudtrain's home below it."""
    (root / "job.py").parent.mkdir(parents=True, exist_ok=True)
    (root / "job.py").write_text(JOB.format(token=TOKEN))
    (root / "task.yaml").write_text(TASK)
    for rel in SECRETS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"secret of {rel}\n")
    return root


def trains(sh: Shell, cluster: str, work: Path) -> str:
    """`train` the task; its stderr, after checking the job ran and what the CLI said."""
    done = sh("train", "-c", cluster, str(work / "task.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "token arrived" in done.stdout
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("left out of the sync"))
    for rel in [*SECRETS, "state/home (cloudtrain's home)"]:
        top = rel.split("/")[0] if rel.startswith((".huggingface", ".config", ".kaggle")) else rel
        assert top in line, (top, line)
    assert done.stderr.index(line) < done.stderr.index("syncing "), "said before the sync"
    return done.stderr


def arrived(node_workdir: Path) -> set[str]:
    return {p.relative_to(node_workdir).as_posix() for p in node_workdir.rglob("*") if p.is_file()}


def test_local_nodes_get_no_secret_and_no_home(tmp_path: Path) -> None:
    work = workdir(tmp_path / "project")
    sh = Shell(work / "state" / "home")  # the home inside the workdir: once a loop to itself
    try:
        up = sh("up", "--provider", "local", "--nodes", "1", "--name", "loc")
        assert up.returncode == 0, up.stdout + up.stderr
        trains(sh, "loc", work)
        (node_workdir,) = (sh.home / "local" / "loc").glob("node-*/workdir")
        assert arrived(node_workdir) == {"job.py", "task.yaml", "output.txt"}
    finally:
        sh("down", "loc")
        procs.kill_matching({"CLOUDTRAIN_HOME": str(sh.home)}, grace_s=2)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    built = Lab(tmp_path / "lab", addresses=(4,))
    yield built
    built.stop()


def open_modes(root: Path) -> list[str]:
    """What under `root` (itself included) its group or others may read, write or enter. A
    file gone between the listing and its look (an agent's beat, written beside and renamed
    into place while the nodes run) is passed over."""
    found = []
    for p in [root, *root.rglob("*")]:
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
            found.append(f"{stat.S_IMODE(st.st_mode):04o} {p}")
    return found


def read_as_nobody(path: Path) -> subprocess.CompletedProcess[str]:
    """`cat` of `path` by the host's `nobody`, who reaches it through a hard link in a folder
    anyone may enter: only the file's own mode decides (the host user's home is 0700 here)."""
    runuser = require_tool("runuser")
    peek = Path(tempfile.mkdtemp(prefix="ct-peek-"))
    try:
        peek.chmod(0o711)
        link = peek / path.name
        os.link(path, link)
        return subprocess.run(
            [runuser, "-u", "nobody", "--", "cat", str(link)],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        for child in peek.iterdir():
            child.unlink()
        peek.rmdir()


def test_ssh_nodes_keep_it_private_and_get_no_secret(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"prv{uuid.uuid4().hex[:8]}"
    work = workdir(tmp_path / "project")
    sh = Shell(work / "state" / "home")
    top = lab.home / ".cloudtrain"
    top.mkdir(exist_ok=True)
    top.chmod(0o755)  # as an older cloudtrain left it
    try:
        up = sh(*lab.up_args(name))
        assert up.returncode == 0, up.stdout + up.stderr
        trains(sh, name, work)
        root = top / name / "node-0"
        assert arrived(root / "workdir") == {"job.py", "task.yaml", "output.txt"}
        (log,) = [p for p in root.rglob("node.log") if "bootstrap" not in p.parts]
        assert open_modes(top / name) == [], "every file 0600 and every folder 0700"
        assert stat.S_IMODE(top.stat().st_mode) == 0o700
        for secret in (root / "workdir" / "task.yaml", log):
            assert TOKEN in secret.read_text() or secret == log
            peek = read_as_nobody(secret)
            assert peek.returncode != 0, f"nobody read {secret}"
            assert "Permission denied" in peek.stderr, peek.stderr
    finally:
        sh("down", name)
        with contextlib.suppress(Exception):
            procs.kill_matching({"CLOUDTRAIN_CLUSTER": name}, grace_s=2)
