"""Stage 2 of the bootstrap (`cloudtrain.node.bootstrap`) on its own: what it decides, and a run
by hand with this Python (check-only, as the local provider does). The run behind stage 1, with
stubs, is in tests/unit/bootstrap/test_script.py."""

from __future__ import annotations

import ast
import fcntl
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.node import bootstrap as stage2
from cloudtrain.node import verify

SOURCE = Path(stage2.__file__)


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
    node's Python; stage 2 is the stdlib and the node agent (stdlib-only itself: `test_layers`)."""
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
    assert stage2.torch_matches(info, requirement, index) is fits


def config(tmp_path: Path, **keys: str) -> Path:
    values = {"CT_ROOT": str(tmp_path / "root"), **keys}
    path = tmp_path / "bootstrap.env"
    path.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()))
    return path


def test_the_config_file_defaults_and_phase_order(tmp_path: Path) -> None:
    loaded = stage2.Config.load(config(tmp_path, CT_PHASES="verify torch python", CT_INSTALL="1"))
    assert loaded.phases == ["python", "torch", "verify"]
    assert loaded.python == f"{tmp_path}/root/venv/bin/python"
    assert loaded["CT_STATUS"] == f"{tmp_path}/root/bootstrap/status.json"
    with pytest.raises(ValueError, match="CT_ROOT must be an absolute path"):
        stage2.Config.load(config(tmp_path, CT_ROOT="relative"))


def test_nccl_settings_follow_the_fabric(tmp_path: Path) -> None:
    efa = stage2.Config.load(config(tmp_path, CT_EFA="1", CT_ACCELERATOR="A100",
                                    CT_NCCL_SOCKET_IFNAME="ens5"))  # fmt: skip
    assert stage2.nccl_settings(efa) == {
        "NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5", "FI_PROVIDER": "efa",
        "NCCL_PROTO": "simple", "FI_EFA_USE_DEVICE_RDMA": "1",
    }  # fmt: skip
    bad = stage2.Config.load(config(tmp_path, CT_NCCL_ENV="lower=1"))
    with pytest.raises(stage2.PhaseEnd, match="'lower=1' is not KEY=value"):
        stage2.nccl_settings(bad)


def run_by_hand(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudtrain.node.bootstrap", "run", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_by_hand_it_refuses_before_stage_1_is_done(tmp_path: Path) -> None:
    path = config(tmp_path, CT_INSTALL="0", CT_PYTHON=sys.executable, CT_PHASES="python verify")
    done = run_by_hand(path)
    assert done.returncode == 78
    assert "stage 1 has not finished its phase python: run bootstrap.sh" in done.stderr
    assert not (tmp_path / "root" / "bootstrap" / "status.json").exists()


def test_by_hand_it_takes_the_lock(tmp_path: Path) -> None:
    path = config(tmp_path, CT_INSTALL="0", CT_PHASES="nccl", CT_LOCK_TIMEOUT="0")
    (tmp_path / "root" / "bootstrap").mkdir(parents=True)
    with (tmp_path / "root" / "bootstrap" / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = run_by_hand(path)
    assert done.returncode == 69
    assert "another bootstrap run still holds" in done.stderr


def test_by_hand_with_this_python_it_verifies_and_reports_ready(tmp_path: Path) -> None:
    """Check-only, CPU: torch imports, nccl.env says CPU, a gloo all_reduce in one process."""
    path = config(tmp_path, CT_INSTALL="0", CT_PYTHON=sys.executable, CT_PHASES="torch nccl verify")
    done = run_by_hand(path)
    assert done.returncode == 0, done.stderr
    assert "cloudtrain-bootstrap: ready" in done.stdout
    status = json.loads((tmp_path / "root" / "bootstrap" / "status.json").read_text())
    assert (status["state"], status["phase"]) == ("ready", "verify")
    assert {p["name"]: (p["state"], p["exit_code"]) for p in status["phases"]} == {
        "torch": ("done", 0), "nccl": ("skipped", 0), "verify": ("done", 0)}  # fmt: skip
    logs = tmp_path / "root" / "bootstrap" / "logs"
    assert "gloo all_reduce across 1 process(es): ok" in (logs / "verify.log").read_text()
    assert (tmp_path / "root" / "nccl.env").read_text().startswith("# cloudtrain: a CPU node")
    again = run_by_hand(path)
    assert again.returncode == 0
    assert "every phase already done" in again.stdout


def test_stage_2_is_also_the_node_agents_bootstrap_command(tmp_path: Path) -> None:
    """`python -m cloudtrain.node bootstrap ...` is stage 2 itself, arguments and all."""
    done = subprocess.run([sys.executable, "-m", "cloudtrain.node", "bootstrap", "run",
                           str(tmp_path / "missing.env")], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == stage2.EXIT_CONFIG
    assert "cannot load the config file" in done.stderr
