"""The bootstrap's Python phases (`cloudtrain.node.bootstrap`) on their own: what they decide, and
each run as the script runs it, with this Python (check-only, as the local provider does). The
whole bootstrap, run by the script with stubs, is in tests/unit/bootstrap/test_script.py."""

from __future__ import annotations

import ast
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.jobs import warm
from cloudtrain.node import bootstrap as phases
from cloudtrain.node import procs, verify

SOURCE = Path(phases.__file__)


def outside_imports(source: Path) -> dict[str, set[str]]:
    """What `source` imports beyond the stdlib and `cloudtrain.node`, by the function that
    imports it (``<module>``: at the top)."""
    tree = ast.parse(source.read_text())
    outside: dict[str, set[str]] = {}
    for func in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))]:
        nodes = ast.iter_child_nodes(func) if func is tree else ast.walk(func)
        for node in nodes:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith(
                    "cloudtrain.node"
                ):
                    where = "<module>" if func is tree else getattr(func, "name", "?")
                    outside.setdefault(where, set()).add(name)
    return outside


def test_the_agent_stays_stdlib_only() -> None:
    """torch is imported only by the verify probes (`cloudtrain.node.verify`), which run in the
    node's Python; the phases are the stdlib."""
    assert outside_imports(SOURCE) == {}
    assert outside_imports(Path(verify.__file__)) == {
        "check": {"torch"}, "allreduce": {"torch", "torch.distributed"}}  # fmt: skip


@pytest.mark.parametrize(
    ("info", "requirement", "index", "fits"),
    [
        ("2.13.0+cu126 12.6", "torch==2.13.0", "https://download.pytorch.org/whl/cu126", True),
        ("2.13.0+cu130 13.0", "torch==2.13.0", "https://download.pytorch.org/whl/cu126", False),
        ("2.12.1+cu126 12.6", "torch==2.13.0", "https://download.pytorch.org/whl/cu126/", False),
        ("2.13.0+cpu None", "torch>=2.4,<3", "https://download.pytorch.org/whl/cpu", True),
        ("2.13.0 12.8", "torch>=2.4,<3", "https://download.pytorch.org/whl/cpu", False),
        ("2.13.0+cu126 12.6", "torch==2.13.0+cu126", "https://mirror.example/simple", True),
    ],
)
def test_torch_matches_the_pin_and_the_index(
    info: str, requirement: str, index: str, fits: bool
) -> None:
    assert phases.torch_matches(info, requirement, index) is fits


def config(tmp_path: Path, **keys: str) -> Path:
    values = {"CT_ROOT": str(tmp_path / "root"), **keys}
    path = tmp_path / "bootstrap.env"
    path.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()))
    return path


def test_the_config_file_and_its_defaults(tmp_path: Path) -> None:
    loaded = phases.Config.load(config(tmp_path, CT_INSTALL="1"))
    assert loaded.python == f"{tmp_path}/root/venv/bin/python"
    assert (loaded.gpus, loaded["CT_EFA"], loaded["CT_NCCL_ENV"]) == (0, "0", "")
    assert phases.Config.load(config(tmp_path, CT_INSTALL="0")).python == "python3"
    with pytest.raises(ValueError, match="CT_ROOT must be an absolute path"):
        phases.Config.load(config(tmp_path, CT_ROOT="relative"))


def test_nccl_settings_follow_the_fabric(tmp_path: Path) -> None:
    efa = phases.Config.load(config(tmp_path, CT_EFA="1", CT_ACCELERATOR="A100",
                                    CT_NCCL_SOCKET_IFNAME="ens5"))  # fmt: skip
    assert phases.nccl_settings(efa) == {
        "NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5", "FI_PROVIDER": "efa",
        "NCCL_PROTO": "simple", "FI_EFA_USE_DEVICE_RDMA": "1",
    }  # fmt: skip
    bad = phases.Config.load(config(tmp_path, CT_NCCL_ENV="lower=1"))
    with pytest.raises(phases.PhaseEnd, match="'lower=1' is not KEY=value"):
        phases.nccl_settings(bad)


def phase(name: str, path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """The phase as the script runs it: its log on stdout, its reason to skip in a file."""
    argv = [
        sys.executable,
        "-m",
        *(command or ("cloudtrain.node.bootstrap",)),
        "phase",
        name,
        str(path),
        str(path.with_name(f"skipped.{name}")),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def stop_the_checks_server(root: Path) -> str:
    """Stop the warm server a CPU node's verify phase started under `root` (every process of
    the node); what it said."""
    log = warm.folder(root) / "server.log"
    said = log.read_text() if log.exists() else ""
    counts = procs.stop(lambda: procs.find_node(str(root)), 10.0)
    assert counts["killed"] == counts["left"] == 0, counts
    return said


def test_each_phase_with_this_python_check_only(tmp_path: Path) -> None:
    """Check-only, CPU: torch imports, nccl.env says CPU (skipped, and why), a gloo all_reduce
    by a rank forked from the node's warm server, which the phase started (and leaves)."""
    path = config(tmp_path, CT_INSTALL="0", CT_PYTHON=sys.executable)
    (tmp_path / "root").mkdir()
    torch = phase("torch", path)
    assert torch.returncode == 0, torch.stderr
    assert "torch 2." in torch.stdout
    nccl = phase("nccl", path)
    assert nccl.returncode == 0, nccl.stderr
    assert "skipped: CPU node: no NCCL settings" in nccl.stdout
    assert (tmp_path / "skipped.nccl").read_text() == "CPU node: no NCCL settings\n"
    assert (tmp_path / "root" / "nccl.env").read_text().startswith("# cloudtrain: a CPU node")
    try:
        verify = phase("verify", path)
    finally:
        said = stop_the_checks_server(tmp_path / "root")
    assert verify.returncode == 0, verify.stderr
    assert "gloo all_reduce across 1 process(es): ok" in verify.stdout
    assert not (tmp_path / "skipped.verify").exists()
    assert said.count("serving on") == said.count("forked agent") == 1, said


def test_a_cpu_check_starts_the_jobs_warm_server_only_as_their_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs run as the node folder's owner: a cloud node's bootstrap, root under
    cloud-init, starts no server (one of root's would serve none of them)."""
    monkeypatch.delenv(warm.SWITCH, raising=False)
    assert phases._as_the_jobs_user(tmp_path)
    assert not phases._as_the_jobs_user(tmp_path / "gone")
    with monkeypatch.context() as m:
        m.setattr(os, "geteuid", lambda: tmp_path.stat().st_uid + 1)
        assert not phases._as_the_jobs_user(tmp_path)
    monkeypatch.setenv(warm.SWITCH, "0")
    assert not phases._as_the_jobs_user(tmp_path)


def test_a_node_whose_machine_another_node_verified_skips_the_verify_phase(tmp_path: Path) -> None:
    """A local cluster's nodes are one machine: node 0's verify stands for all (no torch
    import, no all-reduce: the probe would fail here, the Python being a missing one)."""
    path = config(tmp_path, CT_INSTALL="0", CT_PYTHON=str(tmp_path / "no-python"),
                  CT_VERIFIED_BY="node 0")  # fmt: skip
    (tmp_path / "root").mkdir()
    verify = phase("verify", path)
    assert verify.returncode == 0, verify.stderr
    said = "this machine is verified by node 0"
    assert (tmp_path / "skipped.verify").read_text() == said + "\n"


def test_a_failed_phase_exits_with_its_code_and_says_why(tmp_path: Path) -> None:
    path = config(tmp_path, CT_INSTALL="0", CT_PYTHON=str(tmp_path / "no-python"))
    done = phase("torch", path)
    assert done.returncode == 1
    assert f"error: torch is not installed for {tmp_path / 'no-python'}" in done.stdout


def test_a_signal_kills_what_the_phase_runs_and_exits_143(tmp_path: Path) -> None:
    """The script passes its SIGTERM on to the phase: the command the phase runs (here the
    verify probe, a Python that sleeps) is killed with it, not left behind."""
    python = tmp_path / "python"
    marker = tmp_path / "probe.pid"
    python.write_text(f"#!/bin/sh\necho $$ > {marker}\nexec sleep 60\n")
    python.chmod(0o755)
    path = config(tmp_path, CT_INSTALL="0", CT_PYTHON=str(python))
    argv = [
        sys.executable,
        "-m",
        "cloudtrain.node.bootstrap",
        "phase",
        "verify",
        str(path),
        str(tmp_path / "skipped.verify"),
    ]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as run:
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text().strip():
            assert time.monotonic() < deadline, "the probe never started"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=30)
    assert run.returncode == 143
    assert "interrupted (exit 143)" in out
    probe = int(marker.read_text())
    with pytest.raises(ProcessLookupError):  # killed, and reaped by subprocess.run
        os.kill(probe, 0)


def test_a_phase_is_also_the_node_agents_bootstrap_command(tmp_path: Path) -> None:
    """`python -m cloudtrain.node bootstrap ...` is this module, arguments and all."""
    done = phase("nccl", tmp_path / "missing.env", "cloudtrain.node", "bootstrap")
    assert done.returncode == phases.EXIT_CONFIG
    assert "cannot load the config file" in done.stderr
