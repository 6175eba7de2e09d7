"""The slurm provider against the lab, where it must refuse or give up: each bad request is one
line naming what was wrong, a non-zero exit, and nothing left (no job in the queue, no record,
no folder); two `up`s of one name make one allocation; another owner's is never touched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.errors import NodeDataError
from cloudtrain.providers.slurm.provider import SlurmProvider
from cloudtrain.provision.provider import ProviderContext
from tests.integration.conftest import Shell
from tests.slurm.fixtures import LoginNode
from tests.slurmlab import SlurmLab
from tests.sshd import keygen

pytestmark = pytest.mark.integration


def nothing_left(sh: Shell, slurm: SlurmLab, shared: Path, *, queue: list[str]) -> None:
    assert slurm.queue() == queue
    assert sh.status()["clusters"] == []
    assert not shared.exists() or list(shared.iterdir()) == []


def up(sh: Shell, shared: Path, name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return sh("up", "--provider", "slurm", "--shared-dir", str(shared), "--name", name, *flags)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal says (`up` says "Bringing up …" on stderr before it)."""
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--partition", "nope"], "sbatch refused the allocation: Invalid partition name"),
        (["--gpus", "A100:9"], "Requested node configuration is not available"),
        # Slurm says either, by when its scheduler first looks at the job (PartitionNodeLimit or
        # PartitionTimeLimit, else PartitionConfig)
        (["--nodes", "3"], "more nodes than the partition allows|the partition cannot give it"),
        (["--time", "3:00:00"], "beyond the partition's MaxTime|the partition cannot give it"),
        (["--time", "soon"], "--time 'soon': give minutes, HH:MM:SS or D-HH:MM:SS"),
        (["--partition", "gpu;rm"], "--partition 'gpu;rm': letters, digits and _.+- only"),
        (["--login", "-oProxyCommand=id@h"], "user '-oProxyCommand=id' is not a user name"),
        (["--login", "me@login", "--identity", "/no/key"], "--identity '/no/key' is not a file"),
        (["--identity", "/no/key"], "--identity: only for a login node over SSH"),
        (["--partition", "gpu\n"], "--partition 'gpu\\n': letters, digits and _.+- only"),
        (["--account", "-x"], "--account '-x': letters, digits and _.+- only"),
        (["--qos", "../q"], "--qos '../q': letters, digits and _.+- only"),
        (["--time", "30\n"], "--time '30\\n': give minutes"),
    ],
)
def test_a_request_slurm_cannot_give_is_one_line_and_leaves_nothing(
    slurm: SlurmLab, slurm_sh: Shell, tmp_path: Path, flags: list[str], said: str
) -> None:
    shared = tmp_path / "shared"
    done = up(slurm_sh, shared, "bad", "--nodes", "2", *flags)
    assert done.returncode != 0
    line = error_line(done)
    assert any(one in line for one in said.split("|")), line
    nothing_left(slurm_sh, slurm, shared, queue=[])


def test_an_allocation_pending_past_wait_is_cancelled_naming_slurms_reason(
    slurm: SlurmLab, slurm_sh: Shell, tmp_path: Path
) -> None:
    holder = slurm.submit("--nodes=2", "--exclusive", "--wrap", "sleep 300")
    slurm.wait_state(holder, "RUNNING")
    shared = tmp_path / "shared"
    done = up(slurm_sh, shared, "late", "--nodes", "1", "--wait", "4")
    assert done.returncode != 0
    line = error_line(done)
    assert "still pending after 4 s (Slurm's reason: Resources); cancelled" in line, line
    assert "is pending (Resources" in done.stderr, "the reason is shown while it waits"
    assert re.search(r"Slurm expects it to start at \d{4}-\d\d-\d\dT", done.stderr), done.stderr
    nothing_left(slurm_sh, slurm, shared, queue=[holder])


def test_two_ups_of_one_name_make_one_allocation_and_another_owner_cannot_touch_it(
    slurm: SlurmLab, slurm_sh: Shell, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    up = ["up", "--provider", "slurm", "--shared-dir", str(shared), "--name", "one", "--nodes", "1"]
    first, second = slurm_sh.popen(*up), slurm_sh.popen(*up)
    outs = [p.communicate(timeout=180)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    [job] = slurm.queue()

    other = Shell(tmp_path / "other-home")
    other.env.update({**slurm.client_env, "CLOUDTRAIN_OWNER": "someone-else"})
    where = ["--provider", "slurm", "--shared-dir", str(shared)]
    taken = other(*up)
    assert taken.returncode != 0
    assert f"Slurm job {job} has that name" in error_line(taken)
    assert other("down", "--all", *where).returncode == 0
    assert other("down", "one", *where).returncode == 0
    assert slurm.queue() == [job], "another owner's down leaves it"
    assert (shared / "one").is_dir()

    assert slurm_sh("down", "one", *where).returncode == 0
    assert slurm.queue() == []
    assert not (shared / "one").exists()
    assert slurm.job_processes() == []
    assert os.environ.get("CLOUDTRAIN_OWNER") != "someone-else"


@pytest.mark.parametrize("fault", ["unreachable", "another host key"])
def test_a_login_node_that_cannot_be_reached_or_trusted_is_one_line_and_leaves_nothing(
    slurm: SlurmLab, slurm_sh: Shell, slurm_login: LoginNode, tmp_path: Path, fault: str
) -> None:
    login = slurm_login.args()
    if fault == "unreachable":
        slurm_login.host.cut()
        said = f"cannot reach root@{slurm_login.host.host}"
    else:
        other = tmp_path / "other_key"
        keygen(other)
        known = slurm_login.known_hosts
        known.write_text(f"{slurm_login.host.address} {other.with_suffix('.pub').read_text()}")
        said = "did not present the login node's host key pinned in --known-hosts"
    done = slurm_sh("up", "--provider", "slurm", *login, "--name", "far", "--nodes", "1")
    assert done.returncode != 0
    assert said in error_line(done)
    assert slurm.queue() == []
    assert slurm_sh.status()["clusters"] == []
    assert not (slurm_login.host.home / ".cloudtrain").exists()


def test_nodes_that_do_not_see_the_login_nodes_folder_get_folders_of_their_own_and_keep_nothing(
    slurm: SlurmLab,
    slurm_sh: Shell,
    slurm_login_apart: LoginNode,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A login node whose home no node sees (a site without a shared home): each node's folder
    is its own, at the same path; the workdir travels through a step, what comes back from a
    node is checked (a link is not followed), and when the allocation ends nothing of it is
    left on any node or on the login node."""
    login = slurm_login_apart.args()
    shape = ["--python", sys.executable, "--name", "apart", "--nodes", "2"]
    done = slurm_sh("up", "--provider", "slurm", *login, *shape, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = slurm_login_apart.shell("cd ~/.cloudtrain/slurm/apart && ls")
    assert seen.split() == ["facts-0.json", "facts-1.json", "layout.json", "owner.json"], seen
    layout = json.loads(slurm_login_apart.shell("cat ~/.cloudtrain/slurm/apart/layout.json"))
    [job] = slurm.queue()
    assert layout == {"shared": False, "nodes": {f"{job}/n1": 0, f"{job}/n2": 1}}
    nodes = slurm_login_apart.host.home / ".cloudtrain" / "slurm" / "apart"  # as the nodes see it
    assert (nodes / "node-1" / "bootstrap" / "status.json").is_file()
    assert not (nodes / "owner.json").exists()

    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("from the workdir\n")
    (work / "show.py").write_text(
        "import os\nprint(os.environ['RANK'], open('data.txt').read().strip(), flush=True)\n"
    )
    train = slurm_sh("train", "-c", "apart", str(work / "show.py"), timeout=180)
    assert train.returncode == 0, train.stdout + train.stderr
    assert re.search(r"\[node 1\].* from the workdir", train.stdout), train.stdout

    options = {"login": login[1], "identity": login[3], "known_hosts": login[5],
               "python": sys.executable}  # fmt: skip
    provider = SlurmProvider(ProviderContext(slurm_sh.home, options))
    node = provider.describe("apart")[1]
    ex = provider.executor(node)
    try:
        given = nodes / "node-1" / "given"
        given.mkdir()
        (given / "saved.pt").write_text("weights")
        (given / "secret").symlink_to(tmp_path / "outside")
        (tmp_path / "outside").write_text("not the node's")
        assert ex.get(str(given), tmp_path / "got")
        assert sorted(p.name for p in (tmp_path / "got").iterdir()) == ["saved.pt"]
        assert not ex.get(str(nodes / "node-1" / "none"), tmp_path / "none")
        (given / "huge.pt").write_bytes(b"x" * 200_000)  # past the limit, headers and all
        monkeypatch.setenv("CLOUDTRAIN_MAX_PULL_GB", "0.0001")  # 100 kB
        with pytest.raises(NodeDataError, match=r"passed 0\.0001 GB"):
            ex.get(str(given), tmp_path / "got")
        assert sorted(p.name for p in (tmp_path / "got").iterdir()) == ["saved.pt"], "as it was"
    finally:
        ex.close()

    down = slurm_sh("down", "apart", "--provider", "slurm", *login)
    assert down.returncode == 0, down.stdout + down.stderr
    assert slurm.queue() == []
    assert not nodes.exists(), "the hosts removed the nodes' own folders"
    left = slurm_login_apart.shell("ls -A ~/.cloudtrain/slurm; echo end")
    assert left == "end\n", "no folder left on the login node either"


def test_a_slurm_that_does_not_answer_is_one_line_before_anything_is_recorded(
    slurm: SlurmLab, slurm_sh: Shell, tmp_path: Path
) -> None:
    """munge down (here: its socket not where the config says): Slurm's clients cannot
    authenticate, and `up` stops at its plan, with no record for `down` to chase."""
    conf = tmp_path / "munge-down.conf"
    said = slurm.conf.read_text()
    assert str(slurm.munge_socket) in said
    conf.write_text(said.replace(str(slurm.munge_socket), str(tmp_path / "gone.sock")))
    slurm_sh.env["SLURM_CONF"] = str(conf)
    done = up(slurm_sh, tmp_path / "shared", "deaf", "--nodes", "1")
    assert done.returncode != 0
    assert "slurm: Unreachable: squeue:" in error_line(done)
    assert slurm_sh.status()["clusters"] == []
    assert not (tmp_path / "shared").exists()

    del slurm_sh.env["SLURM_CONF"]  # no Slurm at all where the commands run (a laptop)
    done = up(slurm_sh, tmp_path / "shared", "deaf", "--nodes", "1")
    assert done.returncode != 0
    said = "squeue finds no Slurm cluster where it runs (no slurm.conf, no configless slurmctld)"
    assert said in error_line(done)
    assert slurm_sh.status()["clusters"] == []
