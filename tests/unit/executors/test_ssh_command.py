"""The script an SshExecutor sends on ssh's stdin: every value quoted, no name the shell would
read as code, and nothing of it in any command line."""

from __future__ import annotations

import subprocess

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.executors.ssh import REMOTE_SHELL, remote_script


def test_the_script_runs_argv_with_env_in_cwd_as_given() -> None:
    script = remote_script(["sh", "-c", 'echo "$A|$(pwd)"'], {"A": "x y;$(id)\n'"}, cwd="/")
    done = subprocess.run(REMOTE_SHELL.split(), input=script, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "x y;$(id)\n'|/\n")


def test_the_exit_code_is_the_commands_and_a_missing_cwd_stops_it() -> None:
    def run(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(REMOTE_SHELL.split(), input=script, capture_output=True, text=True)

    assert run(remote_script(["sh", "-c", "exit 7"])).returncode == 7
    missing = run(remote_script(["touch", "never"], cwd="/no/such/folder"))
    assert missing.returncode == 1


def test_the_command_gets_no_input_but_dev_null() -> None:
    script = remote_script(["cat"]) + "echo this line must not reach cat\n"
    done = subprocess.run(REMOTE_SHELL.split(), input=script, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "")


@pytest.mark.parametrize("name", ["--split-string=sh", "-i", "A B", "1A", "A=B", "", "A;id"])
def test_a_name_the_shell_would_misread_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="is not a valid environment variable name"):
        remote_script(["true"], {name: "1"})


@pytest.mark.parametrize(
    "given",
    [
        "#!/bin/bash\necho $HOME `id` $(date) '\"\n\n",
        "EOF\nCLOUDTRAIN_STDIN\n'quoted'\n",  # lines that look like an end word
        '{"env": {"A": "x\\ny"}}\n',
        "",
    ],
)
def test_stdin_reaches_the_command_as_given_and_nothing_after_it(given: str) -> None:
    script = remote_script(["cat"], stdin=given) + "echo this line must not reach cat\n"
    done = subprocess.run(REMOTE_SHELL.split(), input=script, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, given)


def test_stdin_without_a_last_newline_gets_one() -> None:
    script = remote_script(["cat"], stdin="no newline")
    done = subprocess.run(REMOTE_SHELL.split(), input=script, capture_output=True, text=True)
    assert done.stdout == "no newline\n"
