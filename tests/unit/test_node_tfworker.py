"""`cloudtrain.node.tfworker`: the worker's own address read from TF_CONFIG, and real listeners
bound where it says. The redirection is tried on Python's own socket library (whose ``bind``
is the C library's, imported as TensorFlow's is), in a new interpreter; TensorFlow's own server
is tested end to end in tests/integration/test_tf_runtime.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cloudtrain.jobs.runtimes.tensorflow import tensorflow_command
from cloudtrain.node.tfworker import own_host


def config(workers: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def test_the_own_address_is_the_tasks_in_the_cluster() -> None:
    both = ["10.0.0.5:2001", "10.0.0.6:3001"]
    assert own_host(config(both, 0)) == "10.0.0.5"
    assert own_host(config(both, 1)) == "10.0.0.6"
    assert own_host(config(["[fd00::5]:2001"], 0)) == "fd00::5"
    assert own_host(config(["localhost:2001"], 0)) in ("127.0.0.1", "::1")
    for bad in (None, "", "{", "[]", config(both, 2), '{"cluster": {}, "task": {}}'):
        assert own_host(bad) is None, bad


def redirected(host: str, then: str) -> subprocess.CompletedProcess[str]:
    """A new interpreter whose socket library's ``bind`` goes to `host`, running `then`."""
    code = (
        "import _socket, socket\n"
        "from pathlib import Path\n"
        "from cloudtrain.node import tfworker\n"
        f"print(tfworker.redirect_bind(Path(_socket.__file__).parent, {host!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code + textwrap.dedent(then)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def _socket_is_a_library() -> None:
    import _socket

    if not getattr(_socket, "__file__", None):
        pytest.skip("this Python's socket module is built in: no library to redirect")


@pytest.mark.usefixtures("_socket_is_a_library")
def test_a_wildcard_bind_in_a_redirected_library_listens_on_the_address_alone() -> None:
    done = redirected(
        "127.0.0.1",
        """
        v4 = socket.socket(socket.AF_INET)
        v4.bind(("0.0.0.0", 0))
        print(v4.getsockname()[0])
        named = socket.socket(socket.AF_INET)
        named.bind(("127.0.0.2", 0))
        print(named.getsockname()[0])
        v6 = socket.socket(socket.AF_INET6)
        try:
            v6.bind(("::", 0))
        except OSError as exc:
            print(exc.errno == 99)  # EADDRNOTAVAIL: gRPC goes on to 0.0.0.0
        """,
    )
    assert done.returncode == 0, done.stderr
    changed, v4, named, v6 = done.stdout.split()
    assert int(changed) >= 1
    assert v4 == "127.0.0.1"  # not every interface
    assert named == "127.0.0.2"  # an address asked for is left alone
    assert v6 == "True"


@pytest.mark.usefixtures("_socket_is_a_library")
def test_an_address_this_machine_lacks_falls_back_to_every_interface_and_says_so() -> None:
    done = redirected(
        "192.0.2.7",  # TEST-NET-1: no machine's
        """
        s = socket.socket()
        s.bind(("", 0))
        print(s.getsockname()[0])
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1] == "0.0.0.0"
    assert "192.0.2.7 is not an address of this machine" in done.stderr


def test_the_worker_runs_the_script_as_python_does_with_legacy_keras(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import json, os, sys\n"
        "print(json.dumps([__name__, __file__, sys.argv, sys.path[0],\n"
        "                  os.environ.get('TF_USE_LEGACY_KERAS')]))\n"
    )
    argv = tensorflow_command([str(script), "--epochs", "2"], sys.executable)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        "__main__",
        str(script),
        [str(script), "--epochs", "2"],
        str(tmp_path),
        "1",
    ]
    own = {"TF_USE_LEGACY_KERAS": "0", "PATH": "/usr/bin:/bin"}
    told = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=own)
    assert json.loads(told.stdout)[-1] == "0"  # the job's own setting wins


def test_a_command_is_refused_under_the_tensorflow_runtime() -> None:
    from cloudtrain.errors import ConfigError

    module = tensorflow_command(["--module", "pkg.train", "-x"], "/py")
    assert module == ["/py", "-m", "cloudtrain.node.tfworker", "-m", "pkg.train", "-x"]
    with pytest.raises(ConfigError, match="runtime tensorflow runs a Python script or module"):
        tensorflow_command(["--no-python", "bash", "go.sh"], "/py")
