"""The Slurm lab (tests/slurmlab.py) as a fixture for every test tier (tests/conftest.py names
this module): a running two-node cluster per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Shell
from tests.slurmlab import SlurmLab, lab


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmLab]:
    """Nodes n1 and n2 with 8 a100 GPUs each, idle; stopped afterwards, and the test fails
    if any of its processes (a job's included) outlives it."""
    with lab(tmp_path / "slurm") as running:
        yield running


@pytest.fixture
def slurm_sh(slurm: SlurmLab, tmp_path: Path) -> Shell:
    """The CLI as a user on the lab's login node runs it: Slurm's commands reach the lab."""
    shell = Shell(tmp_path / "home")
    shell.env.update(slurm.env)
    return shell
