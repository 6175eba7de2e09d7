"""Horovod on a node (`cloudtrain.node.horovod`) without Horovod: each worker's variables, the
C++17 patch, the wheel's cache key and the cache's hits. The real build and a real two-worker
job are integration tests."""

from __future__ import annotations

import ast
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest

from cloudtrain.node import horovod
from cloudtrain.node.horovod import BuildError, Rendezvous, Slot, Target

CPU = Target(torch="2.13.0+cpu", python="cpython-311", machine="x86_64", flavour="cpu")
WHEEL = "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"


def test_it_imports_only_the_stdlib_at_import_time() -> None:
    tree = ast.parse(Path(horovod.__file__).read_text())
    names = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert [n for n in names if n.split(".")[0] not in sys.stdlib_module_names] == []


def _slots(nodes: int, per_node: int) -> list[Slot]:
    """What Horovod's get_host_assignments deals: node by node, the head's first."""
    return [
        Slot(f"node{c}", c * per_node + r, r, c, nodes * per_node, per_node, nodes)
        for c in range(nodes)
        for r in range(per_node)
    ]


def test_worker_env_for_two_nodes_of_two_slots() -> None:
    envs = [horovod.worker_env(s, "10.0.0.4", 41234, "ens5") for s in _slots(2, 2)]
    common = {
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.4",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "41234",
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
        "HOROVOD_GLOO_IFACE": "ens5",
    }
    mine = [("node0", 0, 0, 0), ("node0", 1, 1, 0), ("node1", 2, 0, 1), ("node1", 3, 1, 1)]
    assert envs == [
        {
            "HOROVOD_HOSTNAME": host,
            "HOROVOD_RANK": str(rank),
            "HOROVOD_LOCAL_RANK": str(local),
            "HOROVOD_CROSS_RANK": str(cross),
            **common,
        }
        for host, rank, local, cross in mine
    ]


def test_worker_env_leaves_the_interface_to_gloo_when_none_is_known() -> None:
    env = horovod.worker_env(_slots(1, 1)[0], "127.0.0.1", 5, "", timeout_s=30)
    assert "HOROVOD_GLOO_IFACE" not in env
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "30"


def test_parse_hosts() -> None:
    assert horovod.parse_hosts("node0:2, node1:2") == [("node0", 2), ("node1", 2)]


@pytest.mark.parametrize("text", ["node0", "node0:0", "node0:x", ":2", "node0:2,"])
def test_parse_hosts_wants_name_and_slots(text: str) -> None:
    with pytest.raises(ValueError, match="write NAME:SLOTS"):
        horovod.parse_hosts(text)


def test_parse_hosts_refuses_a_host_named_twice() -> None:
    with pytest.raises(ValueError, match="hosts named twice: node0"):
        horovod.parse_hosts("node0:2,node1:1,node0:1")


# The lines of 0.28.1's top CMakeLists.txt around its C++ standard (and gloo's own, quoted).
CMAKELISTS = """cmake_minimum_required(VERSION 3.13 FATAL_ERROR)
set(CMAKE_CXX_STANDARD 14)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
    string(PREPEND GLOO_CMAKE "set(CMAKE_CXX_STANDARD 17)\\n")
"""


def test_the_cmakelists_patch_asks_for_cxx17_once(tmp_path: Path) -> None:
    path = tmp_path / "CMakeLists.txt"
    path.write_text(CMAKELISTS)
    assert horovod.patch_cmakelists(path) is True
    assert path.read_text() == CMAKELISTS.replace("STANDARD 14)", "STANDARD 17)")
    assert horovod.patch_cmakelists(path) is False
    assert path.read_text() == CMAKELISTS.replace("STANDARD 14)", "STANDARD 17)")


def test_the_cmakelists_patch_fails_where_no_line_asks_for_a_standard(tmp_path: Path) -> None:
    path = tmp_path / "CMakeLists.txt"
    path.write_text('string(PREPEND GLOO_CMAKE "set(CMAKE_CXX_STANDARD 17)\\n")\n')
    with pytest.raises(BuildError, match=r"no `set\(CMAKE_CXX_STANDARD 14\)` line"):
        horovod.patch_cmakelists(path)


def test_the_cache_key_names_what_the_wheel_is_tied_to() -> None:
    assert CPU.key == "0.28.1-torch2.13.0+cpu-cpython-311-x86_64-cpu"
    gpu = Target("2.13.0+cu128", "cpython-312", "aarch64", "cuda12.8")
    assert gpu.key == "0.28.1-torch2.13.0+cu128-cpython-312-aarch64-cuda12.8"
    assert horovod.build_env(CPU, 8) == {
        "HOROVOD_WITH_PYTORCH": "1",
        "HOROVOD_WITH_GLOO": "1",
        "HOROVOD_WITHOUT_MPI": "1",
        "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "CMAKE_POLICY_VERSION_MINIMUM": "3.5",
        "MAKEFLAGS": "-j8",
    }
    assert horovod.build_env(gpu, 8)["HOROVOD_GPU_OPERATIONS"] == "NCCL"


@pytest.fixture
def no_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"ran {args[0]!r}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.mark.usefixtures("no_commands")
def test_a_wheel_in_the_cache_is_returned_without_building(tmp_path: Path) -> None:
    folder = tmp_path / CPU.key
    folder.mkdir()
    (folder / WHEEL).write_bytes(b"PK")
    (folder / f".{WHEEL}.other.1.part").write_bytes(b"P")  # another build's, not whole yet
    assert horovod.build("python", tmp_path, target=CPU) == folder / WHEEL
    other = Target("2.12.0+cpu", "cpython-311", "x86_64", "cpu")
    assert horovod.cached_wheel(tmp_path / other.key) is None


@pytest.mark.usefixtures("no_commands")
def test_a_build_that_waited_for_the_lock_takes_the_first_builds_wheel(tmp_path: Path) -> None:
    folder = tmp_path / CPU.key
    folder.mkdir()
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a build in progress
    found: list[Path] = []
    waiter = threading.Thread(
        target=lambda: found.append(horovod.build("py", tmp_path, target=CPU))
    )
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()
    (folder / WHEEL).write_bytes(b"PK")
    os.close(fd)
    waiter.join(5)
    assert found == [folder / WHEEL]


def test_the_rendezvous_names_the_workers_that_never_came() -> None:
    httpd = SimpleNamespace(server_address=("10.0.0.4", 41234))
    server = Rendezvous(httpd, _slots(2, 1), timeout_s=0)
    assert server.missing() == []  # nobody came yet: nothing to time
    server.note("global", "rank_0")
    server.note("global", "0")  # the same worker's addresses, later
    server.note("local_node0", "rank_0")
    assert list(server.arrived()) == [0]
    assert server.missing() == [_slots(2, 1)[1]]
    plan = server.plan("lo")
    assert [s["env"]["HOROVOD_RANK"] for s in plan["slots"]] == ["0", "1"]
    assert plan["slots"][1]["env"]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "41234"
    assert plan["slots"][1]["env"]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "0"
