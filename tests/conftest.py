"""Fixtures shared by every test tier."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from click.testing import CliRunner, Result

from cloudtrain.cli.main import cli


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background by a non-interactive shell (``pytest &``, nohup)
    inherits SIGINT ignored, and so would every process it starts: the CLI's Ctrl-C, which
    the tests of the terminal send, would then do nothing and they would hang. A handler of
    our own becomes the default again in every program these processes run."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionstart(session: pytest.Session) -> None:
    """cloudtrain's bytecode, written once before any test: the suite starts hundreds of
    Pythons (the CLI, node commands, agents) from this checkout, and where the environment sets
    ``PYTHONDONTWRITEBYTECODE`` (this project's machines do) each would compile every module it
    imports from source again (≈0.15 s of CPU for the controller's). Reading bytecode is
    allowed there; only writing it is not."""
    import compileall

    import cloudtrain

    if not hasattr(session.config, "workerinput"):  # xdist's workers: the controller did it
        compileall.compile_dir(Path(cloudtrain.__file__).parent, quiet=1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No child of pytest's own outlives the run: multiprocessing joins its children at exit,
    and one that hangs (a test that timed out while it waited for it) would hold the whole run
    open past CI's limit instead of failing one test."""
    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)


#: The tests of real processes: jobs of torch processes that take a core or two each, timed
#: against their clocks, and the ssh hosts' one home.
PROCESSES = "tests/integration/"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of real processes first: under xdist they are the longest piece of work."""
    items.sort(key=lambda item: not item.nodeid.startswith(PROCESSES))


#: The tests of real processes that mostly wait (on a clock, an sshd, a stand-in) and train
#: nothing (their scripts sleep, print or exit; at most torchrun's agents import torch, or pip
#: fills a node's venv): they run as one more piece of work, on the other worker, beside the
#: rest, so that it does not sit idle while the first one runs the jobs that train.
BESIDE = frozenset(
    f"{PROCESSES}test_{name}.py"
    for name in (
        "agent_gone",
        "anywhere",
        "autostop",
        "cost_events",
        "dry_run_offline",
        "host_keys",
        "hostile_input",
        "interrupted_records",
        "job_end",
        "killed",
        "limits_hold",
        "logs_tail",
        "node_data",
        "preemption_notices",
        "private_nodes",
        "recovery_faults",
        "resident_agent",
        "selfstop_jobs",
        "ssh_executor",
        "ssh_install",
        "terminal_safety",
        "warm_secrets",
        "watcher_survives",
    )
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under xdist (`-n 2`, pyproject's addopts) the tests of real processes run one at a time
    on one worker, in order, while the other worker runs `BESIDE`'s, then everything else: two
    jobs of torch ranks at once on 2 cores only slow each other past their clocks. (xdist's own
    `loadgroup` would say the same with a marker, but its group never reaches the scheduler
    under pytest 9.) xdist hands out the largest piece of work first: the jobs, then `BESIDE`."""
    from xdist.scheduler import LoadScopeScheduling

    class ProcessesOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::")[0] in BESIDE:
                return f"{PROCESSES}:beside"
            return PROCESSES if nodeid.startswith(PROCESSES) else nodeid

    return ProcessesOnOneWorker(config, log)


#: Under xdist, each worker's tests and the seconds they took (setup, call and teardown):
#: which worker the suite's wall time waits for, so that the two can be balanced (`BESIDE`).
_WORKERS: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # xdist's controller: the worker that ran it
    gateway = getattr(node, "gateway", None)
    if gateway is None:
        return
    spent = _WORKERS.setdefault(str(gateway.id), [0.0, 0.0])
    spent[0] += report.duration
    spent[1] += report.when == "call"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for worker, (seconds, tests) in sorted(_WORKERS.items()):
        terminalreporter.write_line(f"{worker}: {tests:.0f} tests in {seconds:.0f} s")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test may reach beyond this machine: cloud SDKs and the "what is my IP" lookup are
    pointed at a closed loopback port unless a test points them at a local stand-in. No test
    reads the developer's own CLOUDTRAIN_HOME either (an updated catalog there, say)."""
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    closed = "http://127.0.0.1:9"
    monkeypatch.setenv("CLOUDTRAIN_PUBLIC_IP_URL", closed)
    monkeypatch.setenv("CLOUDTRAIN_SSH_LOOPBACK_ONLY", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(name, raising=False)
    # GCP and Azure: their endpoints, and the places their SDKs look for credentials
    monkeypatch.setenv("CLOUDTRAIN_GCP_ENDPOINT", closed)
    monkeypatch.setenv("CLOUDTRAIN_AZURE_ENDPOINT", closed)
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", closed)
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", closed)  # else IMDS, 169.254.169.254
    # the checkpoint stores: GCS's emulator variable and Azure Blob's endpoint, closed too
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", closed)
    monkeypatch.setenv("CLOUDTRAIN_AZURE_BLOB_ENDPOINT", closed + "/{account}")
    for name in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUDSDK_CORE_PROJECT",
        "GOOGLE_CLOUD_PROJECT",
        "AZURE_SUBSCRIPTION_ID",
        "AZURE_CLIENT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_TENANT_ID",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_ACCOUNT",
    ):
        monkeypatch.delenv(name, raising=False)


#: What `my_ip_url` says this machine's public address is (TEST-NET-2: routes nowhere).
MY_ADDRESS = "198.51.100.9"


@pytest.fixture
def my_ip_url() -> Iterator[str]:
    """The URL of a "what is my IP" service on loopback that answers `MY_ADDRESS`; set it as
    ``CLOUDTRAIN_PUBLIC_IP_URL`` to test SSH being opened to the caller's address."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class MyIp(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(f"{MY_ADDRESS}\n".encode())

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), MyIp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh CLOUDTRAIN_HOME for one test."""
    path = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(path))
    return path


class Cli:
    """Runs the CLI in-process, as a user would type it."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str) -> Result:
        return self.runner.invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def run_cli(home: Path) -> Cli:
    return Cli()


# the cloud stand-ins, for tests/<cloud> and the contract suite; the Slurm lab
pytest_plugins = [
    "tests.aws.fixtures",
    "tests.aws.s3",
    "tests.gcp.fixtures",
    "tests.gcp.storage",
    "tests.azure.fixtures",
    "tests.azure.blob",
    "tests.slurm.fixtures",
    "tests.k8s.fixtures",
]


def unavailable(message: str) -> NoReturn:
    """Something a test needs is missing: a skip on a developer's machine, a failure in CI
    (CI=true), where .ci/run provides it, so a test can never silently stop testing there."""
    import os

    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def require_tool(path_or_name: str) -> str:
    """The tool's path; missing: `unavailable`."""
    import os
    import shutil

    found = shutil.which(path_or_name) or (path_or_name if os.path.exists(path_or_name) else None)
    if found is None:
        unavailable(f"{path_or_name} is not installed (.ci/run installs it from Debian)")
    return found
