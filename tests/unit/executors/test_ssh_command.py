"""The one shell line an SshExecutor sends: every value quoted, `env` told where its options
end, and no name that `env` would read as an option or as the command."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.executors.ssh import remote_command


def test_the_line_runs_argv_with_env_in_cwd_as_given(tmp_path: object) -> None:
    line = remote_command(["sh", "-c", 'echo "$A|$(pwd)"'], {"A": "x y;$(id)"}, cwd="/")
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert done.stdout == "x y;$(id)|/\n"
    assert shlex.split(line)[3] == "env"
    assert shlex.split(line)[4] == "--"


@pytest.mark.parametrize("name", ["--split-string=sh", "-i", "A B", "1A", "A=B", ""])
def test_a_name_env_would_misread_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="is not a valid environment variable name"):
        remote_command(["true"], {name: "1"})
