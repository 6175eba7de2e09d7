"""`cloudtrain metrics` and `cloudtrain plot` with odd names: a metric name from a node's file
that is not a name (a trailing newline, a terminal escape) is dropped when the copy is read, and
an image name from the command line reaches the terminal escaped, never as control
characters."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cloudtrain.jobs import metrics
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State
from tests.conftest import Cli

#: What a node's metrics file may hold besides what `runtime.report` checks: a name with a
#: trailing newline, and one that is a terminal escape (the copy drops both).
LINES = [
    {"step": 1, "at": 1.0, "rank": 0, "loss\n": 0.5, "\x1b]0;owned\x07": 1.0, "acc": 0.25},
    {"step": 2, "at": 2.0, "rank": 0, "loss\n": 0.4, "acc": 0.5},
]


@pytest.fixture
def job(home: Path) -> str:
    with State.open(home) as state:
        state.put_cluster(ClusterSpec("demo", "local", 1, Resources()), status=ClusterStatus.UP)
        rec = state.new_job("demo", "t", num_nodes=1, nproc_per_node=1, command=["t.py"])
    copy = metrics.copy_path(home, rec.id, 0, 0)
    copy.parent.mkdir(parents=True)
    copy.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    return rec.id


def test_a_metric_name_that_is_not_a_name_is_dropped_everywhere(run_cli: Cli, job: str) -> None:
    result = run_cli("metrics", job)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "\x07" not in result.output
    header, *rows = result.output.splitlines()
    assert header.split() == ["attempt", "step", "at", "acc"]
    assert len(rows) == 2
    table = list(csv.DictReader(io.StringIO(run_cli("metrics", job, "--csv").output)))
    assert [(row["acc"], "loss\n" in row) for row in table] == [("0.25", False), ("0.5", False)]
    lines = json.loads(run_cli("metrics", job, "--json").output)
    assert [sorted(line) for line in lines] == [["acc", "at", "attempt", "rank", "step"]] * 2


def test_plot_names_its_image_escaped(run_cli: Cli, job: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    odd = tmp_path / "a\x1b]0;owned\x07\nb.png"
    result = run_cli("plot", job, "acc", "-o", str(odd))
    assert result.exit_code == 0, result.output
    assert odd.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.output == f"wrote {str(odd)!r}\n"
    assert "\\x1b]0;owned\\x07\\nb.png'" in result.output
    plain = tmp_path / "curve.png"
    assert run_cli("plot", job, "-o", str(plain)).output == f"wrote {plain}\n"


def test_plot_says_which_names_there_are(run_cli: Cli, job: str) -> None:
    pytest.importorskip("matplotlib")
    result = run_cli("plot", job, "los")
    assert result.exit_code == 2
    assert result.output == f"error: metric 'los': job {job} reported acc\n"


def test_plot_to_a_folder_that_is_not_there_is_bad_input(
    run_cli: Cli, job: str, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    where = tmp_path / "no" / "such\nfolder" / "c.png"
    result = run_cli("plot", job, "-o", str(where))
    assert result.exit_code == 2
    assert result.output == f"error: --output {str(where)!r}: No such file or directory\n"
