"""Fixtures shared by every test tier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cloudtrain.cli.main import cli


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
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
