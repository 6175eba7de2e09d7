"""templates/bootstrap.sh and its Python phases (`cloudtrain.node.bootstrap`), run for real by
bash in a sandbox: stub system commands first on PATH, a stub Python with a fake torch and a
fake cloudtrain whose node code is the real one (stubs/), tmp_path as CT_ROOT. One test uses the
real Python with CT_INSTALL=0, as the local provider does."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import cloudtrain
from cloudtrain.boot.gpustack import GpuStack, stack_for
from cloudtrain.node import bootstrap
from tests.conftest import require_tool
from tests.unit.test_node_bootstrap import stop_the_checks_server

STUBS = Path(__file__).parent / "stubs"
STUB_COMMANDS = ("apt-get", "dpkg", "nvidia-smi", "lspci", "modprobe", "systemctl", "sudo")
#: The verify phase's one-node launch, on loopback alone.
LOOPBACK = " ".join(bootstrap.LOOPBACK)
ALL = ["base", "nvidia-driver", "python", "cloudtrain", "torch", "nccl", "verify"]
PHASE_KEYS = {"name", "state", "started", "finished", "exit_code", "log"}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
BASE_PACKAGES = ("python3-venv", "python3-pip", "rsync")
PY_PHASES = "cloudtrain.node.bootstrap"
#: Runs start in the repository, where `cloudtrain/` would shadow the fake node agent unless the
#: script leaves the caller's folder before it runs Python.
CWD = Path(__file__).parents[3]
BASH = shutil.which("bash") or "/bin/bash"
#: What the script (and the stub Python) need to run the nccl phase, flock left out.
NO_FLOCK_TOOLS = (
    "bash",
    "cat",
    "date",
    "dirname",
    "env",
    "mkdir",
    "mktemp",
    "mv",
    "rm",
    "sed",
    "sleep",
    "tail",
)


@pytest.fixture(scope="module")
def script() -> Iterator[Path]:
    ref = resources.files("cloudtrain.templates").joinpath("bootstrap.sh")
    with resources.as_file(ref) as path:
        yield path


def keys_for(stack: GpuStack, gpus: int = 0) -> dict[str, str]:
    """The CT_* keys a GpuStack turns into (what the renderer writes)."""
    return {
        "CT_ACCELERATOR": stack.accelerator or "",
        "CT_GPU_COUNT": str(gpus),
        "CT_DRIVER_BRANCH": stack.driver_branch or "",
        "CT_MIN_DRIVER": stack.min_driver or "",
        "CT_TORCH_INDEX": stack.torch_index,
        "CT_TORCH_VERSION": "torch==2.13.0",
        "CT_EFA": "1" if stack.efa else "0",
        "CT_NCCL_ENV": " ".join(f"{k}={v}" for k, v in stack.nccl.items()),
    }


class Node:
    """One sandboxed node: CT_ROOT, the stubs' state and the config file, under tmp_path."""

    def __init__(self, tmp: Path, script: Path) -> None:
        self.tmp = tmp
        self.script = script
        self.root = tmp / "home" / ".cloudtrain"
        self.state = tmp / "stub"
        self.bin = tmp / "bin"
        self.config = tmp / "bootstrap.env"
        self.wheel = tmp / "wheels" / "cloudtrain-0.1.0-py3-none-any.whl"
        self.state.mkdir()
        self.bin.mkdir()
        for name in STUB_COMMANDS:
            (self.bin / name).symlink_to(STUBS / "stub.sh")
        self.path = f"{self.bin}{os.pathsep}{os.environ['PATH']}"

    def configure(self, stack: GpuStack, gpus: int = 0, agent: bool = False, **keys: str) -> None:
        """Write the config; `agent`: cloudtrain (whose node code runs the Python phases) is
        installed already, for runs without the cloudtrain phase."""
        values = {
            "CT_ROOT": str(self.root),
            "CT_INSTALL": "1",
            "CT_PYTHON": str(STUBS / "python"),
            **keys_for(stack, gpus),
            "CT_CLOUDTRAIN_WHEEL": str(self.wheel),
            "CT_CLOUDTRAIN_VERSION": "0.1.0",
        }
        values.update(keys)
        self.config.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()))
        self.put("gpus", str(gpus))
        if agent:
            self.put("cloudtrain-version", values["CT_CLOUDTRAIN_VERSION"])

    def put(self, name: str, text: str = "") -> None:
        """Stub state: see the header of stubs/stub.sh and stubs/python."""
        (self.state / name).parent.mkdir(parents=True, exist_ok=True)
        (self.state / name).write_text(text)

    def copy_wheel(self) -> None:
        """As the executors copy: into a temporary name, renamed into place."""
        self.wheel.parent.mkdir(exist_ok=True)
        part = self.wheel.with_name(f".{self.wheel.name}.part")
        part.write_bytes(b"a wheel")
        part.replace(self.wheel)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CT_")}
        env.update(
            PATH=self.path,
            STUB_STATE=str(self.state),
            STUB_SITE=str(STUBS / "site"),
            STUB_REAL_PYTHON=sys.executable,
            STUB_AGENT=str(Path(cloudtrain.__file__).parent),
            TMPDIR=str(self.tmp),
        )
        return env

    def argv(self) -> list[str]:
        return [BASH, str(self.script), str(self.config)]

    def run(self, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(),
            env={**self.env(), **env},
            cwd=CWD,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(),
            env=self.env(),
            cwd=CWD,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def calls(self, prefix: str = "") -> list[str]:
        """The stubs' calls, "NAME ARGS", those starting with ``prefix``."""
        log = self.state / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.startswith(prefix)]

    def py_phases(self, *names: str) -> list[str]:
        """The calls that run the Python phases `names` (`python -m cloudtrain.node.bootstrap`)."""
        skipped = self.root / "bootstrap" / "skipped"
        return [f"python -m {PY_PHASES} phase {n} {self.config} {skipped}.{n}" for n in names]

    def work(self, prefix: str = "") -> list[str]:
        """The calls, those that start a Python phase left out."""
        return [c for c in self.calls(prefix) if not c.startswith(f"python -m {PY_PHASES} ")]

    def forget_calls(self) -> None:
        (self.state / "calls.log").unlink(missing_ok=True)

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / "bootstrap" / "status.json").read_text())
        return data

    def phase(self, name: str) -> dict[str, Any]:
        entry: dict[str, Any] = next(p for p in self.status()["phases"] if p["name"] == name)
        return entry

    def states(self) -> dict[str, str]:
        return {p["name"]: p["state"] for p in self.status()["phases"]}

    def log(self, phase: str) -> str:
        return (self.root / "bootstrap" / "logs" / f"{phase}.log").read_text()


@pytest.fixture
def node(tmp_path: Path, script: Path) -> Node:
    return Node(tmp_path, script)


def assert_schema(node: Node, phases: list[str]) -> None:
    """The status file has exactly the documented shape."""
    status = node.status()
    waiting = {"waiting_for", "wheel"} if status["state"] == "waiting" else set()
    assert set(status) == {"phase", "state", "phases"} | waiting
    assert status["state"] in {"running", "waiting", "ready", "failed"}
    assert status["phase"] in phases
    assert [p["name"] for p in status["phases"]] == phases
    for entry in status["phases"]:
        assert set(entry) == PHASE_KEYS
        assert entry["log"] == str(node.root / "bootstrap" / "logs" / f"{entry['name']}.log")
        state, code = entry["state"], entry["exit_code"]
        if state == "pending":
            assert (entry["started"], entry["finished"], code) == (None, None, None)
            continue
        assert ISO.match(entry["started"])
        if state in {"running", "waiting"}:
            assert (entry["finished"], code) == (None, None)
            continue
        assert ISO.match(entry["finished"])
        assert isinstance(code, int)
        assert (code == 0) == (state in {"done", "skipped"}), entry


def test_cpu_node_from_scratch(node: Node) -> None:
    node.configure(stack_for(None))
    node.copy_wheel()
    result = node.run()
    assert result.returncode == 0, result.stderr
    assert node.states() == {
        "base": "done",
        "nvidia-driver": "skipped",
        "python": "done",
        "cloudtrain": "done",
        "torch": "done",
        "nccl": "skipped",
        "verify": "done",
    }
    assert node.status()["state"] == "ready"
    assert node.status()["phase"] == "verify"
    assert_schema(node, ALL)
    assert node.calls("nvidia-smi") == []
    installs = node.calls("apt-get")
    assert installs[-1].endswith("install python3-venv python3-pip rsync")
    assert node.calls("python -m venv") == [f"python -m venv {node.root / 'venv'}"]
    assert node.calls("python -m pip install") == [
        f"python -m pip install --no-input {node.wheel}",
        "python -m pip install --no-input torch==2.13.0 "
        "--index-url https://download.pytorch.org/whl/cpu",
    ]
    assert node.calls(f"python -m {PY_PHASES}") == node.py_phases("torch", "nccl", "verify")
    assert node.calls("python -m cloudtrain.jobs.warm") == [
        "python -m cloudtrain.jobs.warm --keep --start",
        f"python -m cloudtrain.jobs.warm --keep {LOOPBACK} --nproc-per-node 1 --start-method "
        "fork -m cloudtrain.node.verify check 0",
    ]
    assert node.calls("python -m torch.distributed.run") == []
    assert "gloo all_reduce across 1 process(es): ok" in node.log("verify")
    assert (node.root / "nccl.env").read_text().startswith("# cloudtrain: a CPU node")
    assert "skipped, no GPU on this node" in result.stdout


@pytest.mark.parametrize("where", ["config", "environment"])
def test_a_cpu_node_with_warm_starts_off_checks_in_one_process(node: Node, where: str) -> None:
    """``CT_WARM=0`` (`up` under ``CLOUDTRAIN_WARM=0``) or ``CLOUDTRAIN_WARM=0`` here (as for
    a bootstrap that runs as another user than the jobs', `test_node_bootstrap`): the check
    imports torch itself, and starts no server."""
    switch = "0" if where == "config" else "1"
    node.configure(stack_for(None), agent=True, CT_INSTALL="0", CT_PHASES="verify",
                   CT_WARM=switch)  # fmt: skip
    node.put("torch", "2.13.0+cpu None\n")
    result = node.run(CLOUDTRAIN_WARM="1" if where == "config" else "0")
    assert result.returncode == 0, result.stderr
    assert node.calls("python -m cloudtrain.jobs.warm") == []
    assert node.calls("python -m cloudtrain.node.verify") == [
        "python -m cloudtrain.node.verify check 0"]  # fmt: skip
    assert "gloo all_reduce across 1 process(es): ok" in node.log("verify")


def test_v100_node_gets_the_cu12_index_and_keeps_a_recent_driver(node: Node) -> None:
    node.configure(stack_for("V100", "p3.16xlarge"), gpus=8)
    node.put("driver", "570.172.08\n")  # as on a Deep Learning AMI: >= 560.28.03
    for package in BASE_PACKAGES:
        node.put(f"dpkg/{package}")
    node.copy_wheel()
    result = node.run()
    assert result.returncode == 0, result.stderr
    assert node.phase("nvidia-driver")["state"] == "skipped"
    assert "NVIDIA driver 570.172.08 is present" in node.log("nvidia-driver")
    assert node.calls("apt-get") == []
    (torch_install,) = [c for c in node.calls("python -m pip install") if "torch" in c]
    assert torch_install.endswith("--index-url https://download.pytorch.org/whl/cu126")
    (torchrun,) = node.calls("python -m torch.distributed.run")
    assert f" {LOOPBACK} --nproc-per-node 8 " in torchrun  # (loopback: not --standalone)
    assert torchrun.endswith(" -m cloudtrain.node.verify allreduce")
    assert "8 GPU(s)" in node.log("verify")


def test_old_driver_is_replaced_by_the_branch_server_package(node: Node) -> None:
    node.configure(stack_for("A100", "a2-highgpu-8g"), gpus=8, CT_PHASES="nvidia-driver")
    node.put("driver", "535.247.01\n")
    node.put("driver-after", "580.95.05\n")
    result = node.run()
    assert result.returncode == 0, result.stderr
    assert node.phase("nvidia-driver")["state"] == "done"
    assert node.calls("apt-get")[-1].endswith(" install nvidia-driver-580-server")
    assert node.calls("systemctl") == []
    assert "NVIDIA driver 580.95.05" in node.log("nvidia-driver")


def test_torch_of_the_wrong_cuda_build_is_replaced(node: Node) -> None:
    node.configure(stack_for("V100"), gpus=1, agent=True, CT_PHASES="python torch")
    node.put("torch", "2.13.0+cu130 13.0\n")  # no sm_70 kernels
    assert node.run().returncode == 0
    assert node.calls("python -m pip") == [
        "python -m pip uninstall -y torch",
        "python -m pip install --no-input torch==2.13.0 "
        "--index-url https://download.pytorch.org/whl/cu126",
    ]
    assert "replacing torch 2.13.0+cu130 (CUDA 13.0)" in node.log("torch")


def test_nvswitch_board_also_gets_the_fabric_manager(node: Node) -> None:
    node.configure(stack_for("A100", "p4d.24xlarge"), gpus=8, CT_PHASES="nvidia-driver")
    node.put("driver-after", "580.95.05\n")
    gpu, nvswitch = "0000:10:1c.0 0302: 10de:20b0 (rev a1)", "0000:11:00.0 0680: 10de:1af1 (rev a1)"
    node.put("lspci", f"{gpu}\n{nvswitch}\n")
    assert node.run().returncode == 0
    installs = [c.split(" install ")[1] for c in node.calls("apt-get") if " install " in c]
    assert installs == ["nvidia-driver-580-server", "nvidia-fabricmanager-580"]
    assert node.calls("systemctl") == ["systemctl enable --now nvidia-fabricmanager"]


def test_driver_that_does_not_load_asks_for_a_reboot(node: Node) -> None:
    node.configure(stack_for("V100"), gpus=1, CT_PHASES="nvidia-driver")
    result = node.run()
    assert result.returncode == 76
    assert node.status()["state"] == "failed"
    assert node.phase("nvidia-driver")["exit_code"] == 76
    assert "a reboot may be needed" in node.log("nvidia-driver")
    assert "a reboot may be needed" in result.stderr

    node.put("driver", "580.95.05\n")  # after the reboot the coordinator runs the script again
    assert node.run().returncode == 0
    assert node.states() == {"nvidia-driver": "skipped"}


def test_failed_phase_is_reported_then_resumed(node: Node) -> None:
    node.configure(stack_for(None), agent=True)  # the cloudtrain phase then needs no pip
    node.put("fail.pip", "3")
    result = node.run()
    assert result.returncode == 3
    status = node.status()
    assert (status["state"], status["phase"]) == ("failed", "torch")
    assert_schema(node, ALL)
    torch = node.phase("torch")
    assert (torch["state"], torch["exit_code"]) == ("failed", 3)
    assert "pip: failing on purpose" in Path(torch["log"]).read_text()
    assert "pip: failing on purpose" in result.stderr  # the log's tail
    assert node.states()["nccl"] == "pending"
    before = {p: node.phase(p) for p in ("base", "python", "cloudtrain")}

    (node.state / "fail.pip").unlink()
    node.forget_calls()
    result = node.run()
    assert result.returncode == 0, result.stderr
    assert "resuming at torch" in result.stdout
    assert node.calls("dpkg") == node.calls("apt-get") == node.calls("python -m venv") == []
    assert node.calls()[:1] == node.py_phases("torch")
    assert node.calls()[1].startswith("python -c import importlib.util")
    assert node.status()["state"] == "ready"
    assert {p: node.phase(p) for p in ("base", "python", "cloudtrain")} == before
    assert node.log("torch").count("==== ") == 2  # both attempts, in one log


def test_rerun_after_success_is_a_no_op(node: Node) -> None:
    node.configure(stack_for(None))
    node.copy_wheel()
    assert node.run().returncode == 0
    status = node.status()
    node.forget_calls()
    result = node.run()
    assert result.returncode == 0
    assert node.calls() == []  # not even a Python phase starts
    assert node.status() == status
    assert "every phase already done" in result.stdout


def test_config_change_redoes_the_phases_that_depend_on_it(node: Node) -> None:
    node.configure(stack_for(None))
    node.copy_wheel()
    assert node.run().returncode == 0
    node.wheel = node.wheel.with_name("cloudtrain-0.2.0-py3-none-any.whl")
    node.copy_wheel()
    node.configure(stack_for(None), CT_CLOUDTRAIN_VERSION="0.2.0")
    node.forget_calls()
    result = node.run()
    assert result.returncode == 0, result.stderr
    assert node.calls("python -m pip install") == [f"python -m pip install --no-input {node.wheel}"]
    assert node.calls("dpkg") == []
    assert "resuming at cloudtrain" in result.stdout


def test_missing_wheel_waits_for_the_coordinator(node: Node) -> None:
    """No wheel yet: the status says where it goes while the same run waits for it; once the
    coordinator copied it there, the run installs it and goes on to the end."""
    node.configure(stack_for(None))
    run = node.start()
    status_file = node.root / "bootstrap" / "status.json"
    _wait_for(lambda: status_file.exists() and '"waiting"' in status_file.read_text(), "waiting")
    status = node.status()
    assert (status["phase"], status["state"]) == ("cloudtrain", "waiting")
    assert (status["waiting_for"], status["wheel"]) == ("wheel", str(node.wheel))
    assert_schema(node, ALL)
    assert (node.phase("cloudtrain")["state"], node.phase("cloudtrain")["exit_code"]) == (
        "waiting", None)  # fmt: skip
    assert node.states()["torch"] == "pending"
    assert "for the coordinator to copy the cloudtrain wheel" in node.log("cloudtrain")
    assert node.calls("python -m cloudtrain") == []  # the Python phases wait for the wheel too
    assert node.calls("python -m pip") == []

    node.copy_wheel()  # what the coordinator does, renamed into place
    _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    installs = node.calls("python -m pip install")
    assert installs[0] == f"python -m pip install --no-input {node.wheel}"
    assert installs[1].startswith("python -m pip install --no-input torch")  # then the torch phase
    assert node.status()["state"] == "ready"
    assert node.phase("cloudtrain")["state"] == "done"


def test_a_signal_while_it_waits_for_the_wheel_ends_it_at_once(node: Node) -> None:
    node.configure(stack_for(None))
    run = node.start()
    status_file = node.root / "bootstrap" / "status.json"
    _wait_for(lambda: status_file.exists() and '"waiting"' in status_file.read_text(), "waiting")
    began = time.monotonic()
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 143
    assert time.monotonic() - began < 10, "not left to wait out CT_WHEEL_TIMEOUT"
    assert "cloudtrain: interrupted" in err
    assert (node.status()["state"], node.phase("cloudtrain")["exit_code"]) == ("failed", 143)


def test_a_wheel_that_never_comes_fails_the_phase(node: Node) -> None:
    node.configure(stack_for(None), CT_WHEEL_TIMEOUT="1")
    result = node.run()
    assert result.returncode == 1
    assert (node.status()["state"], node.phase("cloudtrain")["exit_code"]) == ("failed", 1)
    assert f"no cloudtrain wheel at {node.wheel} after 1 s" in result.stderr  # the log's tail


def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_concurrent_runs_are_serialised_by_the_lock(node: Node) -> None:
    node.configure(stack_for(None))
    node.copy_wheel()
    node.put("slow.pip", "1")
    first = node.start()
    _wait_for(lambda: node.calls("python -m pip install"), "the first run's pip")
    second = node.start()
    _, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert (first.returncode, second.returncode) == (0, 0), err1 + err2
    assert "waiting up to 600 s" in out2
    assert "every phase already done" in out2
    assert len(node.calls("python -m pip install --no-input torch")) == 1
    assert node.status()["state"] == "ready"


def test_a_lock_held_too_long_is_a_clear_error(node: Node) -> None:
    node.configure(
        stack_for(None), CT_PHASES="nccl", CT_INSTALL="0", agent=True, CT_LOCK_TIMEOUT="1"
    )
    (node.root / "bootstrap").mkdir(parents=True)
    with (node.root / "bootstrap" / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = node.run()
    assert result.returncode == 69
    assert "another bootstrap run still holds" in result.stderr
    assert not (node.root / "bootstrap" / "status.json").exists()


def test_mkdir_lock_where_flock_is_missing(node: Node) -> None:
    tools = node.tmp / "tools"  # the commands the script and the stubs use; no flock
    tools.mkdir()
    for name in NO_FLOCK_TOOLS:
        (tools / name).symlink_to(shutil.which(name) or f"/usr/bin/{name}")
    node.path = f"{node.bin}{os.pathsep}{tools}"
    node.configure(
        stack_for(None), CT_PHASES="nccl", CT_INSTALL="0", agent=True, CT_LOCK_TIMEOUT="1"
    )
    lock = node.root / "bootstrap" / "lock.d"
    lock.mkdir(parents=True)
    (lock / "pid").write_text(f"{os.getpid()}\n")  # held by a live process
    result = node.run()
    assert result.returncode == 69
    assert "lock.d after 1 s" in result.stderr

    dead = subprocess.Popen(["true"])
    dead.wait()
    (lock / "pid").write_text(f"{dead.pid}\n")  # its owner is gone: taken over
    result = node.run()
    assert result.returncode == 0, result.stderr
    assert node.states() == {"nccl": "skipped"}
    assert not lock.exists()


def test_terminated_run_is_recorded_and_resumes(node: Node) -> None:
    """The signal reaches the script at once, which passes it on to the running phase (the
    torch phase's Python kills its pip) and records the phase as failed."""
    node.configure(stack_for(None))
    node.copy_wheel()
    node.put("slow.pip", "2")
    run = node.start()
    _wait_for(lambda: node.calls("python -m pip install --no-input torch"), "pip")
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 143
    assert "torch: interrupted" in err
    assert (node.status()["state"], node.phase("torch")["exit_code"]) == ("failed", 143)

    (node.state / "slow.pip").unlink()
    node.forget_calls()
    result = node.run()
    assert result.returncode == 0, result.stderr
    assert "resuming at torch" in result.stdout
    assert len(node.calls("python -m pip install --no-input torch")) == 1  # pip was killed


def test_local_provider_check_only_with_the_real_python(node: Node) -> None:
    """The local provider's case: this interpreter, CPU torch, nothing installed."""
    node.configure(
        stack_for(None),
        CT_INSTALL="0",
        CT_PHASES="python torch cloudtrain verify",  # run in their order: cloudtrain first
        CT_PYTHON=sys.executable,
        CT_CLOUDTRAIN_WHEEL="",
        CT_CLOUDTRAIN_VERSION=cloudtrain.__version__,
    )
    try:
        result = node.run()
    finally:
        said = stop_the_checks_server(node.root)
    assert said.count("forked agent") == 1, said  # the check's rank
    assert result.returncode == 0, result.stderr + result.stdout
    assert_schema(node, ["python", "cloudtrain", "torch", "verify"])
    assert set(node.states().values()) == {"done"}
    assert node.calls() == []
    assert "torch 2." in node.log("torch")
    assert f"cloudtrain {cloudtrain.__version__}" in node.log("cloudtrain")
    assert "gloo all_reduce across 1 process(es): ok" in node.log("verify")
    assert not (node.root / "venv").exists()


def test_check_only_says_what_is_missing(node: Node) -> None:
    node.configure(stack_for(None), agent=True, CT_INSTALL="0", CT_PHASES="python torch")
    result = node.run()
    assert result.returncode == 1
    assert node.states() == {"python": "done", "torch": "failed"}
    assert "torch is not installed for" in node.log("torch")
    assert node.work("python -m") == []  # check-only: no venv, no pip


def test_verify_names_a_build_without_kernels_for_the_gpu(node: Node) -> None:
    node.configure(stack_for("V100"), gpus=1, agent=True, CT_INSTALL="0", CT_PHASES="verify")
    node.put("torch", "2.13.0+cu130 13.0\n")
    node.put("arches", "sm_75 sm_80 sm_86 sm_90")
    result = node.run()
    assert result.returncode == 1
    assert "GPU 0 is sm_70; this torch build has kernels for" in node.log("verify")


def test_nccl_settings_on_efa(node: Node) -> None:
    node.configure(
        stack_for("A100", "p4d.24xlarge"),
        gpus=8,
        CT_PHASES="nccl",
        CT_INSTALL="0",
        agent=True,
        CT_NCCL_SOCKET_IFNAME="^lo,docker",
    )
    assert node.run().returncode == 0
    text = (node.root / "nccl.env").read_text()
    settings = dict(line.split("=", 1) for line in shlex.split(text, comments=True))
    assert settings == {
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "GLOO_SOCKET_IFNAME": "^lo,docker",
        "FI_PROVIDER": "efa",
        "NCCL_PROTO": "simple",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    }


def test_nccl_settings_on_volta_efa_have_no_device_rdma(node: Node) -> None:
    node.configure(
        stack_for("V100-32GB", "p3dn.24xlarge"),
        gpus=8,
        CT_PHASES="nccl",
        CT_INSTALL="0",
        agent=True,
    )
    assert node.run().returncode == 0
    text = (node.root / "nccl.env").read_text()
    settings = dict(line.split("=", 1) for line in shlex.split(text, comments=True))
    assert settings == {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}


def test_nccl_settings_on_infiniband_come_from_the_fabric_table(node: Node) -> None:
    node.configure(
        stack_for("A100", "Standard_ND96asr_v4"),
        gpus=8,
        CT_PHASES="nccl",
        CT_INSTALL="0",
        agent=True,
    )
    assert node.run().returncode == 0
    text = (node.root / "nccl.env").read_text()
    settings = dict(line.split("=", 1) for line in shlex.split(text, comments=True))
    assert settings == {
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_PCI_RELAXED_ORDERING": "1",
        "NCCL_TOPO_FILE": "/opt/microsoft/ndv4-topo.xml",
    }
    node.configure(
        stack_for("A100", "Standard_ND96asr_v4"),
        gpus=8,
        CT_PHASES="nccl",
        CT_INSTALL="0",
        agent=True,
        CT_NCCL_ENV="NCCL_IB_DISABLE=0 not-a-setting",
    )
    assert node.run().returncode == 1
    assert "CT_NCCL_ENV: 'not-a-setting' is not KEY=value" in node.log("nccl")


def test_status_escapes_odd_paths(node: Node) -> None:
    logs = node.tmp / 'logs "quoted" \\ and\ttab'
    node.configure(
        stack_for(None), CT_PHASES="nccl", CT_INSTALL="0", agent=True, CT_LOG_DIR=str(logs)
    )
    assert node.run().returncode == 0
    assert node.phase("nccl")["log"] == f"{logs}/nccl.log"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"CT_PHASES": "base gpu"}, "unknown phase 'gpu'"),
        ({"CT_PHASES": "base base"}, "phase 'base' is twice"),
        ({"CT_INSTALL": "yes"}, "CT_INSTALL must be 0 or 1"),
        ({"CT_ROOT": "relative"}, "CT_ROOT must be an absolute path"),
        ({"CT_TORCH_INDEX": ""}, "CT_TORCH_INDEX is required"),
        ({"CT_MIN_DRIVER": "new"}, "CT_MIN_DRIVER must be a version"),
    ],
)
def test_bad_config_stops_before_any_phase(node: Node, keys: dict[str, str], message: str) -> None:
    node.configure(stack_for("V100"), gpus=1, **keys)  # type: ignore[arg-type]
    result = node.run()
    assert result.returncode == 78
    assert message in result.stderr
    assert node.calls() == []
    assert not (node.root / "bootstrap" / "status.json").exists()


def test_the_config_file_is_the_whole_config(node: Node) -> None:
    node.configure(stack_for(None), CT_PHASES="nccl", CT_INSTALL="0", agent=True)
    result = node.run(CT_PHASES="base", CT_INSTALL="0", CT_STATUS=str(node.tmp / "elsewhere"))
    assert result.returncode == 0, result.stderr
    assert node.states() == {"nccl": "skipped"}
    assert node.work() == []


def test_missing_config_file(node: Node) -> None:
    result = node.run()
    assert result.returncode == 78
    assert f"cannot read the config file {node.config}" in result.stderr


def test_shellcheck_is_clean(script: Path) -> None:
    shellcheck = require_tool("shellcheck")
    result = subprocess.run(
        [shellcheck, "-s", "bash", "-S", "style", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
