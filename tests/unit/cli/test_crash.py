"""The CLI's last resort: an exception that is no cloudtrain error is one line on stderr, exit 5,
and a crash report (traceback, command line with secrets redacted, versions) for a bug report."""

from __future__ import annotations

import os
import platform
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cloudtrain import __version__
from cloudtrain.cli.main import EXIT_CRASH, REDACTED, crash_report, redact
from cloudtrain.errors import QuotaError
from cloudtrain.plan import catalog
from cloudtrain.plan.catalog import Catalog
from tests.conftest import Cli

LINE = re.compile(
    r"error: unexpected RuntimeError: the catalog broke \(details: (?P<path>/\S+\.txt)\)"
)
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example secret key


def broken(*args: object, **kwargs: object) -> Catalog:
    raise RuntimeError("the catalog broke\nand a second line that is not shown")


def reports(home: Path) -> list[Path]:
    folder = home / "crashes"
    return sorted(folder.iterdir()) if folder.exists() else []


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_unexpected_exception_is_one_line_exit_5_and_a_crash_report(
    run_cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog, "load", broken)
    result = run_cli("gpus", "--provider", "aws")
    assert result.exit_code == EXIT_CRASH == 5
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    found = LINE.fullmatch(lines[0])
    assert found, lines[0]
    path = Path(found["path"])
    assert reports(home) == [path]
    assert re.fullmatch(rf"\d{{8}}T\d{{6}}Z-{os.getpid()}\.txt", path.name)
    assert (mode(path.parent), mode(path)) == (0o700, 0o600)
    text = path.read_text()
    assert f"cloudtrain {__version__}, Python {platform.python_version()}" in text
    assert "command: cloudtrain gpus --provider aws\n" in text
    assert "Traceback (most recent call last):" in text
    assert 'in broken\n    raise RuntimeError("the catalog broke' in text
    assert text.rstrip().endswith(
        "RuntimeError: the catalog broke\nand a second line that is not shown"
    )


def test_a_crash_report_that_cannot_be_written_still_gives_one_line_and_exit_5(
    run_cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_text("a file where the home folder should be")  # works for root too
    monkeypatch.setattr(catalog, "load", broken)
    result = run_cli("gpus")
    assert result.exit_code == 5
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "error: unexpected RuntimeError: the catalog broke (no crash report: "
    )
    assert "Error" in lines[0]  # the OSError's class, e.g. FileExistsError / NotADirectoryError


@pytest.mark.parametrize(
    ("raised", "code", "stderr"),
    [
        (QuotaError("aws", "VcpuLimitExceeded", "raise it"), 3, "error: aws: VcpuLimitExceeded"),
        (KeyboardInterrupt(), 130, "interrupted"),
        (SystemExit(7), 7, ""),
    ],
)
def test_what_is_not_a_crash_keeps_its_exit_code_and_writes_no_report(
    run_cli: Cli,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    code: int,
    stderr: str,
) -> None:
    def load(*args: object, **kwargs: object) -> Catalog:
        raise raised

    monkeypatch.setattr(catalog, "load", load)
    result = run_cli("gpus")
    assert result.exit_code == code
    assert stderr in result.stderr
    assert "unexpected" not in result.stderr
    assert reports(home) == []


@pytest.mark.parametrize(
    ("args", "code", "shown"),
    [
        (["--help"], 0, "Usage: "),
        (["--version"], 0, f"cloudtrain, version {__version__}"),
        (["no-such-command"], 2, "No such command 'no-such-command'"),
        (["gpus", "--no-such-flag"], 2, "No such option '--no-such-flag'"),
    ],
)
def test_clicks_own_exits_are_not_crashes(
    run_cli: Cli, home: Path, args: list[str], code: int, shown: str
) -> None:
    result = run_cli(*args)
    assert result.exit_code == code
    assert shown in result.output
    assert "unexpected" not in result.output
    assert reports(home) == []


def test_the_command_line_in_a_report_hides_secrets() -> None:
    argv = [
        "cloudtrain",
        "up",
        "--client-secret",
        "hunter2",
        "--token=abc",
        "--api-token",
        "t0k3n",
        "--Password",
        "pw",
        "--name",
        "exp1",
        SECRET,
        f"key={SECRET}",
        "AKIAIOSFODNN7EXAMPLE",
        "--secret-file",
        "--name",  # the value of a secret flag, even when it looks like a flag
    ]
    assert redact(argv) == [
        "cloudtrain",
        "up",
        "--client-secret",
        REDACTED,
        f"--token={REDACTED}",
        "--api-token",
        REDACTED,
        "--Password",
        REDACTED,
        "--name",
        "exp1",
        REDACTED,
        f"key={REDACTED}",
        REDACTED,
        "--secret-file",
        REDACTED,
    ]


def test_a_report_redacts_a_secret_key_in_the_traceback_too(tmp_path: Path) -> None:
    try:
        raise ValueError(f"bad key {SECRET}")
    except ValueError as exc:
        path = crash_report(exc, ["cloudtrain", "up", "--password", "pw"], tmp_path / "home")
    text = path.read_text()
    assert SECRET not in text
    assert f"ValueError: bad key {REDACTED}" in text
    assert f"command: cloudtrain up --password {REDACTED}\n" in text


@pytest.mark.integration
def test_a_crash_in_a_real_process(tmp_path: Path) -> None:
    """`python -c` patches a function the command calls, then runs the console script's
    `main`: exit 5, one line on stderr, no traceback there, the report on disk."""
    home = tmp_path / "home"
    script = textwrap.dedent(
        """
        import cloudtrain.plan.catalog

        def broken(*args, **kwargs):
            raise RuntimeError("the catalog broke")

        cloudtrain.plan.catalog.load = broken
        from cloudtrain.cli.main import main

        main(["gpus", "--provider", "aws"])
        """
    )
    env = {**os.environ, "CLOUDTRAIN_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    found = LINE.fullmatch(lines[0])
    assert found, lines[0]
    path = Path(found["path"])
    assert reports(home) == [path]
    named = re.fullmatch(r"\d{8}T\d{6}Z-(\d+)\.txt", path.name)
    assert named
    assert int(named[1]) != os.getpid()  # the child's pid
    assert (mode(path.parent), mode(path)) == (0o700, 0o600)
    text = path.read_text()
    assert "Traceback (most recent call last):" in text
    assert text.rstrip().endswith("RuntimeError: the catalog broke")
    assert "command: cloudtrain gpus --provider aws\n" in text
