"""Bad input: a clear message naming the field, the value and what is allowed; exit 2;
nothing created (no cluster recorded, no node folder, no fake-cloud request)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.providers.fake.provider import _CLOUDS
from tests.conftest import Cli


def nothing_created(home: Path) -> bool:
    local = home / "local"
    db = home / "state.db"
    if db.exists():
        from cloudtrain.state import State

        with State.open(home) as state:
            if state.clusters():
                return False
    cloud = _CLOUDS.get(home)
    return (not local.exists() or not any(local.iterdir())) and (
        cloud is None or not cloud.requests
    )


GCP_A100 = ["up", "-n", "x", "-p", "gcp", "--gpus", "A100:8", "--ssh-cidr", "10.0.0.0/8"]

CASES = [
    (["up", "--name", "x", "--nodes", "0"], "num_nodes 0 is out of range; allowed: 1 to 1024"),
    (["up", "--name", "x", "--nodes", "-3"], "num_nodes -3 is out of range"),
    (["up", "--name", "x", "--nodes", "two"], "num_nodes 'two' is not a whole number"),
    (["up", "--name", "x", "--provider", "aws", "--gpus", "Z100:2"], "unknown accelerator 'Z100'"),
    (
        ["up", "--name", "x", "--provider", "aws", "--gpus", "A100:0"],
        "the GPU count must be at least 1",
    ),
    (
        ["up", "--name", "x", "--provider", "aws", "--gpus", "A100:3"],
        "aws offers A100 only with 8 GPUs per node",
    ),
    (
        ["up", "--name", "x", "--provider", "aws", "--gpus", "V100:2"],
        "aws offers V100 with 1, 4 or 8 GPUs per node; V100:2 is offered by gcp",
    ),
    (
        ["up", "--name", "x", "--provider", "azure", "--gpus", "V100:1"],
        "azure retired Standard_NC6s_v3 (V100:1) on 2025-09-30",
    ),
    (["up", "--name", "x", "--provider", "nimbus"], "provider 'nimbus' is not a known provider"),
    (
        ["up", "--name", "x", "--provider", "gcp", "--gpus", "A100:8", "--max-hours", "0"],
        "max_hours '0': give hours above 0 (0.01 is 36 s) and at most 2880 (120 days)",
    ),
    (
        ["up", "--name", "x", "--provider", "ssh", "--inventory", "no/such/inventory.yaml"],
        "--inventory 'no/such/inventory.yaml'",
    ),
    (
        ["up", "--name", "x", "--provider", "aws", "--gpus", "A100:8", "--ssh-cidr", "nowhere"],
        "--ssh-cidr 'nowhere' is not an address or network",
    ),
    (
        ["up", "--name", "x", "--provider", "aws", "--gpus", "A100:8"],
        "cannot find this machine's public address to allow SSH from; pass --ssh-cidr",
    ),
    (
        ["up", "--name", "x", "--provider", "local", "--gpus", "A100:8"],
        "provider 'local' takes no --gpus (got 'A100:8')",
    ),
    (
        ["up", "--name", "x", "--provider", "any"],
        "provider 'any' chooses among the clouds' GPU machines: give resources.accelerator",
    ),
    (
        ["up", "--name", "x", "--gpus", "A100:8", "--max-price", "20"],
        "--max-price 20: the cheapest offer of A100:8 is aws us-east-1 (p4d.24xlarge) at "
        "$32.77/node-hour; raise it",
    ),
    *(
        (
            ["up", "--name", "x", "--gpus", "V100:1", "--max-price", bad],
            f"--max-price {bad!r} is not a price; allowed: a positive number of USD per node-hour",
        )
        for bad in ("cheap", "0", "-1", "nan", "inf")
    ),
    (
        ["up", "--name", "x", "--provider", "ssh", "--hosts", "u@h1", "--max-price", "3"],
        "--max-price: provider 'ssh' has no prices in the catalog; clouds that do: aws, azure, gcp",
    ),
    (
        ["up", "--name", "x", "--spot"],
        "provider 'local' takes no --spot (got True); drop it, or choose a provider that "
        "does: aws, azure, gcp",
    ),
    (
        ["up", "--name", "x", "--provider", "ssh", "--hosts", "u@h1", "--region", "r1"],
        "provider 'ssh' takes no --region (got 'r1')",
    ),
    (
        ["up", "--name", "x", "--provider", "gcp", "--gpus", "A100:8", "--profile", "dev"],
        "--profile is an option of aws, not of provider 'gcp'; gcp takes: --project, --network",
    ),
    (["up", "--name", "x", "-o", "nope=1"], "provider 'local' has no option 'nope'"),
    (
        ["down", "x", "--provider", "azure", "--project", "p1"],
        "--project is an option of gcp, not of provider 'azure'; azure takes: --subscription",
    ),
    (
        ["train", "-c", "x", "--env", "--split-string=sh=1", "examples/digits_ddp.py"],
        "'--split-string' is not a valid environment variable name",
    ),
    *(
        ([*GCP_A100, "--max-hours", bad], f"max_hours {bad!r}: give hours above 0")
        for bad in ("nan", "inf", "1e3", "5\n", "-1")
    ),
    *(
        (["up", "--name", "x", flag, "0"], f"{field} '0': give")
        for flag, field in (("--idle-minutes", "idle_minutes"), ("--max-cost", "max_cost"))
    ),
    (["up", "--name", "x", "--max-cost", "5"], "--max-cost 5: a local cluster has no price"),
    (["up", "--name", "x", "--down-when-idle"], "down_when_idle needs idle_minutes"),
    (
        ["up", "--name", "x", "--provider", "fake", "--idle-minutes", "5"],
        "provider 'fake' takes no --idle-minutes (got 5.0); drop it, or choose a provider "
        "that does: aws, azure, gcp, kubernetes, local, slurm, ssh",
    ),
    (["up", "--name", "de\x1b]0;x\x07mo"], "name 'de\\x1b]0;x\\x07mo' is not a valid"),
    (
        [*GCP_A100, "--network", "../../projects/other/global/networks/x"],
        "--network '../../projects/other/global/networks/x' is not a GCE network name",
    ),
    (["up", "--name", "Demo"], "name 'Demo' is not a valid cluster name"),
    (["up", "--name", "my cluster"], "name 'my cluster' is not a valid cluster name"),
    (["up", "--name", "a" * 64], "is not a valid cluster name: use 1 to 40 characters"),
    (["up", "--nodes", "2"], "name None is not a valid cluster name"),
    (
        ["train", "-c", "nosuchcluster", "examples/digits_ddp.py"],
        "no cluster named 'nosuchcluster'",
    ),
    (["train", "-c", "x", "no/such/script.py"], "script 'no/such/script.py' does not exist"),
    (["train", "examples/digits_ddp.py"], "which cluster? pass --cluster"),
    (["train", "-c", "x", "--env", "NOEQUALS", "examples/digits_ddp.py"], "--env 'NOEQUALS'"),
    (
        ["train", "-c", "x", "--max-recoveries", "2", "examples/digits_ddp.py"],
        "--max-recoveries is for a managed job: add --managed",
    ),
    (
        ["train", "-c", "x", "--retry-on-failure", "examples/digits_ddp.py"],
        "--retry-on-failure is for a managed job: add --managed",
    ),
    (
        ["train", "-c", "x", "--managed", "--max-recoveries", "-1", "examples/digits_ddp.py"],
        "Invalid value for '--max-recoveries'",
    ),
    (["train", "-c", "x", "--nodes", "3:2", "examples/digits_ddp.py"], "--nodes '3:2': write"),
    (["train", "-c", "x", "--nodes", "0", "examples/digits_ddp.py"], "--nodes '0': write"),
    (
        ["train", "-c", "x", "--detach", "--down", "examples/digits_ddp.py"],
        "or add --managed: its watcher tears the cluster down when the job ends",
    ),
    (["jobs", "watch", "../x-1"], "job id '../x-1' is not a job id"),
    (["jobs", "watch", "nosuch-3"], "no job 'nosuch-3'"),
    (["logs", "nope-1"], "no job 'nope-1'"),
    (["cancel", "nope-1"], "no job 'nope-1'"),
    (["gpus", "--accelerator", "Z100"], "unknown accelerator 'Z100'"),
    (["gpus", "--provider", "awz"], "did you mean 'aws'"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(c[0])[:50] for c in CASES])
def test_bad_flags_exit_2_and_create_nothing(
    run_cli: Cli, home: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert nothing_created(home)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CLOUDTRAIN_PARALLEL", "abc", "CLOUDTRAIN_PARALLEL='abc': use a positive whole number"),
        ("CLOUDTRAIN_LOCK_TIMEOUT_S", "nan", "CLOUDTRAIN_LOCK_TIMEOUT_S 'nan' is not a number"),
    ],
)
def test_a_bad_knob_is_refused_before_anything_is_made(
    run_cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str,
    message: str,
) -> None:  # fmt: skip
    monkeypatch.setenv(variable, value)
    result = run_cli("up", "--name", "x", "--nodes", "2")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert nothing_created(home)


def test_a_bad_azure_poll_interval_is_refused_before_any_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cloudtrain.errors import ConfigError
    from cloudtrain.provision import registry
    from cloudtrain.provision.provider import ProviderContext

    monkeypatch.setenv("CLOUDTRAIN_AZURE_POLL_S", "soon")
    with pytest.raises(ConfigError, match="CLOUDTRAIN_AZURE_POLL_S 'soon' is not a number"):
        registry.create("azure", ProviderContext(home=tmp_path, options={"subscription": "s"}))


def test_yaml_errors_name_file_and_line(run_cli: Cli, home: Path, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("name: t1\nprovider: local\nnum_node: 2\n")
    result = run_cli("up", str(task))
    assert result.exit_code == 2
    assert f"{task}:3: unknown field 'num_node' — did you mean 'num_nodes'?" in result.output

    task.write_text("name: t1\nresources: [a,\n")
    result = run_cli("launch", str(task))
    assert result.exit_code == 2
    assert f"{task}:" in result.output
    assert "invalid YAML" in result.output
    assert nothing_created(home)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("checkpoint: zz://ckpts/runs", "checkpoint 'zz://ckpts/runs': no provider keeps"),
        (
            "checkpoint: s3://my_bucket",
            "checkpoint 's3://my_bucket': 'my_bucket' is not an S3 bucket",
        ),
        ("checkpoint_keep: 0", "checkpoint_keep 0 is not allowed; use a whole number of 1 or more"),
    ],
)
@pytest.mark.parametrize("command", ["launch", "train"])
def test_bad_checkpoint_fields_in_a_task_file_exit_2_before_anything_runs(
    run_cli: Cli, home: Path, tmp_path: Path, command: str, field: str, message: str
) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(f"name: t1\nprovider: local\nrun: train.py\n{field}\n")
    args = [command, str(task)] if command == "launch" else [command, "-c", "t1", str(task)]
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert f"{task}:4: {message}" in result.output
    assert nothing_created(home)


def test_up_of_an_existing_name_with_another_spec_is_refused(run_cli: Cli, home: Path) -> None:
    assert run_cli("up", "--provider", "fake", "--name", "same", "--nodes", "2").exit_code == 0
    result = run_cli("up", "--provider", "fake", "--name", "same", "--nodes", "3")
    assert result.exit_code == 2
    assert "cluster 'same' exists with a different spec (num_nodes: 2 → 3)" in result.output
    assert len(_CLOUDS[home].live("same")) == 2
    again = run_cli("up", "--provider", "fake", "--name", "same", "--nodes", "2")
    assert again.exit_code == 0  # the same spec: idempotent
    assert len(_CLOUDS[home].live("same")) == 2
    assert run_cli("down", "same").exit_code == 0
    assert _CLOUDS[home].live() == []


def test_down_of_an_unknown_cluster_is_nothing_to_do(run_cli: Cli) -> None:
    result = run_cli("down", "nosuchcluster")
    assert result.exit_code == 0
    assert "nothing to do: no cluster named 'nosuchcluster'" in result.output


def test_dry_run_prints_the_plan_and_creates_nothing(run_cli: Cli, home: Path) -> None:
    """(The clouds' dry runs read their APIs: tests/<cloud>/test_cli.py.)"""
    local = run_cli("up", "--name", "d", "--nodes", "2", "--dry-run")
    assert local.exit_code == 0
    assert "$0.00/h" in local.output
    assert nothing_created(home)


def test_forget_refuses_a_cluster_that_still_has_nodes(run_cli: Cli, home: Path) -> None:
    assert run_cli("up", "--provider", "fake", "--name", "kept", "--nodes", "2").exit_code == 0
    refused = run_cli("down", "kept", "--forget")
    assert refused.exit_code == 2
    assert "cluster 'kept' still has 2 node(s) on fake; `cloudtrain down kept` removes them" in (
        refused.output
    )
    assert run_cli("down", "nosuch", "--forget").exit_code != 0
    assert run_cli("down", "kept").exit_code == 0
