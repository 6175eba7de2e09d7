"""``pods/exec`` on the stand-in: the official client's ``stream()`` (v5.channel.k8s.io) and a
bare WebSocket (v4, fragments, ping) get what a real API server and kubelet send."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from typing import Any

from kubernetes.stream import stream

from tests.k8s.fixtures import eventually, phase, pod, quietly, refused
from tests.k8s.standin import StandIn


def running(k8s: StandIn, core: Any, name: str = "box", **spec: Any) -> str:
    k8s.add_node("n1")
    core.create_namespaced_pod("default", pod(name, "sleep", "60", **spec))
    eventually(lambda: phase(core, name) == "Running")
    return name


@dataclass
class Exec:
    """What one exec gave back."""

    stdout: Any
    stderr: Any
    status: dict[str, Any]
    returncode: int | None
    subprotocol: str


def execute(
    core: Any, name: str, command: list[str], stdin: bytes | None = None, **kwargs: Any
) -> Exec:
    """Runs `command` in pod `name` to its end (`stdin` sent, then closed), as
    ``stream(..., _preload_content=False)`` does, and closes the connection."""
    resp = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        "default",
        command=command,
        stdin=stdin is not None,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        binary=stdin is not None,
        **kwargs,
    )
    try:
        if stdin is not None:
            resp.write_stdin(stdin)
            resp.close_channel(0)  # v5: the end of stdin, as `kubectl cp` sends it
        resp.run_forever(timeout=30)
        status = json.loads(resp.peek_channel(3))
        out, err = resp.read_stdout(), resp.read_stderr()
        # the client reads the code from that status; an InternalError carries none
        code = resp.returncode if status.get("reason") != "InternalError" else None
        return Exec(out, err, status, code, resp.subprotocol)
    finally:
        close(resp)


def close(resp: Any) -> None:
    """Closes an exec's connection. (After the server's close frame, websocket-client's
    ``close()`` returns without closing the socket, as it would with a real API server:
    ``shutdown()`` does.)"""
    resp.close()
    resp.sock.shutdown()


def test_stdout_stderr_and_the_exit_code_come_apart(k8s: StandIn, core: Any) -> None:
    name = running(k8s, core)
    done = execute(core, name, ["sh", "-c", "echo out; echo err >&2; pwd; exit 7"])
    assert done.stdout == f"out\n{k8s.pod_dir('default', name)}\n"
    assert done.stderr == "err\n"
    assert done.returncode == 7
    assert done.subprotocol == "v5.channel.k8s.io"
    assert execute(core, name, ["true"]).returncode == 0
    combined = quietly(
        lambda: stream(
            core.connect_get_namespaced_pod_exec, name, "default", command=["echo", "hi"]
        )
    )
    assert combined == "hi\n"
    assert [c.verb for c in k8s.calls(subresource="exec")] == ["create"] * 3


def test_the_status_channel_says_why_a_command_failed(k8s: StandIn, core: Any) -> None:
    name = running(k8s, core)
    assert execute(core, name, ["sh", "-c", "exit 2"]).status == {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: error executing command "
        "[sh -c exit 2], exit code 2",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "2"}]},
    }
    status = execute(core, name, ["no-such-tool", "-x"]).status
    assert (status["reason"], status["code"]) == ("InternalError", 500)
    assert 'exec: "no-such-tool": executable file not found in $PATH' in status["message"]


def test_a_tar_stream_of_megabytes_goes_in_through_stdin(k8s: StandIn, core: Any) -> None:
    name = running(k8s, core)
    big = os.urandom(5 * 1024 * 1024)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, data in (("work/big.bin", big), ("work/train.py", b"print('hi')\n")):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert (
        execute(core, name, ["tar", "xf", "-", "-C", "."], stdin=buffer.getvalue()).returncode == 0
    )
    folder = k8s.pod_dir("default", name)
    assert (folder / "work" / "big.bin").read_bytes() == big
    digest = hashlib.sha256(big).hexdigest()
    assert execute(core, name, ["sha256sum", "work/big.bin"]).stdout.split()[0] == digest
    script = "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    piped = execute(core, name, ["python", "-c", script], stdin=big)
    assert piped.stdout == f"{digest}\n".encode()


def test_exec_is_refused_where_no_container_runs(k8s: StandIn, core: Any) -> None:
    core.create_namespaced_pod("default", pod("nowhere", "sleep", "60"))  # no node: unscheduled
    text = refused(
        lambda: stream(core.connect_get_namespaced_pod_exec, "nowhere", "default", command=["true"])
    )
    assert "Handshake status 400 Bad Request" in text
    assert "pod nowhere does not have a host assigned" in text
    two = pod("two", "sleep", "60")
    two["spec"]["containers"].append(
        {"name": "side", "image": "busybox", "command": ["sleep", "60"]}
    )
    running(k8s, core, "solo")
    core.create_namespaced_pod("default", two)
    eventually(lambda: phase(core, "two") == "Running")
    text = refused(
        lambda: stream(core.connect_get_namespaced_pod_exec, "two", "default", command=["true"])
    )
    assert "a container name must be specified for pod two, choose one of: [c side]" in text
    side = quietly(
        lambda: stream(
            core.connect_get_namespaced_pod_exec,
            "two",
            "default",
            command=["sh", "-c", "echo $HOSTNAME"],
            container="side",
        )
    )
    assert side == "two\n"


def test_an_exec_dies_with_its_pod(k8s: StandIn, core: Any) -> None:
    name = running(k8s, core)
    resp = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        "default",
        command=["sh", "-c", "echo started; exec sleep 60"],
        stdout=True,
        stderr=True,
        _preload_content=False,
    )
    try:
        assert resp.readline_stdout(timeout=10) == "started"
        assert len(k8s.processes()) == 2  # the container's sleep and the exec's
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        resp.run_forever(timeout=10)
        assert resp.returncode == 137  # SIGKILL
    finally:
        close(resp)
    assert k8s.processes() == []


def test_a_daemon_an_exec_started_dies_with_its_pod_whatever_its_session(
    k8s: StandIn, core: Any
) -> None:
    """A process that left its session (``setsid``: a node agent, a warm server) is still the
    container's, as in its cgroup on a real node: the pod's end ends it, and a leak check sees
    it until then."""
    from tests.conftest import unavailable

    if k8s.cluster.kubelet.groups.top is None:
        unavailable("no writable cgroup v1 pids hierarchy here (root is needed)")
    name = running(k8s, core)
    before = set(k8s.processes())
    done = execute(core, name, ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 </dev/null &"])
    assert done.returncode == 0
    daemon = eventually(lambda: set(k8s.processes()) - before)
    assert len(daemon) == 1
    (pid,) = daemon
    assert os.getsid(pid) == pid, "a session of its own"
    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    eventually(lambda: not os.path.exists(f"/proc/{pid}"))
    assert k8s.processes() == []


def test_a_bare_websocket_speaks_v4_with_fragments_and_pings(k8s: StandIn, core: Any) -> None:
    import websocket

    name = running(k8s, core)
    url = k8s.url.replace("http", "ws") + (
        f"/api/v1/namespaces/default/pods/{name}/exec?command=head&command=-c&command=10"
        "&stdin=true&stdout=true&stderr=true"
    )
    ws: Any = websocket.WebSocket()
    ws.connect(
        url,
        header=[f"Authorization: Bearer {k8s.token}"],
        subprotocols=["v4.channel.k8s.io", "channel.k8s.io"],
    )
    assert ws.getsubprotocol() == "v4.channel.k8s.io"
    ws.ping(b"are you there")
    ws.send_frame(websocket.ABNF.create_frame(b"\x00hel", websocket.ABNF.OPCODE_BINARY, fin=0))
    ws.send_frame(websocket.ABNF.create_frame(b"lo", websocket.ABNF.OPCODE_CONT, fin=1))
    ws.send_binary(b"\x00world and more")
    frames: list[tuple[int, bytes]] = []
    while True:
        opcode, frame = ws.recv_data_frame(True)
        frames.append((opcode, frame.data))
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            break
    ws.close()
    ws.shutdown()  # close() returns early once the server's close frame was answered
    assert (websocket.ABNF.OPCODE_PONG, b"are you there") in frames
    data = [d for op, d in frames if op == websocket.ABNF.OPCODE_BINARY]
    assert b"".join(d[1:] for d in data if d[0] == 1) == b"helloworld"
    assert json.loads(data[-1][1:]) == {"metadata": {}, "status": "Success"}


def test_exec_works_while_a_pod_terminates_and_not_after(k8s: StandIn, core: Any) -> None:
    k8s.add_node("n1")
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.5), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    core.create_namespaced_pod("default", pod("slow", "python", "-c", script))
    eventually(lambda: phase(core, "slow") == "Running")
    eventually(lambda: core.read_namespaced_pod_log("slow", "default") == "up\n")
    core.delete_namespaced_pod("slow", "default", grace_period_seconds=30)
    assert core.read_namespaced_pod("slow", "default").metadata.deletion_timestamp
    assert execute(core, "slow", ["echo", "still here"]).stdout == "still here\n"
    eventually(lambda: not core.list_namespaced_pod("default").items)
    text = refused(
        lambda: stream(core.connect_get_namespaced_pod_exec, "slow", "default", command=["true"])
    )
    assert "Handshake status 404 Not Found" in text
