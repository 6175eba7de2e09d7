"""The SSH executor against real sshd hosts on 127.0.0.2 and 127.0.0.3."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import access
from cloudtrain.errors import CommandError, ProviderError
from cloudtrain.executors.base import fan_out
from cloudtrain.executors.ssh import SshExecutor
from tests.sshd import SshHost, cluster_hosts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[SshHost]]]:
    """Two hosts presenting the cluster's host key, the cluster's key authorised on both."""
    with cluster_hosts(tmp_path_factory.mktemp("ssh"), "127.0.0.2", "127.0.0.3") as made:
        yield made


def executor(home: Path, host: SshHost, **kwargs: Any) -> SshExecutor:
    return SshExecutor(
        host.host, user="root", port=host.port, options=access.ssh_options(home, "c1"), **kwargs
    )


SHOW = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('ODD')]))"
HOSTILE = ["two words", "$(touch /tmp/ct-pwned)", "a;b", "q'uote", 'd"q', "new\nline", "`id`",
           "*", "", "--"]  # fmt: skip


def test_argv_env_input_and_cwd_arrive_verbatim_and_nothing_else_runs(
    hosts: tuple[Path, list[SshHost]], tmp_path: Path
) -> None:
    home, (host, _) = hosts
    ex = executor(home, host)
    odd = "x y $HOME `id` $(date) ' \" ;\n"
    try:
        done = ex.run([sys.executable, "-c", SHOW, *HOSTILE], env={"ODD": odd}, cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [HOSTILE, odd]
        assert not Path("/tmp/ct-pwned").exists()
        assert ex.run(["pwd"], cwd=str(tmp_path)).stdout.strip() == str(tmp_path)
        assert ex.run(["sh", "-c", "exit 7"]).returncode == 7
        assert ex.run(["cat"], stdin=odd).stdout == odd, "input as given"
    finally:
        ex.close()


def command_lines() -> str:
    """Every process's command line on this machine, which is both laptop and node here."""
    return "\n".join(
        (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and (p / "cmdline").exists()
    )


def test_env_values_show_in_no_command_line_on_either_side(
    hosts: tuple[Path, list[SshHost]], tmp_path: Path
) -> None:
    """An env value (a token) travels in the script on ssh's stdin: while the command runs,
    neither the local ssh nor the node's shell nor the command shows it in `ps`."""
    home, (host, _) = hosts
    ex = executor(home, host)
    secret = "hf_" + os.urandom(8).hex()
    flag = tmp_path / "running"
    lines: list[str] = []
    try:
        waiting = f"touch {flag}; sleep 2; echo ${{TOKEN:+seen}}"
        runner = threading.Thread(
            target=lambda: lines.append(
                ex.run(["sh", "-c", waiting], env={"TOKEN": secret}).stdout.strip()
            )
        )
        runner.start()
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists()
        assert secret not in command_lines()
        runner.join(30)
        assert lines == ["seen"], "the command still got it"
        job = tmp_path / "job"
        ex.start_detached(["sh", "-c", f"touch {flag}.d; sleep 2"], env={"TOKEN": secret},
                          cwd=str(tmp_path), job_dir=str(job))  # fmt: skip
        while not Path(f"{flag}.d").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert secret not in command_lines()
    finally:
        ex.close()


def test_streaming_and_timeouts(hosts: tuple[Path, list[SshHost]]) -> None:
    home, (host, _) = hosts
    ex = executor(home, host)
    lines: list[str] = []
    ex.run(["sh", "-c", "echo one; echo two >&2; echo three"], on_output=lines.append)
    assert lines[0] == "one"  # stdout in order; stderr is its own channel over SSH
    assert sorted(lines) == ["one", "three", "two"]
    with pytest.raises(CommandError, match="timed out"):
        ex.run(["sleep", "30"], timeout=1)
    ex.close()
    ex.close()  # idempotent


def test_a_detached_process_outlives_the_connection(
    hosts: tuple[Path, list[SshHost]], tmp_path: Path
) -> None:
    home, (host, _) = hosts
    ex = executor(home, host)
    job = tmp_path / "jobs" / "j1"
    pid = ex.start_detached(["sh", "-c", 'sleep 1; echo "done $WHO"; exit 3'],
                            env={"WHO": "node"}, cwd=str(tmp_path), job_dir=str(job))  # fmt: skip
    ex.close()  # the laptop goes away
    assert pid > 1
    deadline = time.monotonic() + 20
    while not (job / "exit_code").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (job / "exit_code").read_text().strip() == "3"
    assert (job / "node.log").read_text() == "done node\n"


def test_put_syncs_only_what_changed(hosts: tuple[Path, list[SshHost]], tmp_path: Path) -> None:
    home, (host, _) = hosts
    ex = executor(home, host)
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "HEAD").write_text("x")
    (src / "data").mkdir()
    (src / "data" / "big.bin").write_bytes(os.urandom(1000))
    (src / ".cloudtrainignore").write_text("data/\n")
    (src / "train.py").write_text("print(1)\n")
    (src / "old.py").write_text("")
    ex.put(src, str(dst))
    assert sorted(p.name for p in dst.iterdir()) == [".cloudtrainignore", "old.py", "train.py"]
    stamp = (dst / "train.py").stat().st_ino
    (src / "old.py").unlink()
    ex.put(src, str(dst))
    assert not (dst / "old.py").exists()
    assert (dst / "train.py").stat().st_ino == stamp, "an unchanged file is not copied again"
    ex.close()


def test_put_never_copies_credentials(hosts: tuple[Path, list[SshHost]], tmp_path: Path) -> None:
    from tests.unit.executors.test_local import plant

    home, (host, _) = hosts
    ex = executor(home, host)
    src, dst = tmp_path / "src", tmp_path / "dst"
    plant(src)
    ex.put(src, str(dst))
    copied = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())
    assert copied == ["id_to_label.json", "sub/data.csv", "train.py"]
    ex.close()


def test_put_copies_what_the_local_walk_lists(
    hosts: tuple[Path, list[SshHost]], tmp_path: Path
) -> None:
    """Over ssh, rsync is told the ignore rules the local walk (and the size shown) use: every
    folder's .gitignore, the .cloudtrainignore, the credentials."""
    from tests.unit.executors.test_sync_listing import CLOUDTRAINIGNORE, COPIED, GITIGNORE, TREE

    home, (host, _) = hosts
    src, dst = tmp_path / "src", tmp_path / "dst"
    for rel, text in {
        **TREE,
        ".gitignore": GITIGNORE,
        ".cloudtrainignore": CLOUDTRAINIGNORE,
    }.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    ex = executor(home, host)
    try:
        ex.put(src, str(dst))
    finally:
        ex.close()
    assert {p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()} == COPIED


def test_fan_out_over_hosts(hosts: tuple[Path, list[SshHost]]) -> None:
    home, up = hosts
    executors = [executor(home, h) for h in up]
    outputs = fan_out(lambda ex: ex.run(["hostname", "-I"]).returncode, executors)
    assert outputs == [0, 0]
    for ex in executors:
        ex.close()


def test_a_wrong_host_key_is_refused_with_a_clear_error(
    hosts: tuple[Path, list[SshHost]], tmp_path: Path
) -> None:
    _, (host, _) = hosts
    stranger = tmp_path / "home"
    access.cluster_key(stranger, "c1")
    access.known_hosts(stranger, "c1", [host.address])  # another cluster's host key
    ex = SshExecutor(host.host, user="root", port=host.port,
                     options=[*access.ssh_options(stranger, "c1")])  # fmt: skip
    with pytest.raises(ProviderError, match="did not present the cluster's pinned host key"):
        ex.run(["true"])


def test_an_unreachable_host_is_named_after_bounded_retries(
    hosts: tuple[Path, list[SshHost]],
) -> None:
    home, (host, _) = hosts
    ex = SshExecutor("127.0.0.9", user="root", port=host.port, connect_timeout_s=1,
                     retry_s=0.2, options=access.ssh_options(home, "c1"))  # fmt: skip
    started = time.monotonic()
    with pytest.raises(ProviderError, match=r"cannot reach root@127\.0\.0\.9:\d+ after 1 s"):
        ex.run(["true"])
    assert time.monotonic() - started < 15


def test_a_live_connection_is_never_reused_under_another_known_hosts(
    hosts: tuple[Path, list[SshHost]], tmp_path: Path
) -> None:
    home, (host, _) = hosts
    trusted = executor(home, host)
    assert trusted.run(["true"]).returncode == 0  # a master is up for this host now
    stranger = tmp_path / "home"
    access.cluster_key(stranger, "c1")
    access.known_hosts(stranger, "c1", [host.address])
    other = SshExecutor(host.host, user="root", port=host.port,
                        options=access.ssh_options(stranger, "c1"))  # fmt: skip
    with pytest.raises(ProviderError, match="did not present the cluster's pinned host key"):
        other.run(["true"])
    trusted.close()


def test_a_node_without_a_public_address_is_reached_through_the_head(
    hosts: tuple[Path, list[SshHost]],
) -> None:
    """What AWS does for multi-card nodes: ssh hops through the head (here 127.0.0.7) with the
    cluster's key and pinned host keys, so a node is unreachable once the head is gone."""
    home, (_, node) = hosts
    host_private, user_public = access.host_key(home, "c1")[0], access.cluster_key(home, "c1")[1]
    head = SshHost(home.parent / "head", "127.0.0.7", host_private, user_public)
    access.known_hosts(home, "c1", [h.address for h in (*hosts[1], head)])
    options = access.ssh_options(home, "c1")
    hop = access.jump_options(options, head.host, "root", head.port)
    through = SshExecutor(node.host, user="root", port=node.port, options=[*options, *hop],
                          connect_timeout_s=1, retry_s=0.2)  # fmt: skip
    try:
        assert through.run(["echo", "hello"]).stdout == "hello\n"
        through.close()
        head.stop()
        with pytest.raises(ProviderError, match=r"cannot reach root@127\.0\.0\.3"):
            through.run(["true"])
    finally:
        head.stop()
        access.known_hosts(home, "c1", [h.address for h in hosts[1]])


def test_get_copies_a_nodes_folder_back_and_says_when_there_is_none(
    hosts: tuple[Path, list[SshHost]], tmp_path: Path
) -> None:
    home, (host, _) = hosts
    remote = tmp_path / "node" / "checkpoints"
    (remote / "sub").mkdir(parents=True)
    (remote / "model.pt").write_text("weights")
    (remote / "sub" / "opt.pt").write_text("state")
    ex = executor(home, host)
    try:
        assert ex.get(str(tmp_path / "no-such-folder"), tmp_path / "never") is False
        assert not (tmp_path / "never").exists()
        local = tmp_path / "back"
        second = 1_796_000_000 * 10**9  # a save, then another of the same size in that second
        os.utime(remote / "model.pt", ns=(second, second + 100_000_000))
        assert ex.get(str(remote), local) is True
        assert (local / "model.pt").read_text() == "weights"
        (remote / "model.pt").write_text("weight2")
        os.utime(remote / "model.pt", ns=(second, second + 900_000_000))
        assert ex.get(str(remote), local) is True
        assert (local / "model.pt").read_text() == "weight2", "compared to the nanosecond"
        (remote / "model.pt").unlink()
        assert ex.get(str(remote), local) is True
        assert sorted(p.name for p in local.rglob("*")) == ["opt.pt", "sub"], "made equal"
    finally:
        ex.close()
