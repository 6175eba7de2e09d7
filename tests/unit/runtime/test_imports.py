"""What `from cloudtrain import runtime` costs a worker: torch, not torch's distributed
checkpoint package (about 1 s of CPU), which loads with the first `save_sharded` or
`load_sharded`."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_sharded_checkpoints_load_on_first_use() -> None:
    code = (
        "import sys\n"
        "from cloudtrain import runtime\n"
        "print('torch.distributed.checkpoint' in sys.modules)\n"
        "from cloudtrain.runtime import save_sharded\n"
        "from cloudtrain.runtime import sharded\n"
        "print(save_sharded is sharded.save_sharded,\n"
        "      runtime.load_sharded is sharded.load_sharded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    from cloudtrain import runtime

    with pytest.raises(AttributeError, match="no attribute 'save_shardedd'"):
        _ = runtime.save_shardedd
