"""What Slurm prints, parsed: output recorded from the lab's Slurm 22.05 (tests/data/slurm), and
the strings a hostile or careless job name or comment puts in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.slurm._slurm import (
    NEVER,
    SEP,
    comment,
    parse_oneliner,
    parse_queue,
    parse_version,
    refused,
    seconds,
)
from cloudtrain.providers.slurm.provider import SlurmProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources

DATA = Path(__file__).parents[1] / "data" / "slurm"


def test_squeue_of_22_05_gives_each_jobs_fields_and_only_our_comments_name_an_owner() -> None:
    other, hostile, ours = parse_queue((DATA / "squeue-22.05.txt").read_text())
    assert (ours.job_id, ours.name, ours.state, ours.nodelist, ours.nodes) == (
        "1",
        "c1",
        "RUNNING",
        "n1",
        1,
    )
    assert (ours.time_limit, ours.time_left, other.time_left) == ("1:00:00", "59:32", "1:00:00")
    assert (ours.start, other.start) == ("2026-12-07T02:24:29", "2026-12-07T03:24:29")
    assert (ours.owner, ours.cluster_id, ours.running) == ("root@vm", "601ac70f9408", True)
    assert (other.reason, other.nodelist, other.owner, other.running) == (
        "Resources",
        "",
        None,
        False,
    )
    assert (hostile.name, hostile.owner) == ("x y", None), "not our comment: nobody's"


@pytest.mark.parametrize(
    "owner", ["me@host", 'a"b', "with\nnewline", f"with{SEP}separator", "ünïcode 名前", ""]
)
def test_a_comment_reads_back_whatever_the_owner_is(owner: str) -> None:
    marked = comment(owner, "abc123")
    assert SEP not in marked
    assert "\n" not in marked
    line = SEP.join(
        ["7", "exp", "PENDING", "Priority", "(null)", "2", "UNLIMITED", "UNLIMITED", "N/A", marked]
    )
    [job] = parse_queue(line + "\n")
    assert (job.owner, job.cluster_id, job.nodelist) == (owner, "abc123", "")


@pytest.mark.parametrize(
    ("index", "read"), [(1, 1), (0, 0), (-1, None), ("1", None), (True, None), (10**9, None)]
)
def test_a_node_made_again_is_its_jobs_index_and_nothing_else_reads_as_one(
    index: object, read: int | None
) -> None:
    marked = comment("me", "abc123", 1).replace('"index": 1', f'"index": {json.dumps(index)}')
    line = SEP.join(["8", "exp", "RUNNING", "None", "n2", "1", "1:00", "59:00", "N/A", marked])
    [job] = parse_queue(line + "\n")
    assert (job.owner, job.index) == ("me", read)
    assert parse_queue(line.replace(marked, comment("me", "abc123")) + "\n")[0].index is None


def test_lines_squeue_should_not_print_are_skipped() -> None:
    text = "garbage\n" + SEP.join(["x", "n", "RUNNING", "", "", "1", "", "", "", ""]) + "\n\n"
    assert parse_queue(text) == []


def test_scontrol_show_node_of_22_05_gives_each_nodes_address_and_state() -> None:
    n1, n2 = parse_oneliner((DATA / "node-22.05.txt").read_text())
    assert (n1["NodeName"], n1["NodeAddr"], n1["State"]) == ("n1", "127.0.0.1", "IDLE")
    assert (n2["NodeName"], n2["State"]) == ("n2", "IDLE+DRAIN")
    assert n2["Gres"] == "gpu:a100:8"


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("slurm-wlm 22.05.8", (22, 5)),
        ("slurm 23.11.4", (23, 11)),
        ("slurm 25.11.0", (25, 11)),
        ("", (0, 0)),
    ],
)
def test_sinfo_version(text: str, version: tuple[int, int]) -> None:
    assert parse_version(text) == version


def test_a_refusal_is_slurms_last_error_line_without_the_prefixes() -> None:
    said = (
        "sbatch: error: invalid partition specified: nope\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    )
    assert refused(said) == "Invalid partition name specified"
    assert refused("") == "no reason given"


def test_every_reason_that_never_clears_says_why_in_words() -> None:
    assert all(text and not text.endswith(".") for text in NEVER.values())
    assert "Resources" not in NEVER
    assert "Priority" not in NEVER


def provider(tmp_path: Path, **options: str) -> SlurmProvider:
    return SlurmProvider(ProviderContext(tmp_path, options))


def test_the_allocation_asked_for_is_whole_nodes_with_the_gpus_and_the_limits(
    tmp_path: Path,
) -> None:
    slurm = provider(tmp_path, partition="gpu", account="proj1", qos="high", time="12:00:00")
    spec = ClusterSpec("exp1", "slurm", 4, Resources("A100", 8), cluster_id="c0ffee")
    options = slurm.batch.options(spec, slurm.owner)  # what plan requests and apply submits
    assert "--nodes=4" in options
    assert "--exclusive" in options
    assert "--gres=gpu:a100:8" in options
    assert "--job-name=exp1" in options
    assert {"--partition=gpu", "--account=proj1", "--qos=high", "--time=12:00:00"} <= set(options)
    assert any(o.startswith("--comment=cloudtrain {") and "c0ffee" in o for o in options)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"time": "tomorrow"}, "--time 'tomorrow': give minutes"),
        ({"partition": "gpu --wrap=x"}, "--partition 'gpu --wrap=x': letters"),
        ({"account": "a;b"}, "--account 'a;b'"),
        ({"qos": "-x"}, "--qos '-x'"),
        ({"wait": "-1"}, "--wait '-1': give seconds"),
        ({"notice": "70000"}, "--notice '70000': give seconds, more than 0 and at most 65535"),
        ({"login": "me@host:99999"}, "--login 'me@host:99999': port 99999 is not 1 to 65535"),
        ({"login": "local", "identity": "/k"}, "--identity: only for a login node over SSH"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(
    tmp_path: Path, options: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError, match="^" + said.replace("(", r"\(").replace(")", r"\)")):
        provider(tmp_path, **options)


@pytest.mark.parametrize("good", ["30", "1:30", "12:00:00", "2-12", "2-12:30:00", "UNLIMITED"])
def test_every_time_form_sbatch_takes_is_taken(tmp_path: Path, good: str) -> None:
    assert provider(tmp_path, time=good).batch.time == good


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("59:56", 3596),
        ("1:00:00", 3600),
        ("1-02:03:04", 93784),
        ("2-12", 216000),
        ("30", 1800),
        ("0:00", 0),
        ("UNLIMITED", None),
        ("INVALID", None),
        ("NOT_SET", None),
        ("1:2:3:4", None),
    ],
)
def test_a_time_slurm_prints_reads_as_seconds(text: str, expected: int | None) -> None:
    assert seconds(text) == expected
