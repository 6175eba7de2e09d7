"""What a cluster cost and what happened to it, through the real CLI on the local provider: a
priced cluster runs a job and goes down; `cost` still has it, to the cent, and its job;
`events` tells its life in order, and `events -f` prints what another command causes until
Ctrl-C ends it (exit 130, no traceback)."""

from __future__ import annotations

import json
import signal
import threading
from decimal import ROUND_HALF_EVEN, Decimal

import pytest

from tests.integration.conftest import SCRIPTS, Shell, wait_for

pytestmark = pytest.mark.integration


def test_cost_and_events_of_a_cluster_already_down(sh: Shell) -> None:
    up = sh("up", "--name", "spend", "--nodes", "2", "--node-price", "3.60")
    assert up.returncode == 0, up.stderr
    job = sh("train", "-c", "spend", str(SCRIPTS / "show_args.py"))
    assert job.returncode == 0, job.stderr

    seen: list[str] = []
    with sh.popen("events", "spend", "-f") as follower:
        stream = follower.stdout
        assert stream is not None
        reader = threading.Thread(target=lambda: seen.extend(stream), daemon=True)
        reader.start()
        try:
            wait_for(
                lambda: any("job spend-1 succeeded" in line for line in seen),
                timeout=30,
                what="`events -f` to print what happened so far",
            )
            down = sh("down", "spend")
            assert down.returncode == 0, down.stderr
            wait_for(
                lambda: any("down  cluster 'spend' terminated" in line for line in seen),
                timeout=30,
                what="`events -f` to print the event `down` caused",
            )
            follower.send_signal(signal.SIGINT)
            assert follower.wait(timeout=30) == 130
        finally:
            if follower.poll() is None:
                follower.kill()
            reader.join(timeout=10)
    assert not any("Traceback" in line for line in seen), "".join(seen)

    lines = sh("events", "spend").stdout.splitlines()
    said = [line.split("  ", 4)[4] for line in lines]
    story = [
        "provisioning 2 node(s) on local",
        "2 node(s) running",
        "bootstrap phase verify done on 2 node(s)",
        "cluster 'spend' is up: 2 node(s) ready",
        "job spend-1 running on 2 node(s)",
        "job spend-1 succeeded",
        "cluster 'spend' terminated",
    ]
    at = [next(i for i, s in enumerate(said) if s.startswith(moment)) for moment in story]
    assert at == sorted(at), said
    assert [line.split("  ")[1] for line in lines] == ["spend"] * len(lines)

    spent = json.loads(sh("cost", "--json").stdout)
    (row,) = spent["rows"]
    assert (row["name"], row["status"], row["prices_per_node_hour"]) == ("spend", "down", [3.6])
    assert row["node_hours"] > 0
    exact = Decimal(repr(row["node_hours"])) * Decimal("3.60")
    assert Decimal(repr(row["cost"])) == exact.quantize(Decimal("0.01"), ROUND_HALF_EVEN)
    assert row["estimate"] is False

    jobs = json.loads(sh("cost", "--by", "job", "--json").stdout)
    assert [(r["name"], r["cluster"]) for r in jobs["rows"]] == [("spend-1", "spend")]
    assert 0 < jobs["rows"][0]["node_hours"] < row["node_hours"]
