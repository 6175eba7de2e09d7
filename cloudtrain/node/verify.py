"""The verify phase's probes, run in the node's Python (which has torch), by the bootstrap's
verify phase (`cloudtrain.node.bootstrap`)::

    python -m cloudtrain.node.verify check GPUS     torch sees GPUS usable GPUs (CPU: 0, and a
                                                    gloo all_reduce: in this process, or across
                                                    the ranks when a launcher runs it)
    python -m cloudtrain.node.verify allreduce      one rank's NCCL all_reduce under
                                                    torch.distributed.run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence


def check(gpus: int) -> None:
    """torch imports; GPU node: CUDA sees `gpus` GPUs and the build has kernels for them; CPU
    node: a gloo all_reduce (importing torch is most of the time), as one rank of a launcher's
    (a CPU node's bootstrap runs it forked from the node's warm server) or alone."""
    import torch

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    if gpus == 0:
        print("CPU node: no GPU to check")
        allreduce(cuda=False)
        return
    if not torch.cuda.is_available():
        sys.exit(f"torch.cuda.is_available() is False, expected {gpus} GPU(s)")
    count = torch.cuda.device_count()
    if count != gpus:
        sys.exit(f"torch sees {count} GPU(s), expected {gpus}")
    arches = torch.cuda.get_arch_list()
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        if f"sm_{major}{minor}" not in arches:
            sys.exit(f"GPU {i} is sm_{major}{minor}; this torch build has kernels for {arches}")
    print(f"{count} GPU(s): {torch.cuda.get_device_name(0)}, kernels for {arches}")


def allreduce(cuda: bool = True) -> None:
    """One all_reduce across the launcher's ranks (NCCL across this node's GPUs, or gloo), or
    with no launcher (no ``LOCAL_RANK``), gloo in this one process."""
    import torch
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        if "LOCAL_RANK" in os.environ and cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            dist.init_process_group("nccl")
            tensor = torch.ones(1, device="cuda")
        elif "LOCAL_RANK" in os.environ:
            dist.init_process_group("gloo")
            tensor = torch.ones(1)
        else:
            store = f"file://{tmp}/store"
            dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
            tensor = torch.ones(1)
        backend, world, rank = dist.get_backend(), dist.get_world_size(), dist.get_rank()
        dist.all_reduce(tensor)
        total = tensor.item()
        dist.destroy_process_group()
    if total != world:
        sys.exit(f"{backend} all_reduce gave {total}, expected {world}")
    if rank == 0:
        print(f"{backend} all_reduce across {world} process(es): ok")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cloudtrain.node.verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="torch sees GPUS usable GPUs (needs torch)")
    p_check.add_argument("gpus", type=int)
    sub.add_parser("allreduce", help="one rank's all_reduce (needs torch)")
    args = parser.parse_args(argv)
    if args.command == "check":
        check(args.gpus)
    else:
        allreduce()
    return 0


if __name__ == "__main__":
    sys.exit(main())
