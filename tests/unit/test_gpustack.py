"""The GPU → driver → CUDA → PyTorch wheel table: complete, and never a wheel the GPU can't run."""

from __future__ import annotations

import dataclasses

import pytest

from cloudtrain.boot import gpustack
from cloudtrain.boot.gpustack import TABLE, GpuStack, stack_for
from cloudtrain.plan import catalog


def _cuda(stack: GpuStack) -> tuple[int, int]:
    assert stack.cuda is not None
    major, minor = stack.cuda.split(".")
    return int(major), int(minor)


def test_every_catalog_accelerator_has_a_row() -> None:
    assert set(catalog.load().accelerators()) <= set(TABLE)


def test_rows_agree_with_the_catalog_compute_capability() -> None:
    for row in catalog.load().rows:
        assert TABLE[row.accelerator].compute_capability == row.compute_capability, row


@pytest.mark.parametrize("name", ["V100", "V100-32GB"])
def test_volta_gets_a_cuda_12_build(name: str) -> None:
    stack = stack_for(name)
    assert stack.architecture == "volta"
    assert stack.compute_capability == "7.0"
    assert _cuda(stack) < (13, 0)
    assert stack.torch_index.rsplit("/", 1)[1].startswith("cu12")
    assert stack.torch_index == "https://download.pytorch.org/whl/cu126"
    # R580 is the last driver branch that runs Volta.
    assert stack.driver_branch is not None
    assert int(stack.driver_branch) <= 580


@pytest.mark.parametrize("name", ["A100", "A100-80GB"])
def test_ampere_gets_the_newest_build(name: str) -> None:
    stack = stack_for(name)
    assert stack.architecture == "ampere"
    assert stack.compute_capability == "8.0"
    assert _cuda(stack) == max(_cuda(s) for s in TABLE.values())
    assert stack.torch_index == "https://download.pytorch.org/whl/cu130"
    assert stack.driver_branch == "580"
    assert stack.min_driver == "580.65.06"


def test_index_and_cuda_agree() -> None:
    for stack in TABLE.values():
        major, minor = _cuda(stack)
        assert stack.torch_index.endswith(f"/cu{major}{minor}")


def test_min_driver_is_in_or_below_the_branch() -> None:
    for stack in TABLE.values():
        assert stack.min_driver is not None
        assert stack.driver_branch is not None
        assert int(stack.min_driver.split(".")[0]) <= int(stack.driver_branch)


def test_cpu_gets_the_cpu_index_and_no_driver() -> None:
    stack = stack_for(None)
    assert stack.torch_index == "https://download.pytorch.org/whl/cpu"
    assert stack.architecture == "cpu"
    assert (stack.driver_branch, stack.min_driver, stack.cuda) == (None, None, None)
    assert stack.accelerator is None


@pytest.mark.parametrize(
    ("accelerator", "instance_type", "efa"),
    [
        ("V100-32GB", "p3dn.24xlarge", True),
        ("A100", "p4d.24xlarge", True),
        ("A100-80GB", "p4de.24xlarge", True),
        ("V100", "p3.16xlarge", False),
        ("V100", "p3.2xlarge", False),
        ("A100", "a2-highgpu-8g", False),
        ("A100", "Standard_ND96asr_v4", False),
        ("A100", None, False),
    ],
)
def test_efa_only_on_p3dn_p4d_p4de(accelerator: str, instance_type: str | None, efa: bool) -> None:
    assert stack_for(accelerator, instance_type).efa is efa


def test_efa_types_are_exactly_these() -> None:
    expected = {"p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge"}
    assert expected == gpustack.EFA_INSTANCE_TYPES
    rows = catalog.load().rows
    in_catalog = {r.instance_type for r in rows if stack_for(r.accelerator, r.instance_type).efa}
    assert in_catalog == expected


def test_unknown_accelerator_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="H100") as info:
        stack_for("H100")
    for name in ("V100", "V100-32GB", "A100", "A100-80GB"):
        assert name in str(info.value)


def test_rows_are_frozen_and_the_table_is_read_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        TABLE["A100"].cuda = "12.6"  # type: ignore[misc]
    with pytest.raises(TypeError):
        TABLE["H100"] = TABLE["A100"]  # type: ignore[index]
    # stack_for returns a copy with efa set; the table row keeps efa False.
    assert stack_for("A100", "p4d.24xlarge").efa
    assert not TABLE["A100"].efa
