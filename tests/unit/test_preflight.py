"""The preflight's reading and judging: recorded NCCL logs name their transport, nccl-tests'
bandwidth arithmetic, and the verdict against ``networks.csv``.

No GPU here: the NCCL path is tested through the recorded logs of ``tests/data/nccl`` (see its
README); the gloo path runs for real in ``tests/integration/test_preflight.py``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import preflight
from cloudtrain.cli.app import App, console
from cloudtrain.cli.preflight_cmd import after_up
from cloudtrain.cli.preflight_cmd import lines as report_lines
from cloudtrain.errors import ConfigError
from cloudtrain.plan import networks
from cloudtrain.preflight.reading import (
    Transport,
    gpu_problems,
    parse_gpus,
    parse_transport,
    read_results,
    sizes_of,
    slow_nodes,
)
from cloudtrain.preflight.verdict import Report, Target, judge
from cloudtrain.records import ClusterStatus
from cloudtrain.runtime import preflight_worker
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State
from tests.conftest import Cli

LOGS = Path(__file__).resolve().parents[1] / "data" / "nccl"
MIB = 1 << 20


def log(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def recorded(case: str, provider: str, instance_type: str) -> Report:
    """A recorded 2-node GPU preflight, judged as `run` judges a live one."""
    nodes = {n: log(f"{case}-node{n}.log") for n in (0, 1)}
    transports = {n: parse_transport(found) for n, found in nodes.items()}
    results = read_results([ln for n in sorted(nodes) for ln in nodes[n]])
    target = Target("exp1", provider, instance_type, num_nodes=2, gpus_per_node=8)
    return judge(target, results, transports, networks.expected(provider, instance_type))


# -- transport ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "label", "fabric", "gdr"),
    [
        ("p4d-efa-node0.log", "NET/OFI (efa)", "efa", True),
        ("p4d-efa-node1.log", "NET/OFI (efa)", "efa", True),
        ("p4d-socket-node0.log", "NET/Socket", "tcp", False),
        ("nd96asr-ib-node1.log", "NET/IB", "ib", True),
        ("ofi-tcp-provider.log", "NET/OFI (tcp;ofi_rxm)", "ofi", False),
        ("ib-missing-socket.log", "NET/Socket", "tcp", False),
    ],
)
def test_a_recorded_nccl_log_names_its_transport(
    name: str, label: str, fabric: str, gdr: bool
) -> None:
    found = parse_transport(log(name))
    assert found is not None
    assert (found.label, found.fabric, found.gdr) == (label, fabric, gdr)


def test_the_channels_name_the_transport_when_the_using_line_is_missing() -> None:
    lines = [ln for ln in log("nd96asr-ib-node0.log") if "Using network" not in ln]
    assert parse_transport(lines) == Transport("IB", "ib", None, gdr=True)


def test_lines_that_are_not_nccls_name_no_transport() -> None:
    assert parse_transport(["Using network IB", "epoch 1 loss 0.3", "NCCL WARN Call to"]) is None


# -- arithmetic ---------------------------------------------------------------------------------


def test_algbw_and_busbw_are_nccl_tests_definitions() -> None:
    assert preflight.algbw(1_000_000_000, 0.5) == 2e9
    assert preflight.algbw(64 * MIB, 0.125) == 536870912.0
    assert preflight.busbw(2.0, 16) == 3.75  # 2 × 2·15/16
    assert preflight.busbw(2.0, 8) == 3.5
    assert preflight.busbw(3.0, 2) == 3.0  # two ranks: busbw = algbw
    assert preflight.busbw(3.0, 1) == 0.0  # one rank moves nothing


def test_sizes_are_read_as_gb_per_second_of_the_slowest_rank() -> None:
    results = read_results(
        [
            'CLOUDTRAIN_PREFLIGHT {"kind":"allreduce","bytes":4000000000,"seconds":2.0,"ranks":4}',
            'CLOUDTRAIN_PREFLIGHT {"kind":"allreduce","bytes":1000000000,"seconds":0.25,"ranks":4}',
        ]
    )
    sizes = sizes_of(results)
    assert [(s.nbytes, s.algbw, s.busbw) for s in sizes] == [
        (1_000_000_000, 4.0, 6.0),
        (4_000_000_000, 2.0, 3.0),
    ]


def test_a_recorded_run_gives_its_figures() -> None:
    report = recorded("p4d-efa", "aws", "p4d.24xlarge")
    assert [s.nbytes for s in report.sizes] == [MIB << i for i in range(11)]
    assert report.ranks == 16
    assert report.peak is not None
    assert (report.peak.nbytes, round(report.peak.busbw, 2)) == (1 << 30, 42.0)
    assert report.fraction == pytest.approx(42.0 / 50)
    assert report.tcp_rate == pytest.approx(1.2)
    assert {k: round(v, 2) for k, v in report.pairs.items()} == {(0, 1): 11.3}


# -- verdict ------------------------------------------------------------------------------------


def test_efa_in_use_at_its_rate_passes() -> None:
    report = recorded("p4d-efa", "aws", "p4d.24xlarge")
    assert report.verdict == "PASS"
    assert report.causes == ()
    assert report.notes == (
        "two nodes: a slow node and a slow link look the same; three or more tell them apart",
    )
    assert report.passed


def test_infiniband_in_use_at_its_rate_passes() -> None:
    report = recorded("nd96asr-ib", "azure", "Standard_ND96asr_v4")
    assert report.verdict == "PASS"
    assert report.fraction == pytest.approx(184.6 / 200)
    assert {n: t.label for n, t in report.transports.items() if t} == {0: "NET/IB", 1: "NET/IB"}


def test_sockets_on_an_efa_machine_warn_and_say_why() -> None:
    report = recorded("p4d-socket", "aws", "p4d.24xlarge")
    assert report.verdict == "WARN"
    assert report.causes == (
        "NCCL used NET/Socket on nodes 0, 1, on p4d.24xlarge, an EFA machine: the EFA "
        "interfaces are not attached, or NCCL does not find the aws-ofi-nccl plugin "
        "(libnccl-net.so): check `fi_info -p efa` on the nodes and that the plugin's folder is "
        "on LD_LIBRARY_PATH",
        "bus bandwidth 2.8 GB/s is 6% of the 50 GB/s (400 Gb/s) of p4d.24xlarge's network",
    )


def test_sockets_on_an_infiniband_machine_warn_with_its_note() -> None:
    socket = parse_transport(log("ib-missing-socket.log"))
    efa = read_results(log("p4d-socket-node0.log"))  # 2.8 GB/s: far under 100 Gb/s too
    target = Target("ib", "azure", "Standard_ND40rs_v2", num_nodes=2, gpus_per_node=8)
    expected = networks.expected("azure", "Standard_ND40rs_v2")
    assert expected is not None
    report = judge(target, efa, {0: socket, 1: socket}, expected)
    assert report.verdict == "WARN"
    assert report.causes[0] == (
        "NCCL used NET/Socket on nodes 0, 1, on Standard_ND40rs_v2, an InfiniBand machine: the "
        f"InfiniBand devices are not usable: {expected.note}"
    )
    assert "one scale set or placement group" in report.causes[0]


def test_ofi_on_another_provider_than_efa_warns() -> None:
    ofi = parse_transport(log("ofi-tcp-provider.log"))
    results = read_results(log("p4d-socket-node0.log"))
    target = Target("exp1", "aws", "p4d.24xlarge", num_nodes=2, gpus_per_node=8)
    report = judge(target, results, {0: ofi, 1: ofi}, networks.expected("aws", "p4d.24xlarge"))
    assert report.verdict == "WARN"
    assert report.causes[0].startswith(
        "NCCL used NET/OFI (tcp;ofi_rxm) on nodes 0, 1, on p4d.24xlarge, an EFA machine: the "
        "OFI plugin runs, but not on the efa provider"
    )


def _result(kind: str, **fields: Any) -> str:
    return preflight.MARK + json.dumps({"kind": kind, **fields})


def _four_nodes(pairs: Mapping[tuple[int, int], float], busbw: float = 42.0) -> list[str]:
    """A 4-node × 8 GPU run's result lines: one size at `busbw` GB/s, each pair's GB/s."""
    ranks = 32
    alg = busbw * ranks / (2 * (ranks - 1))
    lines = [
        _result("meta", backend="nccl", world_size=ranks),
        _result("allreduce", bytes=1 << 30, seconds=(1 << 30) / (alg * 1e9), ranks=ranks),
    ]
    lines += [
        _result("pair", a=a, b=b, bytes=10 * 1e9, seconds=10 / r) for (a, b), r in pairs.items()
    ]
    return [*lines, _result("done")]


def test_one_slow_node_is_named() -> None:
    rates = {(0, 1): 11.2, (0, 2): 2.1, (0, 3): 11.0, (1, 2): 2.0, (1, 3): 11.4, (2, 3): 1.9}
    target = Target("exp4", "aws", "p4d.24xlarge", num_nodes=4, gpus_per_node=8)
    efa = Transport("AWS Libfabric", "efa", "efa", gdr=True)
    report = judge(
        target,
        read_results(_four_nodes(rates)),
        dict.fromkeys(range(4), efa),
        networks.expected("aws", "p4d.24xlarge"),
    )
    assert report.verdict == "WARN"
    assert report.slow == ((2, 2.0, 11.2),)
    assert report.causes == (
        "node 2 is slow: its pairs move 2.00 GB/s, the other pairs 11.20 GB/s; replace it "
        "(`cloudtrain down` and `up` again)",
    )


def test_even_pairs_name_no_slow_node_and_two_nodes_cannot() -> None:
    even = {(0, 1): 11.0, (0, 2): 10.1, (1, 2): 10.6}
    assert slow_nodes(even) == []
    assert slow_nodes({(0, 1): 0.1}) == []  # a slow node or a slow link: cannot tell
    assert slow_nodes({(0, 1): 10.0, (0, 2): 1.0, (1, 2): 1.0}) == [(2, 1.0, 10.0)]


def test_an_unknown_machine_type_is_shown_not_judged() -> None:
    assert networks.expected("aws", "g5.48xlarge") is None
    results = read_results(log("p4d-socket-node0.log"))
    socket = parse_transport(log("p4d-socket-node1.log"))
    target = Target("exp1", "aws", "g5.48xlarge", num_nodes=2, gpus_per_node=8)
    report = judge(target, results, {0: socket, 1: socket}, None)
    assert report.verdict == "PASS"
    assert report.fraction is None
    assert report.to_dict()["expected"] is None
    assert (
        "expected bandwidth unknown: g5.48xlarge of aws is not in networks.csv; the figure is "
        "not judged"
    ) in report.notes


def test_a_run_that_did_not_finish_fails() -> None:
    lines = [ln for ln in log("p4d-efa-node0.log") if '"kind":"done"' not in ln]
    target = Target("exp1", "aws", "p4d.24xlarge", num_nodes=2, gpus_per_node=8)
    cut = judge(target, read_results(lines), {}, networks.expected("aws", "p4d.24xlarge"))
    assert (cut.verdict, cut.causes[0]) == (
        "FAIL",
        "the preflight job ended before its last result",
    )
    failed = judge(target, read_results([]), {}, None, failure="the preflight job x-1 failed")
    assert (failed.verdict, failed.causes, failed.sizes) == (
        "FAIL",
        ("the preflight job x-1 failed",),
        (),
    )


@pytest.mark.parametrize(
    ("tcp_seconds", "verdict"),
    [(0.1, "PASS"), (0.01, "WARN")],  # the stream at 0.67 GB/s, then at 6.7 GB/s
)
def test_gloo_is_judged_against_the_tcp_stream_of_the_same_run(
    tcp_seconds: float, verdict: str
) -> None:
    lines = [
        _result("meta", backend="gloo", world_size=2),
        _result("allreduce", bytes=64 * MIB, seconds=0.2, ranks=2),  # 0.34 GB/s
        _result(
            "tcp",
            bytes=64 * MIB,
            seconds=tcp_seconds,
            from_node=1,
            to_node=0,
            addr="127.0.0.1:4000",
        ),
        _result("done"),
    ]
    target = Target("demo", "local", "cpu", num_nodes=2, gpus_per_node=0)
    report = judge(target, read_results(lines), {}, None)
    assert report.verdict == verdict
    assert report.fraction == pytest.approx(tcp_seconds / 0.2)
    if verdict == "WARN":
        assert report.causes == (
            "gloo's bus bandwidth 0.34 GB/s is 5% of one TCP stream's 6.71 GB/s between the "
            "same nodes: gloo is not on the stream's path (set GLOO_SOCKET_IFNAME to the "
            "interface of the nodes' addresses) or a node is short of CPU",
        )


# -- GPUs -----------------------------------------------------------------------------------------

SMI = (
    "0, NVIDIA A100-SXM4-40GB, 00000000:10:1C.0, 40960, 31, 0\n"
    "1, NVIDIA A100-SXM4-40GB, 00000000:10:1D.0, 40960, 33, 2\n"
    "2, NVIDIA A100-SXM4-40GB, 00000000:20:1C.0, 40960, 30, [N/A]\n"
)


def test_nvidia_smi_is_read_and_its_bad_news_said() -> None:
    gpus = parse_gpus(SMI + "No devices were found\n")
    assert [(g.index, g.bus_id, g.memory_mib, g.ecc_uncorrected) for g in gpus] == [
        (0, "00000000:10:1C.0", 40960, 0),
        (1, "00000000:10:1D.0", 40960, 2),
        (2, "00000000:20:1C.0", 40960, None),
    ]
    found = {"node": 1, "returncode": 0, "smi": SMI, "expected": 8}
    assert gpu_problems(1, found) == [
        "node 1: nvidia-smi lists 3 GPU(s) of the machine's 8: a GPU fell off the bus; replace "
        "the node",
        "node 1: GPU 1 (00000000:10:1D.0) has 2 uncorrectable ECC error(s); replace the node "
        "(or reset the GPU)",
    ]
    broken = {"returncode": 9, "smi": "NVIDIA-SMI has failed because it couldn't communicate\n"}
    assert gpu_problems(0, broken)[0].startswith(
        "node 0: nvidia-smi failed (NVIDIA-SMI has failed because it couldn't communicate)"
    )


def test_a_bad_gpu_turns_a_good_network_into_a_warning() -> None:
    bad = _result("gpus", node=1, visible=7, expected=8, returncode=0, smi=SMI)
    lines = [*log("p4d-efa-node0.log"), bad]
    efa = parse_transport(lines)
    target = Target("exp1", "aws", "p4d.24xlarge", num_nodes=2, gpus_per_node=8)
    report = judge(
        target, read_results(lines), {0: efa, 1: efa}, networks.expected("aws", "p4d.24xlarge")
    )
    assert report.verdict == "WARN"
    assert [c.split(":")[0] for c in report.causes] == ["node 1", "node 1"]


# -- the data, the worker's helpers, the report ---------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "instance_type", "gbit", "fabric"),
    [
        ("aws", "p4d.24xlarge", 400, "efa"),
        ("aws", "p4de.24xlarge", 400, "efa"),
        ("aws", "p3dn.24xlarge", 100, "efa"),
        ("aws", "p3.16xlarge", 25, "tcp"),
        ("aws", "p3.8xlarge", 10, "tcp"),
        ("aws", "p3.2xlarge", 10, "tcp"),
        ("gcp", "a2-highgpu-8g", 100, "tcp"),
        ("gcp", "a2-megagpu-16g", 100, "tcp"),
        ("azure", "Standard_ND96asr_v4", 1600, "ib"),
        ("azure", "Standard_ND96amsr_A100_v4", 1600, "ib"),
        ("azure", "Standard_ND40rs_v2", 100, "ib"),
    ],
)
def test_the_shipped_table_gives_each_machines_network(
    provider: str, instance_type: str, gbit: int, fabric: str
) -> None:
    found = networks.expected(provider, instance_type)
    assert found is not None
    assert (found.gbit_per_s, found.fabric, found.gbyte_per_s) == (gbit, fabric, gbit / 8)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("provider,type\n", "networks.csv: the header must be provider,instance_type,"),
        (
            "provider,instance_type,gbit_per_s,fabric,note\naws,x,fast,efa,\n",
            "networks.csv: row 2: gbit_per_s 'fast' is not a number",
        ),
        (
            "provider,instance_type,gbit_per_s,fabric,note\naws,x,100,roce,\n",
            "networks.csv: row 2: fabric 'roce' is not one of efa, ib, tcp",
        ),
        (
            "provider,instance_type,gbit_per_s,fabric,note\naws,x,100,efa,\naws,x,200,efa,\n",
            "networks.csv: row 3: aws x is listed twice",
        ),
    ],
)
def test_a_bad_table_is_refused_naming_the_row(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        networks.parse(text)
    assert str(caught.value).startswith(error)


def test_the_worker_and_the_reader_agree_on_the_mark() -> None:
    assert preflight_worker.MARK == preflight.MARK
    assert preflight_worker.__name__ == preflight.WORKER


def test_the_worker_doubles_sizes_from_1_mib_to_its_cap() -> None:
    assert preflight_worker.sizes(MIB, 64 * MIB) == [MIB << i for i in range(7)]
    assert preflight_worker.sizes(MIB, 1 << 30)[-1] == 1 << 30


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8])
def test_every_pair_of_nodes_meets_once_and_no_node_twice_a_round(count: int) -> None:
    rounds = preflight_worker.round_robin(list(range(count)))
    met = [pair for pairs in rounds for pair in pairs]
    assert sorted(met) == [(a, b) for a in range(count) for b in range(a + 1, count)]
    for pairs in rounds:
        busy: Sequence[int] = [n for pair in pairs for n in pair]
        assert len(busy) == len(set(busy))


def test_two_nodes_run_the_ring_and_nccl_says_what_it_uses() -> None:
    assert preflight.job_envs(2) == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
        "NCCL_ALGO": "Ring",
    }
    assert "NCCL_ALGO" not in preflight.job_envs(4)
    assert [preflight.wanted(*c) for c in ((2, 8), (1, 8), (4, 0))] == [True, False, False]


def test_the_report_reads_as_text_and_as_json() -> None:
    report = recorded("p4d-socket", "aws", "p4d.24xlarge")
    assert report_lines(report) == [
        "cluster exp1: 2 node(s) of aws p4d.24xlarge, 16 ranks on nccl",
        "transport: NET/Socket (node 0, 1)",
        "TCP stream: 1.20 GB/s, node 1 → node 0 (172.31.10.11:41877, 64 MiB)",
        "pair node 0 ↔ node 1: 1.10 GB/s",
        "expected: 400 Gb/s = 50 GB/s per node (efa; 4 x 100 Gb/s EFA; NCCL reaches it through "
        "the aws-ofi-nccl plugin (NET/OFI))",
        "peak busbw: 2.76 GB/s at 1 GiB, 6% of the NIC rate",
        "note: two nodes: a slow node and a slow link look the same; three or more tell them apart",
    ]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["verdict"] == "WARN"
    assert data["transport"]["0"]["label"] == "NET/Socket"
    assert data["expected"]["gb_s"] == 50
    assert data["busbw_gb_s"] == pytest.approx(2.76)
    assert [s["bytes"] for s in data["sizes"]] == [MIB << i for i in range(11)]


# -- bad input on the command line --------------------------------------------------------------


def test_an_unknown_cluster_is_one_line_and_exit_2(run_cli: Cli) -> None:
    result = run_cli("preflight", "nosuch")
    assert result.exit_code == 2
    assert result.stderr == "error: no cluster named 'nosuch'; `cloudtrain status` lists them\n"
    assert result.stdout == ""


def test_a_bad_name_is_refused_before_it_is_looked_up(run_cli: Cli) -> None:
    result = run_cli("preflight", "../etc")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cluster '../etc' is not a valid cluster name")
    assert len(result.stderr.splitlines()) == 1


def test_a_cluster_of_one_rank_has_nothing_to_measure(run_cli: Cli, home: Path) -> None:
    with State.open(home) as state:
        state.put_cluster(ClusterSpec("solo", "local", 1, Resources()), status=ClusterStatus.UP)
    result = run_cli("preflight", "solo", "--json")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: cluster 'solo' is one node with one process: there is no collective to measure "
        "(the preflight needs two ranks or more)\n"
    )
    assert result.stdout == ""


def test_up_runs_it_only_for_a_multi_node_gpu_cluster(home: Path) -> None:
    """`after_up` of a CPU cluster or a one-node GPU cluster says nothing and starts no job."""
    out, err = io.StringIO(), io.StringIO()
    app = App(home=home, out=console(out), err=console(err))
    app.state.put_cluster(ClusterSpec("cpu2", "local", 2, Resources()), status=ClusterStatus.UP)
    app.state.put_cluster(
        ClusterSpec("gpu1", "local", 1, Resources("A100", 8)), status=ClusterStatus.UP
    )
    try:
        for name in ("cpu2", "gpu1", "gone"):
            after_up(app, name)
        assert app.state.jobs("cpu2") == app.state.jobs("gpu1") == []
    finally:
        app.close()
    assert (out.getvalue(), err.getvalue()) == ("", "")
