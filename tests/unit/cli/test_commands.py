"""The CLI's happy paths that need no real process: gpus, status, the import budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import Cli


def test_help_imports_no_torch_and_no_cloud_sdk() -> None:
    code = (
        "import sys\n"
        "from cloudtrain.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'boto3', 'botocore', 'google', 'azure', 'numpy', 'yaml')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout


def test_the_command_table_is_every_modules_commands_and_a_command_imports_only_its_own() -> None:
    import importlib

    from cloudtrain.cli.main import COMMAND_MODULES, command_of

    defined = {
        c.name: module
        for module in set(COMMAND_MODULES.values())
        for c in importlib.import_module(f"cloudtrain.cli.{module}").COMMANDS
    }
    assert defined == COMMAND_MODULES
    assert all(command_of(name) is not None for name in COMMAND_MODULES)
    assert command_of("nope") is None
    code = (
        "import sys\n"
        "from cloudtrain.cli.main import main\n"
        "try:\n    main(['status', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m.rsplit('.', 1)[1] for m in sys.modules"
        " if m.startswith('cloudtrain.cli.') and m.endswith('_cmd')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LOADED ['status_cmd']" in out.stdout, out.stdout  # its own, no other


def test_gpus_is_a_table_cheapest_first(run_cli: Cli) -> None:
    result = run_cli("gpus", "--provider", "aws", "--accelerator", "A100")
    assert result.exit_code == 0, result.output
    assert "p4d.24xlarge" in result.output
    assert "32.77" in result.output
    assert "p3.2xlarge" not in result.output
    every = run_cli("gpus").output
    assert every.index("n1-highmem-8+1xnvidia-tesla-v100") < every.index("p4de.24xlarge")
    assert "Standard_NC6s_v3" not in every
    assert "retired" in run_cli("gpus", "--all", "--provider", "azure").output


def test_status_json_lists_clusters_nodes_and_jobs(run_cli: Cli) -> None:
    assert run_cli("status").output.startswith("no clusters")
    assert run_cli("up", "--provider", "fake", "--name", "c1", "--nodes", "2").exit_code == 0
    data = json.loads(run_cli("status", "--json").output)
    assert [c["name"] for c in data["clusters"]] == ["c1"]
    assert [n["index"] for n in data["clusters"][0]["nodes"]] == [0, 1]
    assert data["clusters"][0]["spec"]["num_nodes"] == 2
    assert data["jobs"] == []
    table = run_cli("status").output
    assert "c1" in table
    assert "fake" in table
    assert "2/2" in table
    assert run_cli("down", "c1").exit_code == 0


def test_down_all_finds_recorded_and_tagged_clusters(run_cli: Cli, home: Path) -> None:
    assert run_cli("up", "--name", "l1").exit_code == 0
    assert run_cli("up", "--provider", "fake", "--name", "f1").exit_code == 0
    (home / "state.db").unlink()  # the state is lost: the local cluster is found by its tags
    for suffix in ("-wal", "-shm"):
        (home / f"state.db{suffix}").unlink(missing_ok=True)
    assert run_cli("up", "--name", "l2").exit_code == 0
    refused = run_cli("down", "--all")  # no terminal to say yes: nothing happens
    assert refused.exit_code == 2
    assert "nothing was torn down" in refused.output
    done = run_cli("down", "--all", "--yes")
    assert done.exit_code == 0, done.output
    assert "cluster l1 is down" in done.output
    assert "cluster l2 is down" in done.output
    assert not list((home / "local").glob("*/node-*"))
    fake = run_cli("down", "--all", "--yes", "--provider", "fake")
    assert "cluster f1 is down" in fake.output
    assert run_cli("down", "--all", "--yes").output.startswith("nothing to do")
    assert run_cli("down", "x", "--all").exit_code == 2
