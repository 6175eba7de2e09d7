"""The local executor for real: subprocesses, streaming, detached processes, incremental sync."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.errors import CommandError
from cloudtrain.executors import base
from cloudtrain.executors.local import LocalExecutor


def test_run_returns_codes_and_streams_lines() -> None:
    ex = LocalExecutor()
    quiet = ex.run(["sh", "-c", "echo out; echo err >&2; exit 4"], env={"X": "1"})
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (4, "out\n", "err\n")
    with pytest.raises(CommandError, match="command exited 4"):
        quiet.check()
    lines: list[str] = []
    loud = ex.run(["sh", "-c", 'echo "$X"; echo two >&2'], env={"X": "a b"}, on_output=lines.append)
    assert lines == ["a b", "two"]
    assert loud.ok


def test_run_times_out_with_a_clear_error() -> None:
    ex = LocalExecutor()
    with pytest.raises(CommandError, match=r"timed out after 0\.3 s"):
        ex.run(["sleep", "5"], timeout=0.3)
    with pytest.raises(CommandError, match="timed out"):
        ex.run(["sleep", "5"], timeout=0.3, on_output=lambda line: None)
    with pytest.raises(CommandError, match="No such file"):
        ex.run(["/no/such/binary"])


def test_a_command_that_sends_too_much_is_stopped_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that lies may answer a command kept whole with gigabytes: past `MAX_OUTPUT` on
    either stream it is stopped and the call fails in one line; below, output comes whole,
    input included."""
    monkeypatch.setattr(base, "MAX_OUTPUT", 1 << 20)
    ex = LocalExecutor()
    started = time.monotonic()
    for stream in ("", ">&2"):
        with pytest.raises(CommandError, match=r"more than 1 MiB on its std(out|err).*stopped"):
            ex.run(["sh", "-c", f"yes {stream}"], timeout=60)
    assert time.monotonic() - started < 30, "stopped at the bound, not at the timeout"
    done = ex.run(["sh", "-c", "head -c 1000000 /dev/zero; cat >&2"], stdin="in" * 1000)
    assert (len(done.stdout), done.stderr) == (1_000_000, "in" * 1000)


def test_start_detached_outlives_the_call_and_records_its_exit(tmp_path: Path) -> None:
    ex = LocalExecutor()
    job = tmp_path / "job"
    pid = ex.start_detached(
        ["sh", "-c", 'echo "hello $WHO"; sleep 0.3; exit 7'],
        env={"WHO": "node"},
        cwd=str(tmp_path),
        job_dir=str(job),
    )
    assert (job / "pid").read_text().strip() == str(pid)
    assert os.getsid(pid) != os.getsid(0), "the job runs in a session of its own"
    deadline = time.monotonic() + 10
    while not (job / "exit_code").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (job / "exit_code").read_text().strip() == "7"
    assert (job / "node.log").read_text() == "hello node\n"


def test_put_copies_only_what_changed_and_honours_ignores(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "pkg").mkdir(parents=True)
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref")
    (src / "data").mkdir()
    (src / "data" / "big.bin").write_text("x" * 100)
    (src / "train.py").write_text("print(1)\n")
    (src / "pkg" / "mod.py").write_text("A = 1\n")
    (src / ".cloudtrainignore").write_text("# large files\ndata/\n*.log\n")
    (src / "run.log").write_text("noise")
    ex = LocalExecutor()
    ex.put(src, str(dst))
    copied = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())
    assert copied == [".cloudtrainignore", "pkg/mod.py", "train.py"]

    before = (dst / "pkg" / "mod.py").stat().st_mtime_ns
    (src / "train.py").write_text("print(2)\n")
    os.utime(src / "train.py", (time.time() + 5, time.time() + 5))
    (src / "pkg" / "mod.py").unlink()
    ex.put(src, str(dst))
    assert (dst / "train.py").read_text() == "print(2)\n"
    assert not (dst / "pkg" / "mod.py").exists(), "files gone from the source go from the node"
    (src / "pkg" / "mod.py").write_text("A = 1\n")
    ex.put(src, str(dst))
    ex.put(src, str(dst))
    assert (dst / "pkg" / "mod.py").stat().st_mtime_ns != before
    single = tmp_path / "one.txt"
    single.write_text("1")
    ex.put(single, str(tmp_path / "copy" / "one.txt"))
    assert (tmp_path / "copy" / "one.txt").read_text() == "1"


def test_fan_out_is_bounded_by_cloudtrain_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from cloudtrain.errors import ConfigError
    from cloudtrain.executors.base import fan_out

    active, most, lock = [0], [0], threading.Lock()
    together = threading.Barrier(3, timeout=30)  # 3 at a time reach it, in 4 rounds

    def work(i: int) -> int:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        together.wait()
        with lock:
            active[0] -= 1
        return i * i

    monkeypatch.setenv("CLOUDTRAIN_PARALLEL", "3")
    assert fan_out(work, list(range(12))) == [i * i for i in range(12)]
    assert most[0] == 3
    monkeypatch.setenv("CLOUDTRAIN_PARALLEL", "0")
    with pytest.raises(ConfigError, match="CLOUDTRAIN_PARALLEL='0': use a positive whole number"):
        fan_out(work, [1, 2])


def test_ctrl_c_reaches_a_fan_out_and_a_join_though_a_worker_thread_got_the_signal() -> None:
    """The kernel may hand the terminal's SIGINT to any thread; Python raises it only in the
    main thread when that runs. Here it is sent to a worker on purpose: the main thread's waits
    still end in KeyboardInterrupt at once, not when the worker's command ends (never, here)."""
    import signal
    import threading

    from cloudtrain.executors.base import fan_out, join

    go, release = threading.Event(), threading.Event()

    def hit_me_and_hang(i: int) -> None:
        if i == 0 and go.wait(60):
            time.sleep(0.5)  # the main thread waits by now
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        release.wait(60)

    def go_then(wait: Callable[[], object]) -> None:
        go.set()  # inside `pytest.raises`: the signal may come before `wait` starts
        wait()

    try:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            go_then(lambda: fan_out(hit_me_and_hang, [0, 1]))
        assert time.monotonic() - started < 10
        go.clear()
        worker = threading.Thread(target=hit_me_and_hang, args=(0,))
        worker.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            go_then(lambda: join(worker))
        assert time.monotonic() - started < 10
    finally:
        release.set()


#: Credential files a careless workdir holds: none of them may reach a node.
PLANTED = (
    ".aws/credentials", ".ssh/id_ed25519", "id_rsa", ".env", ".env.prod", "key.pem",
    ".config/gcloud/application_default_credentials.json", "sub/.netrc", "sub/.git-credentials",
    "deep/er/.ssh/config", ".docker/config.json",
)  # fmt: skip


def plant(src: Path) -> None:
    for rel in (*PLANTED, "train.py", "sub/data.csv", "id_to_label.json"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("secret" if rel in PLANTED else "ok")


def test_credentials_are_never_copied_whatever_the_ignore_file_says(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    plant(src)
    (src / ".cloudtrainignore").write_text("!.env\n")  # no way to ask for them back
    LocalExecutor().put(src, str(dst))
    copied = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())
    assert copied == [".cloudtrainignore", "id_to_label.json", "sub/data.csv", "train.py"]
