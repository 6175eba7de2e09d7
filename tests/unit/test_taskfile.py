"""Task files: real YAML files in tmp_path, read into a TaskSpec or a `file:line` error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.spec import Resources, SpecError, taskfile

VALID = """\
name: bert-large
provider: fake
num_nodes: 2
resources:
  spot: true
  region: us-east-1
  disk_gb: 500
workdir: src
setup: pip install -r requirements.txt
run: |
  torchrun train.py --epochs 3
envs:
  EPOCHS: 3
  DEBUG: true
  LR: 0.001
  EMPTY:
"""


def write(tmp_path: Path, text: str, name: str = "task.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path, **overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        taskfile.load(path, overrides=overrides or None)
    return str(info.value)


def test_valid_file_round_trips(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    task = taskfile.load(write(tmp_path, VALID))

    assert task.cluster.name == "bert-large"
    assert task.cluster.provider == "fake"
    assert task.cluster.num_nodes == 2
    assert task.cluster.resources == Resources(spot=True, region="us-east-1", disk_gb=500)
    assert task.workdir == (tmp_path / "src").resolve()
    assert task.setup == "pip install -r requirements.txt"
    assert task.run == "torchrun train.py --epochs 3\n"
    assert dict(task.envs) == {"EPOCHS": "3", "DEBUG": "true", "LR": "0.001", "EMPTY": ""}


def test_the_limits_come_from_the_file_and_a_flag_overrides_them(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nidle_minutes: 30\ndown_when_idle: true\nmax_hours: 12\n"
                 "max_cost: 250.5\n")  # fmt: skip
    limits = taskfile.load(path).cluster.limits
    assert (limits.idle_minutes, limits.down_when_idle, limits.max_hours, limits.max_cost) == (
        30.0, True, 12.0, 250.5
    )  # fmt: skip
    assert taskfile.load(path, overrides={"max_hours": "2"}).cluster.limits.max_hours == 2.0


def test_the_runtime_and_strategy_come_from_the_file(tmp_path: Path) -> None:
    task = taskfile.load(write(tmp_path, "name: exp1\nruntime: torch\nstrategy: fsdp\n"))
    assert (task.runtime, task.strategy) == ("torch", "fsdp")
    plain = taskfile.load(write(tmp_path, "name: exp1\n"))
    assert (plain.runtime, plain.strategy) == ("torch", None)


def test_workdir_dot_is_the_files_folder_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(tmp_path)
    write(project, "name: a\nworkdir: .\n")
    task = taskfile.load(Path("project/task.yaml"))
    assert task.workdir == project.resolve()


def test_defaults_for_a_minimal_file(tmp_path: Path) -> None:
    task = taskfile.load(write(tmp_path, "name: exp1\n"))
    assert (task.cluster.provider, task.cluster.num_nodes) == ("local", 1)
    assert task.cluster.resources == Resources()
    assert (task.workdir, task.setup, task.run, dict(task.envs)) == (None, None, None, {})


def test_unknown_top_level_field_names_its_line_and_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nprovider: fake\nnum_node: 2\n")
    assert error_of(path).startswith(
        f"{path}:3: unknown field 'num_node' — did you mean 'num_nodes'?; allowed: name, "
    )


def test_unknown_nested_field_names_the_nested_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nresources:\n  spot: true\n  regoin: us-east-1\n")
    assert error_of(path).startswith(
        f"{path}:4: unknown field 'resources.regoin' — did you mean 'region'?"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: exp1\n\nnum_nodes: 0\n", ":3: num_nodes 0 is out of range; allowed: 1 to 1024"),
        ("# a task\nname: Bad Name\n", ":2: name 'Bad Name' is not a valid cluster name: "),
        ("name: exp1\nresources:\n  disk_gb: 5\n", ":3: resources.disk_gb 5 is not allowed"),
        ("name: exp1\nenvs:\n  A: 1\n  1BAD: x\n", ":4: envs: '1BAD' is not a valid"),
        ("name: exp1\nresources: 5\n", ":2: resources must be a mapping, got 5"),
        ("name: exp1\nprovider: fak\n", ":2: provider 'fak' is not a known provider — did"),
        ("name: exp1\n\nrun: train.py 'oops\n", ':3: run "train.py \'oops": no closing quotation'),
        ("name: exp1\nidle_minutes: 0\n", ":2: idle_minutes 0: give minutes above 0"),
        ("name: exp1\nmax_hours: .inf\n", ":2: max_hours inf: give hours above 0"),
        ("name: exp1\nmax_cost: -3\n", ":2: max_cost -3: give US dollars above 0"),
        ("name: exp1\ndown_when_idle: yes please\n", ":2: down_when_idle 'yes please' is not"),
        ("name: exp1\ndown_when_idle: true\n", ":2: down_when_idle needs idle_minutes"),
        (
            "name: exp1\nruntime: tensorflw\n",
            ":2: runtime 'tensorflw' is not one of torch, "
            "tensorflow, horovod — did you mean 'tensorflow'?",
        ),
        ("name: exp1\nruntime: [torch]\n", ":2: runtime ['torch'] is not one of"),
        ("name: exp1\nstrategy: zero3\n", ":2: strategy 'zero3' is not one of ddp, fsdp"),
        (
            "name: exp1\nruntime: horovod\nstrategy: fsdp\n",
            ":3: strategy 'fsdp' is for the torch runtime; runtime 'horovod' shards its own way",
        ),
    ],
)
def test_bad_value_names_its_line(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path).startswith(f"{path}{expected}")


def test_error_keeps_the_spec_error_as_its_cause(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        taskfile.load(write(tmp_path, "name: exp1\nresources:\n  spot: maybe\n"))
    assert isinstance(info.value.__cause__, SpecError)
    assert info.value.__cause__.field == "resources.spot"


def test_missing_field_has_no_line(tmp_path: Path) -> None:
    path = write(tmp_path, "num_nodes: 2\n")
    assert error_of(path).startswith(f"{path}: name None is not a valid cluster name: ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: exp1\nnum_nodes: [1, 2\nrun: x\n",
            ":3: invalid YAML: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence on line 2)",
        ),
        (
            "name: exp1\nresources:\n  spot: true\n region: x\n",
            ":4: invalid YAML: expected <block end>, but found '<block mapping start>' "
            "(while parsing a block mapping on line 1)",
        ),
        ("name: exp1\n\tnum_nodes: 2\n", ":2: invalid YAML: found character '\\t' that cannot"),
        (
            "name: a\n---\nname: b\n",
            ":2: invalid YAML: expected a single document in the stream, "
            "but found another document",
        ),
        ("name: !!python/object:os.system x\n", ":1: invalid YAML: could not determine a"),
    ],
)
def test_malformed_yaml_names_its_line(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path).startswith(f"{path}{expected}")


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nnum_nodes: 1\nrun: x\nnum_nodes: 2\n")
    assert error_of(path) == f"{path}:4: duplicate key 'num_nodes' (first on line 2)"


def test_duplicate_nested_key_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nresources:\n  spot: true\n  spot: false\n")
    assert error_of(path) == f"{path}:4: duplicate key 'resources.spot' (first on line 3)"


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path).startswith(f"{path}: the file is empty; a task file is a mapping")


@pytest.mark.parametrize(
    ("text", "kind"), [("- a\n- b\n", "a list"), ("hello\n", "a single value")]
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    message = error_of(write(tmp_path, text))
    assert re.fullmatch(
        rf".*task\.yaml:1: the top level must be a mapping of fields \(.*\), got {kind}", message
    )


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert error_of(path) == f"{path}: no such task file"


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nnum_nodes: 4\nresources:\n  region: us-east-1\n")
    task = taskfile.load(
        path,
        overrides={"num_nodes": 2, "name": "exp2", "resources.spot": True, "provider": "fake"},
    )
    assert (task.cluster.name, task.cluster.num_nodes, task.cluster.provider) == ("exp2", 2, "fake")
    assert task.cluster.resources == Resources(spot=True, region="us-east-1")


def test_none_override_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nnum_nodes: 4\nresources:\n  spot: true\n")
    task = taskfile.load(path, overrides={"num_nodes": None, "resources.spot": None, "name": None})
    assert (task.cluster.name, task.cluster.num_nodes) == ("exp1", 4)
    assert task.cluster.resources.spot is True


def test_overrides_do_not_change_the_caller_mappings(tmp_path: Path) -> None:
    overrides = {"resources.region": "eu-west-1"}
    task = taskfile.parse("name: a\nresources:\n  spot: true\n", overrides=overrides)
    assert task.cluster.resources == Resources(spot=True, region="eu-west-1")
    assert overrides == {"resources.region": "eu-west-1"}


def test_bad_override_has_no_file_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nnum_nodes: 4\n")
    assert error_of(path, num_nodes=0) == f"{path}: num_nodes 0 is out of range; allowed: 1 to 1024"


def test_override_under_a_non_mapping_blames_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nresources: 5\n")
    message = error_of(path, **{"resources.spot": True})
    assert message == f"{path}:2: resources must be a mapping, got 5"


def test_parse_uses_source_in_errors() -> None:
    with pytest.raises(ConfigError, match=r"^<task>:2: num_nodes 0 is out of range"):
        taskfile.parse("name: a\nnum_nodes: 0\n")


def test_from_flags_builds_a_task() -> None:
    task = taskfile.from_flags({"name": "exp1", "num_nodes": 2, "provider": "fake", "region": None})
    assert (task.cluster.name, task.cluster.num_nodes, task.cluster.provider) == ("exp1", 2, "fake")


def test_from_flags_needs_a_name() -> None:
    with pytest.raises(ConfigError, match=r"^name None is not a valid cluster name: "):
        taskfile.from_flags({"num_nodes": 2, "name": None})


# These two need cloudtrain/plan/catalog.py (accelerator names come from the catalog).


def test_accelerator_from_file_and_override(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nresources:\n  accelerator: a100:8\n")
    assert taskfile.load(path).cluster.resources.gpus == "A100:8"
    task = taskfile.load(path, overrides={"resources.accelerator": "V100"})
    assert task.cluster.resources.gpus == "V100:1"


def test_unknown_accelerator_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: exp1\nresources:\n  spot: true\n  accelerator: A10O:8\n")
    assert error_of(path).startswith(
        f"{path}:4: resources.accelerator 'A10O:8': unknown accelerator 'A10O' — did you mean"
    )


def test_checkpoint_fields_are_read_and_normalized(tmp_path: Path) -> None:
    task = taskfile.load(
        write(tmp_path, "name: exp1\ncheckpoint: s3://ckpts/runs/bert/\ncheckpoint_keep: 5\n")
    )
    assert (task.checkpoint, task.checkpoint_keep) == ("s3://ckpts/runs/bert", 5)
    plain = taskfile.load(write(tmp_path, "name: exp1\n"))
    assert (plain.checkpoint, plain.checkpoint_keep) == (None, 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "checkpoint: zz://ckpts/x",
            ":3: checkpoint 'zz://ckpts/x': no provider keeps checkpoints at zz://; write ",
        ),
        ("checkpoint: s3://Ckpts/x", ":3: checkpoint 's3://Ckpts/x': 'Ckpts' is not a bucket"),
        ("checkpoint: s3://ckpts/a//b", ":3: checkpoint 's3://ckpts/a//b': the prefix part ''"),
        ("checkpoint: 42", ":3: checkpoint 42 is not a bucket URL"),
        ("checkpoint_keep: 0", ":3: checkpoint_keep 0 is not allowed; use a whole number of 1"),
        ("checkpoint_keep: two", ":3: checkpoint_keep 'two' is not allowed"),
        ("checkpoint_keep: true", ":3: checkpoint_keep True is not allowed"),
        ("checkpoint_keep: 1.5", ":3: checkpoint_keep 1.5 is not allowed"),
        (
            "checkpoint_kept: 3",
            ":3: unknown field 'checkpoint_kept' — did you mean 'checkpoint_keep'",
        ),
    ],
)
def test_bad_checkpoint_fields_name_their_line(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, f"name: exp1\nprovider: local\n{text}\n")
    message = error_of(path)
    assert message.startswith(f"{path}{expected}"), message
    assert "\n" not in message


def test_an_elastic_range_and_a_managed_policy_in_the_task(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        "name: el\nnum_nodes: 1:4\nrun: t.py\nmanaged: true\nmax_recoveries: 5\n"
        "retry_on_failure: true\n"
    )
    loaded = taskfile.load(task)
    assert (loaded.cluster.num_nodes, loaded.min_nodes) == (4, 1), "1:4 is no base-60 number"
    assert (loaded.managed, loaded.max_recoveries, loaded.retry_on_failure) == (True, 5, True)
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text('name: el\nnum_nodes: "2:3"\nrun: t.py\n')
    assert (taskfile.load(quoted).cluster.num_nodes, taskfile.load(quoted).min_nodes) == (3, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_nodes: 3:2", "task.yaml:2: num_nodes '3:2': write a number of nodes"),
        ("managed: yes please", "task.yaml:2: managed 'yes please' is not allowed; use true"),
        ("max_recoveries: -1", "task.yaml:2: max_recoveries -1 is not allowed"),
    ],
)
def test_bad_managed_and_elastic_fields_name_the_line(
    tmp_path: Path, text: str, message: str
) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(f"name: el\n{text}\nrun: t.py\n")
    with pytest.raises(ConfigError) as err:
        taskfile.load(task)
    assert str(err.value).startswith(f"{task.parent}/{message}"), str(err.value)
