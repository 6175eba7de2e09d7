"""A rank or its launcher killed by SIGKILL (the OOM killer's way) in a managed job on the
local provider: recovered without --retry-on-failure, from the newest checkpoint, and said so;
a real OOM kill where this machine lets a test give a cgroup a memory limit."""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import CLOUDTRAIN, REPO, SCRIPTS, Shell, wait_for

pytestmark = pytest.mark.integration
SCRIPT = SCRIPTS / "killed_once.py"
#: The memory limit of the real OOM test's cgroup: the CLI, the watcher, two torchrun agents
#: with torch imported and their ranks fit; the rank that takes memory does not.
LIMIT = 3 << 30


def managed(sh: Shell, cluster: str, *args: str, prefix: tuple[str, ...] = ()) -> str:
    done = subprocess.run([*prefix, *CLOUDTRAIN, "train", "-c", cluster, "--managed",
                           str(SCRIPT), "--", *args], env=sh.env, cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


@pytest.mark.parametrize(("flag", "who"), [((), "rank [01]"), (("--agent",), "its launcher")])
def test_a_rank_or_launcher_killed_by_sigkill_is_recovered_from_its_checkpoint(
    sh: Shell, tmp_path: Path, flag: tuple[str, ...], who: str
) -> None:
    assert sh("up", "--name", "k", "--nodes", "2").returncode == 0
    out = managed(sh, "k", "--marker", str(tmp_path / "killed"), *flag)
    said = re.search(r"recovery 1/3: node 1 exited (\d+): (.+) was killed by SIGKILL \((.+)\)",
                     out)  # fmt: skip
    assert said, out
    assert re.fullmatch(who, said.group(2)), out  # the rank on node 1: either, by rendezvous
    assert said.group(1) == ("137" if flag else "1"), "the shell's 128+9 for the launcher"
    resumed = [int(n) for n in re.findall(r"rank 0: resumed from step (\d+)", out)]
    assert resumed[0] == 0, out
    assert resumed[1] >= 5, out  # the checkpoint of step 5 or later
    assert "rank 1: done at step 12" in out
    job = sh.job("k-1")
    assert job["status"] == "succeeded"
    assert [(r["cause"], r["node"], r["replaced"]) for r in job["detail"]["recoveries"]] == [
        ("killed", 1, [])]  # fmt: skip
    assert "was killed by SIGKILL" in job["detail"]["recoveries"][0]["reason"]
    events = [e["message"] for e in sh.status()["events"]]
    assert any(re.search(f"{who} was killed by SIGKILL", m) for m in events), events
    assert sh.strays() == [], "the rank the killed launcher left is stopped"
    assert sh("down", "k").returncode == 0


def test_a_rank_that_exits_3_still_fails_the_managed_job(sh: Shell) -> None:
    assert sh("up", "--name", "x", "--nodes", "2").returncode == 0
    done = sh("train", "-c", "x", "--managed", str(SCRIPTS / "fail_on_node.py"))
    assert done.returncode == 1, done.stderr
    assert "recovery" not in done.stderr
    # torchrun's global ranks follow the rendezvous' order, not the node's index: either rank
    said = r"error: job x-1: failed: node 1 exited 1 \(rank [01] exited 3\)"
    assert re.search(said, done.stderr), done.stderr
    assert sh.job("x-1")["detail"]["cause"] == "exit"
    assert sh("down", "x").returncode == 0


@contextlib.contextmanager
def memory_limited(name: str, limit: int) -> Iterator[Path]:
    """A memory cgroup of this test's own below this process's, limited to `limit` bytes: its
    ``cgroup.procs``. Skips where none can be made (not root, no memory controller there)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if "memory" in line.split(":")[1].split(",")]
    v2 = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    if v1:
        folder, files = Path(f"/sys/fs/cgroup/memory{v1[0]}") / name, ["memory.limit_in_bytes"]
    elif v2 and Path("/sys/fs/cgroup/cgroup.controllers").exists():
        folder, files = Path(f"/sys/fs/cgroup{v2[0]}") / name, ["memory.max", "memory.swap.max"]
    else:
        pytest.skip("no memory cgroup here")
    try:
        folder.mkdir()
        for file in files:  # (v1 with swap: memory.memsw.limit_in_bytes too; none here)
            (folder / file).write_text(f"{limit if file != 'memory.swap.max' else 0}\n")
    except OSError as exc:
        with contextlib.suppress(OSError):
            folder.rmdir()
        pytest.skip(f"cannot make a memory cgroup with a limit here: {exc}")
    try:
        yield folder / "cgroup.procs"
    finally:
        wait_for(lambda: not (folder / "cgroup.procs").read_text().strip(), timeout=60,
                 what="the cgroup's processes to end")  # fmt: skip
        folder.rmdir()


def test_a_rank_the_oom_killer_killed_is_recovered_and_named(sh: Shell, tmp_path: Path) -> None:
    """A real OOM kill: the job runs in a cgroup with a memory limit, and rank 1 takes memory
    until the kernel kills it; the node's count of OOM kills says that was it."""
    assert sh("up", "--name", "o", "--nodes", "2").returncode == 0
    with memory_limited(f"cloudtrain-test-{tmp_path.name}", LIMIT) as procs_file:
        enter = ("sh", "-c", f'echo $$ > {procs_file} && exec "$@"', "sh")
        out = managed(sh, "o", "--marker", str(tmp_path / "hog"), "--oom", prefix=enter)
        assert sh("down", "o").returncode == 0  # nothing of the cluster is left in it
    assert re.search(r"rank [01]: taking memory", out), out  # node 1's rank: either
    assert re.search(r"recovery 1/3: node 1 exited 1: rank [01] was killed by SIGKILL "
                     r"\(out of memory: the kernel's OOM killer\)", out), out  # fmt: skip
    assert "rank 1: done at step 12" in out
