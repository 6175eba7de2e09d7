"""`cloudtrain preflight` on a real two-node local cluster, through the CLI: gloo's all-reduce
runs under torchrun on both nodes, a TCP stream is measured between them, the verdict comes
back as JSON and as text. (The NCCL path needs GPUs: `tests/unit/test_preflight.py` reads
recorded logs of it.)"""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration
MIB = 1 << 20


def test_preflight_of_two_local_nodes_measures_gloo_against_a_tcp_stream(sh: Shell) -> None:
    up = sh("up", "--provider", "local", "--nodes", "2", "--name", "pf")
    assert up.returncode == 0, up.stderr

    done = sh("preflight", "pf", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "PASS", report
    assert report["causes"] == []
    assert (report["backend"], report["nodes"], report["ranks"]) == ("gloo", 2, 2)
    assert [s["bytes"] for s in report["sizes"]] == [MIB << i for i in range(7)]  # 1 to 64 MiB
    for size in report["sizes"]:
        assert size["seconds"] > 0
        assert size["busbw_gb_s"] == size["algbw_gb_s"] == size["bytes"] / size["seconds"] / 1e9
    assert report["busbw_gb_s"] == max(s["busbw_gb_s"] for s in report["sizes"])
    tcp = report["tcp"]
    # rank 0's node (whichever joined the rendezvous first) receives from the other one
    assert ({tcp["from_node"], tcp["to_node"]}, tcp["bytes"]) == ({0, 1}, 64 * MIB)
    assert tcp["addr"].startswith("127.0.0.1:")  # the address the job uses
    assert tcp["gb_s"] > 0
    assert report["fraction"] == report["busbw_gb_s"] / tcp["gb_s"]
    assert [(p["a"], p["b"]) for p in report["pairs"]] == [(0, 1)]
    assert report["expected"] is None  # a CPU cluster is judged against its own TCP stream
    job = sh.job(report["job_id"])
    assert (job["status"], job["num_nodes"]) == ("succeeded", 2)

    text = sh("preflight", "pf", "--max-mib", "64")
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    header = ["size", "time", "algbw GB/s", "busbw GB/s"]
    assert any([c.strip() for c in ln.split("┃")[1:5]] == header for ln in lines), text.stdout
    streams = [ln for ln in lines if ln.startswith("TCP stream: ")]
    assert len(streams) == 1, text.stdout
    assert any(f"node {a} → node {1 - a}" in streams[0] for a in (0, 1)), streams  # a new run
    assert lines[-1] == "PASS"
    assert "preflight of pf: an all-reduce across its 2 node(s)" in text.stderr

    unknown = sh("preflight", "nosuch")
    assert unknown.returncode == 2
    assert unknown.stderr == "error: no cluster named 'nosuch'; `cloudtrain status` lists them\n"

    assert sh("down", "pf").returncode == 0
    assert sh.processes() == []
