"""A Slurm node's host (`cloudtrain.providers.slurm._host`), run as the batch script's step runs
it: what it starts stays its descendant after the starter exits, it serves its own user only,
and a bad request is answered, not obeyed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from cloudtrain.executors.base import DETACH_SCRIPT
from cloudtrain.providers.slurm import _host
from cloudtrain.providers.slurm._executor import files_source, host_source
from tests.integration.conftest import wait_for


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    base = tmp_path / "cluster"
    env = {**os.environ, "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "42"}
    argv = [sys.executable, "-c", host_source(), "serve", str(base), "1", "1.5"]  # a grace of 1.5 s
    proc = subprocess.Popen(argv, env=env)
    root = base / "node-1"
    try:
        wait_for(lambda: (root / _host.READY).is_file(), 20, "the host's ready file")
        yield proc, root
    finally:
        for pid in [*_host.descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def spawn(root: Path, request: Mapping[str, object]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", host_source(), "spawn", str(root)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_what_the_host_starts_runs_detached_as_its_descendant_with_the_env_asked(
    host: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, root = host
    ready = json.loads((root / _host.READY).read_text())
    assert (ready["pid"], ready["index"]) == (proc.pid, 1)
    assert oct((root).stat().st_mode & 0o777) == "0o700"
    job = root / "jobs" / "j1"
    started = spawn(
        root,
        {
            "script": DETACH_SCRIPT,
            "argv": ["sh", "-c", 'echo "$SECRET"; sleep 2'],
            "env": {"SECRET": "s3"},
            "cwd": str(root),
            "job_dir": str(job),
        },
    )
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout)
    assert pid in _host.descendants(proc.pid), "the starter exited; it stays in the host's tree"
    log = job / "node.log"
    wait_for(lambda: log.is_file() and log.read_text().strip() == "s3", 10, "its output")
    wait_for(lambda: (job / "exit_code").is_file(), 10, "its exit code")
    assert (job / "exit_code").read_text().strip() == "0"


def test_a_request_it_cannot_run_is_answered_with_why(
    host: tuple[subprocess.Popen[bytes], Path],
) -> None:
    _, root = host
    done = spawn(
        root,
        {
            "script": DETACH_SCRIPT,
            "argv": ["true"],
            "env": {},
            "cwd": str(root / "missing"),
            "job_dir": str(root / "jobs" / "j2"),
        },
    )
    assert done.returncode == 1
    assert "No such file or directory" in done.stderr
    assert spawn(root, {"argv": "not a list"}).returncode == 1


#: A client that asks the host in its working folder, as `spawn` does, and prints the answer.
ASK = """
import socket, sys
with socket.socket(socket.AF_UNIX) as conn:
    conn.connect("host.sock")
    try:
        conn.sendall(sys.stdin.read().encode() + b"\\n")
        print(conn.makefile("rb").readline().decode() or "no answer")
    except (BrokenPipeError, ConnectionResetError):  # closed before or after it was asked
        print("no answer")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be another user")
def test_another_user_is_not_served_even_where_the_socket_is_open_to_them(
    host: tuple[subprocess.Popen[bytes], Path],
) -> None:
    _, root = host
    root.chmod(0o711)  # as a careless umask, or a shared folder's rules, could leave them
    (root / _host.SOCKET).chmod(0o777)
    marker = root / "pwned"
    request = {
        "script": DETACH_SCRIPT,
        "argv": ["touch", str(marker)],
        "env": {},
        "cwd": "/",
        "job_dir": str(root / "jobs" / "j3"),
    }
    done = subprocess.run(
        ["/usr/bin/python3", "-c", ASK],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=root,
        user=65534,
        group=65534,
        extra_groups=[],
        check=False,
    )
    assert done.stdout.strip() == "no answer", done.stderr
    assert not marker.exists()
    assert not (root / "jobs" / "j3").exists()


def test_on_the_steps_term_the_host_outlives_what_it_started_then_kills_what_stays(
    host: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """Slurm's linuxproc finds a step's processes by their parents: a host that died at once
    would let what takes its time over a TERM out of the tree before the SIGKILL."""
    proc, root = host
    request = {
        "script": DETACH_SCRIPT,
        "argv": ["sh", "-c", "trap '' TERM; sleep 60"],
        "env": {},
        "cwd": str(root),
        "job_dir": str(root / "jobs" / "stubborn"),
    }
    assert spawn(root, request).returncode == 0

    def settled() -> bool:  # the tree as it stays: sleep is the last to start
        return len(_host.descendants(proc.pid)) == 3 and "sleep\n" in commands(proc.pid)

    wait_for(settled, 10, "its subshell, sh and sleep")
    stubborn = _host.descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.8)
    assert proc.poll() is None, "the host lives on while what it started does"
    assert _host.descendants(proc.pid) == stubborn
    assert proc.wait(timeout=10) == 0
    assert not [pid for pid in stubborn if Path(f"/proc/{pid}").exists()], "killed after 1.5 s"


def test_when_the_nodes_folder_goes_the_host_ends_what_it_started_and_itself(
    host: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """Autostop: the node's agent removes the node's folder; the host's end ends the step (and
    with the last node's, the allocation)."""
    proc, root = host
    request = {
        "script": DETACH_SCRIPT,
        "argv": ["sleep", "60"],
        "env": {},
        "cwd": "/",
        "job_dir": str(root.parent / "job"),
    }
    assert spawn(root, request).returncode == 0
    wait_for(lambda: "sleep\n" in commands(proc.pid), 10, "sleep under the host")
    started = _host.descendants(proc.pid)
    shutil.rmtree(root)
    assert proc.wait(timeout=10) == 0
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()], "TERMed with it"


def commands(pid: int) -> list[str]:
    """The command names of `pid`'s descendants (those still there)."""
    names = []
    for child in _host.descendants(pid):
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{child}/comm").read_text())
    return names


def run(root: Path, *argv: str, stdin: str = "", cwd: Path | None = None,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", host_source(), "run", str(root), "--", *argv],
        input=stdin, capture_output=True, text=True, timeout=30, check=False,
        cwd=cwd, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_a_command_run_through_the_host_is_the_clients_own_in_all_but_its_parent(
    host: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    """Its input, output, status, folder and environment are the client's; what it forks to
    outlive it stays the host's descendant (a short step would end it, or lose it)."""
    proc, root = host
    daemon = "(sleep 30 >/dev/null 2>&1 &)"
    script = f'read line; echo "out $line $PWD $ASKED"; echo err >&2; {daemon}; exit 7'
    done = run(root, "sh", "-c", script, stdin="hi\n", cwd=tmp_path, env={"ASKED": "yes"})
    assert (done.returncode, done.stdout, done.stderr) == (7, f"out hi {tmp_path} yes\n", "err\n")
    left = _host.descendants(proc.pid)
    assert any(Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x0030\x00" for pid in left)
    assert run(root, "sh", "-c", "kill -9 $$").returncode == 128 + 9
    missing = run(root, "/no/such/program")
    assert missing.returncode == 127
    assert "No such file or directory" in missing.stderr


def test_a_command_whose_client_goes_is_killed(
    host: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, root = host
    client = subprocess.Popen(
        [sys.executable, "-c", host_source(), "run", str(root), "--", "sleep", "60"]
    )
    wait_for(lambda: any(b"sleep" in Path(f"/proc/{p}/cmdline").read_bytes()
                         for p in _host.descendants(proc.pid)), 10, "the command")  # fmt: skip
    client.kill()
    client.wait()
    wait_for(lambda: not _host.descendants(proc.pid), 10, "the command killed with its client")


#: What Slurm gives a step's task: the node's name, the job's id.
STEP = {"SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "42"}


def start_host(base: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **STEP}
    proc = subprocess.Popen([sys.executable, "-c", host_source(), "serve", str(base), "0"], env=env)
    wait_for(lambda: (base / "node-0" / _host.READY).is_file(), 20, "the host's ready file")
    return proc


def host_verb(
    verb: str, *args: str, stdin: bytes = b"", job: str = "42"
) -> subprocess.CompletedProcess[bytes]:
    source = host_source() if verb in ("ready", "notice") else files_source()
    argv = [sys.executable, "-c", source, verb, *args]
    env = {**os.environ, **STEP, "SLURM_JOB_ID": job}
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=30, env=env, check=False)


def test_a_host_on_a_folder_of_its_own_removes_it_at_its_end_and_one_on_the_login_nodes_keeps_it(
    tmp_path: Path,
) -> None:
    """The login node's folder has its owner.json; a node that does not see it makes a folder
    of its own at the same path, and leaves nothing of it when the allocation ends."""
    own, shared = tmp_path / "own" / "c", tmp_path / "shared" / "c"
    shared.mkdir(parents=True)
    (shared / _host.OWNER).write_text("{}")
    hosts = [start_host(own), start_host(shared)]
    try:
        said = [json.loads(host_verb("ready", str(base)).stdout) for base in (own, shared)]
        assert [(s["index"], s["shared"], s["node"]) for s in said] == [
            (0, False, "n7"),
            (0, True, "n7"),
        ]
        assert said[0]["root"] == str(own / "node-0"), "found by the node's name and the job"
        assert json.loads(host_verb("ready", str(own), job="43").stdout) == {}, "another job's"
        assert json.loads(host_verb("ready", str(tmp_path / "none")).stdout) == {}
    finally:
        for proc in hosts:
            proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=10) for proc in hosts] == [0, 0]
    assert not own.exists(), "the node's own folder, and the cluster's folder left empty"
    assert (shared / "node-0" / _host.READY).is_file(), "the login node's folder is its to remove"


def tar_of(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(folder, arcname="data")
    return buffer.getvalue()


def test_unpack_makes_the_folder_what_the_tar_holds_in_place(tmp_path: Path) -> None:
    source, dest = tmp_path / "source", tmp_path / "node" / "workdir"
    (source / "sub").mkdir(parents=True)
    (source / "train.py").write_text("print(1)\n")
    (source / "sub" / "data.txt").write_text("new\n")
    (dest / "sub").mkdir(parents=True)
    (dest / "sub" / "data.txt").write_text("old\n")
    (dest / "stale.py").write_text("gone\n")
    (dest / "stale").mkdir()
    folder = dest.stat().st_ino
    done = host_verb("unpack", str(dest), stdin=tar_of(source))
    assert done.returncode == 0, done.stderr
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert files == ["sub", "sub/data.txt", "train.py"]
    assert (dest / "sub" / "data.txt").read_text() == "new\n"
    assert dest.stat().st_ino == folder, "in place: a job's folder stays its folder"
    assert [p.name for p in dest.parent.iterdir()] == ["workdir"], "no temporary folder left"
    one = tmp_path / "one.pt"
    one.write_text("weights")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(one, arcname="data")
    assert host_verb("unpack", str(dest / "sub"), stdin=buffer.getvalue()).returncode == 0
    assert (dest / "sub").read_text() == "weights", "a file in place of a folder"


def test_pack_sends_regular_files_and_folders_only_and_no_save_in_progress(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ckpt"
    (folder / "step-2").mkdir(parents=True)
    (folder / "step-2" / "model.pt").write_text("w")
    (folder / "step-3.tmp").write_text("half")
    (folder / "passwd").symlink_to("/etc/passwd")
    os.link(folder / "step-2" / "model.pt", folder / "model.pt")
    os.mkfifo(folder / "pipe")
    done = host_verb("pack", str(folder))
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        assert sorted(tar.getnames()) == ["model.pt", "step-2", "step-2/model.pt"]
        assert all(m.isreg() or m.isdir() for m in tar.getmembers()), "no hard link either"
        saved = tar.getmember("step-2/model.pt").mtime
    exact = (folder / "step-2" / "model.pt").stat().st_mtime_ns / 1e9
    assert abs(saved - exact) < 1e-5, "finer than the second: a save within it is new"
    assert host_verb("pack", str(tmp_path / "none")).returncode == 3


def test_files_are_written_the_users_alone_unless_the_one_named_exists(tmp_path: Path) -> None:
    script, status = tmp_path / "boot" / "bootstrap.sh", tmp_path / "boot" / "status.json"
    request = {"files": {str(script): "echo hi\n"}, "unless": str(status)}
    done = host_verb("files", stdin=json.dumps(request).encode())
    assert done.stdout.decode().strip() == "written", done.stderr
    assert script.read_text() == "echo hi\n"
    assert oct(script.stat().st_mode & 0o777) == "0o600"
    assert oct(script.parent.stat().st_mode & 0o777) == "0o700"
    status.write_text("{}")
    request["files"] = {str(script): "echo again\n"}
    assert (
        host_verb("files", stdin=json.dumps(request).encode()).stdout.decode().strip() == "exists"
    )
    assert script.read_text() == "echo hi\n"
