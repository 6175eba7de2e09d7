"""Hostile or damaged input through the CLI as a subprocess: a host string that ssh or rsync
would read as an option never reaches them (`up` refuses it with one line and exit 2, runs
nothing on this machine, records nothing); a state row that is not JSON is one line, exit 4."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain import access
from cloudtrain.errors import ConfigError
from cloudtrain.executors.ssh import SshExecutor
from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration


def hostile(marker: Path) -> list[str]:
    """Users and addresses that would run `touch marker` here if ssh read them."""
    command = f"-oProxyCommand=touch {marker}"
    return [f"{command}@127.0.0.2", f"root@{command}", "-lroot@127.0.0.2"]


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_hostile_host_in_hosts_is_refused_and_runs_nothing(
    sh: Shell, tmp_path: Path, which: int
) -> None:
    marker = tmp_path / "pwned"
    host = hostile(marker)[which]
    done = sh("up", "--provider", "ssh", "--name", "lab", "--hosts", host, "--no-setup")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "is not a" in done.stderr
    assert not marker.exists()
    assert sh.status()["clusters"] == []


def test_a_hostile_user_in_an_inventory_is_refused_and_runs_nothing(
    sh: Shell, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(
        f"user: \"-oProxyCommand=sh -c 'touch {marker}'\"\nhosts:\n  - address: 127.0.0.2\n"
    )
    done = sh("up", "--provider", "ssh", "--name", "lab", "--inventory", str(inventory))
    assert done.returncode == 2, done.stderr
    assert f"{inventory}: hosts[0]: user" in done.stderr
    assert not marker.exists()
    assert sh.status()["clusters"] == []


@pytest.mark.parametrize(
    ("user", "host"),
    [("-oProxyCommand=x", "127.0.0.2"), ("root", "-oProxyCommand=x"), ("root", "a b")],
)
def test_no_executor_is_made_for_a_target_ssh_would_read_as_an_option(
    tmp_path: Path, user: str, host: str
) -> None:
    """The executor checks too (cloud nodes' addresses come from the cloud's answer)."""
    with pytest.raises(ConfigError, match="ssh target: "):
        SshExecutor(host, user=user, options=access.ssh_options(tmp_path, "c1"))


@pytest.mark.parametrize("column", ["spec_json", "plan_json"])
def test_a_state_row_that_is_not_json_is_one_line_and_exit_4(sh: Shell, column: str) -> None:
    import sqlite3

    assert sh("up", "--name", "c1", "--no-setup").returncode == 0
    with sqlite3.connect(sh.home / "state.db") as db:
        db.execute(f"UPDATE clusters SET {column} = ? WHERE name = 'c1'", ("{not json",))
    done = sh("status")
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "is damaged" in done.stderr
    assert "Traceback" not in done.stderr
    (sh.home / "state.db").unlink()
    assert sh("down", "c1").returncode == 0  # by tag: the local provider's folders


def test_a_script_in_the_home_folder_is_not_copied_with_the_home_folder(
    sh: Shell, tmp_path: Path
) -> None:
    home = tmp_path / "me"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("secret")
    (home / "train.py").write_text("print(1)\n")
    sh.env["HOME"] = str(home)
    assert sh("up", "--name", "c1", "--no-setup").returncode == 0
    done = sh("train", "-c", "c1", str(home / "train.py"))
    assert done.returncode == 2, done.stderr
    assert "pass --workdir with the project's folder" in done.stderr
    assert not list((sh.home / "local").rglob("credentials"))
    assert sh("down", "c1").returncode == 0


def test_control_sequences_a_node_prints_arrive_escaped(sh: Shell, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "noisy.py").write_text(
        "import sys\n"
        "sys.stdout.write('clip\\x1b]52;c;ZXZpbA==\\x07 title\\x1b]0;pwned\\x07 '\n"
        "                 'csi\\x9b2J end\\n')\n"
    )
    assert sh("up", "--name", "c1", "--no-setup").returncode == 0
    done = sh("train", "-c", "c1", "--nproc-per-node", "1", str(work / "noisy.py"))
    assert done.returncode == 0, done.stderr
    assert "\x1b]" not in done.stdout
    assert "\x9b" not in done.stdout
    assert "clip\\x1b]52;c;ZXZpbA==\\x07 title\\x1b]0;pwned\\x07 csi\\x9b2J end" in done.stdout
    assert sh("down", "c1").returncode == 0


def test_setup_runs_with_the_jobs_python_first_on_path(sh: Shell, tmp_path: Path) -> None:
    """`setup: pip install ...` must install where the job imports from: the node's Python
    (here this venv) comes first on PATH even when the caller's PATH does not have it."""
    import sys

    work = tmp_path / "proj"
    work.mkdir()
    (work / "ok.py").write_text("print('job ran')\n")
    (work / "task.yaml").write_text(
        "name: setupenv\nworkdir: .\nrun: ok.py\n"
        'setup: python -c \'import sys; print("prefix", sys.prefix)\'; echo "venv=$VIRTUAL_ENV"\n'
    )
    sh.env["PATH"] = "/usr/bin:/bin"
    done = sh("launch", str(work / "task.yaml"), "--down")
    assert done.returncode == 0, done.stderr
    assert f"prefix {sys.prefix}" in done.stdout
    assert "job ran" in done.stdout
    if Path(sys.prefix, "pyvenv.cfg").is_file():
        assert f"venv={Path(sys.prefix).resolve()}" in done.stdout


def alias_bomb(levels: int = 9) -> str:
    """A task file of a few hundred bytes whose aliases expand to 9**levels nodes."""
    keys = "abcdefghi"
    lines = ["name: bomb", "envs:", "  L0: &l0 {" + ", ".join(f"{k}: 1" for k in keys) + "}"]
    for n in range(1, levels):
        refs = ", ".join(f"{k}: *l{n - 1}" for k in keys)
        lines.append(f"  L{n}: &l{n} {{{refs}}}")
    return "\n".join(lines) + "\n"


def test_a_task_file_of_nested_aliases_is_one_line_not_a_hang(sh: Shell, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(alias_bomb())
    assert len(task.read_bytes()) < 1000
    done = sh("up", str(task), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: {task}:3: envs.L0 must be a string or number"
    assert sh.status()["clusters"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["down", "../../victim"], "cluster '../../victim' is not a valid cluster name"),
        (["down", "../../victim", "--forget"], "is not a valid cluster name"),
        (["status", "-c", "../../victim"], "is not a valid cluster name"),
        (["train", "-c", "../../victim", "x.py"], "is not a valid cluster name"),
        (["logs", "../../victim-1"], "job id '../../victim-1' is not a job id"),
        (["cancel", "x-1; touch pwned"], "is not a job id"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " not in v else None,
)
def test_a_name_that_is_no_name_is_refused_by_every_command(
    sh: Shell, tmp_path: Path, args: list[str], message: str
) -> None:
    """`down ../../victim` once deleted <home>/local/../../victim; every command that takes a
    cluster name or a job id checks it the one way `up` does, before anything reads it."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    done = sh(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
    assert (victim / "precious").read_text() == "keep"
    assert not (sh.home / "state.db").exists(), "refused before the state was opened"
