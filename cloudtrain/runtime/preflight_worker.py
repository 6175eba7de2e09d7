"""The preflight's job on the nodes: ``python -m cloudtrain.runtime.preflight_worker`` under
torchrun, on every node and GPU of a cluster (`cloudtrain.preflight` starts it through the
coordinator, so it uses the job's real rendezvous, network and logs).

Every rank joins the job's process group (nccl on GPU, gloo on CPU, `runtime.init`) and:

1. all-reduces float32 buffers of doubling sizes (``--min-bytes`` to ``--max-bytes``), ``--warmup``
   untimed then ``--iters`` timed calls each, as nccl-tests' ``all_reduce_perf`` does; the time
   of a size is the slowest rank's mean time per call;
2. times every pair of nodes on its own (the nodes' first ranks, a send and a receive of
   ``--pair-bytes`` each way, the pairs of a round at once), so one slow node shows;
3. sends ``--tcp-bytes`` over one plain TCP stream from the first rank on another node (or
   rank 1) to rank 0, on the address the job uses: what the link gives a single socket;
4. on GPU nodes, asks ``nvidia-smi`` for the GPUs' count and health (each node's first rank).

Rank 0 prints each result as one line, `MARK` then a JSON object with its ``kind`` (``meta``,
``gpus``, ``allreduce``, ``pair``, ``tcp``, ``done``); the user's side reads them from the job's
log and judges (`cloudtrain.preflight`). Times only: the bandwidths are computed there. A rank
still running after ``--timeout`` seconds exits 124, so a hung collective ends the job.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cloudtrain.runtime import dist as rt

#: What starts each result line in the job's log.
MARK = "CLOUDTRAIN_PREFLIGHT "
MIB = 1 << 20
#: What ``nvidia-smi`` is asked for, one CSV line per GPU.
SMI_FIELDS = (
    "index,name,pci.bus_id,memory.total,temperature.gpu,ecc.errors.uncorrected.volatile.total"
)
TIMEOUT_EXIT = 124


def _emit(kind: str, **fields: Any) -> None:
    print(MARK + json.dumps({"kind": kind, **fields}, separators=(",", ":")), flush=True)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="preflight_worker")
    parser.add_argument("--min-bytes", type=int, default=MIB)
    parser.add_argument("--max-bytes", type=int, help="default: 1 GiB on GPU, 64 MiB on CPU")
    parser.add_argument("--iters", type=int, help="timed calls per size (GPU 20, CPU 10)")
    parser.add_argument("--warmup", type=int, help="untimed calls first (GPU 5, CPU 2)")
    parser.add_argument("--pair-bytes", type=int, help="default: 64 MiB on GPU, 8 MiB on CPU")
    parser.add_argument("--pair-iters", type=int, default=5)
    parser.add_argument("--tcp-bytes", type=int, default=64 * MIB)
    parser.add_argument("--timeout", type=float, default=600.0)
    return parser.parse_args(argv)


def sizes(low: int, high: int) -> list[int]:
    """`low`, 2·`low`, … up to `high` (each a whole number of float32 elements)."""
    found, size = [], max(4, low - low % 4)
    while size <= high:
        found.append(size)
        size *= 2
    return found


def round_robin(nodes: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Every pair of `nodes` once, in rounds where no node is in two pairs (the circle
    method: n-1 rounds for n nodes, n with a rest for an odd n)."""
    ring: list[int | None] = [*nodes, None] if len(nodes) % 2 else list(nodes)
    rounds = []
    for _ in range(len(ring) - 1):
        pairs = []
        for i in range(len(ring) // 2):
            a, b = ring[i], ring[-1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def job_address() -> str:
    """This node's address on the path to the job's master (``MASTER_ADDR``): the one its
    peers reach it on."""
    master = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master, 9))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])


class Worker:
    """One rank of the preflight."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cuda = torch.cuda.is_available()
        rt.init(timeout_s=args.timeout)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local = rt.local_rank()
        self.node = int(os.environ.get("CLOUDTRAIN_NODE_RANK") or os.environ.get("GROUP_RANK") or 0)
        self.device = torch.device("cuda", self.local) if self.cuda else torch.device("cpu")
        # results travel between ranks on gloo (CPU tensors, Python objects) whatever the
        # collective under test runs on
        backend = dist.get_backend()
        self.ctl = (
            None
            if backend == "gloo"
            else dist.new_group(backend="gloo", timeout=timedelta(seconds=args.timeout))
        )
        me = {
            "rank": self.rank,
            "node": self.node,
            "local": self.local,
            "host": socket.gethostname(),
            "addr": job_address(),
        }
        everyone: list[dict[str, Any]] = [{} for _ in range(self.world)]
        dist.all_gather_object(everyone, me, group=self.ctl)
        self.ranks = everyone
        self.leaders = {
            r["node"]: r["rank"]
            for r in sorted(everyone, key=lambda r: r["rank"])
            if r["local"] == 0
        }

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _slowest(self, seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.ctl)
        return float(value.item())

    def meta(self) -> None:
        if self.rank != 0:
            return
        nodes: dict[int, dict[str, Any]] = {}
        for r in self.ranks:
            entry = nodes.setdefault(
                r["node"], {"node": r["node"], "host": r["host"], "addr": r["addr"], "ranks": 0}
            )
            entry["ranks"] += 1
        nccl = None
        if self.cuda:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
        _emit(
            "meta",
            backend=dist.get_backend(),
            world_size=self.world,
            nodes=sorted(nodes.values(), key=lambda n: n["node"]),
            device=self.device.type,
            torch=torch.__version__,
            nccl=nccl,
            algo=os.environ.get("NCCL_ALGO"),
        )

    def gpus(self) -> None:
        """Each node's GPUs as ``nvidia-smi`` sees them (GPU nodes only)."""
        found: dict[str, Any] | None = None
        if self.cuda and self.local == 0:
            try:
                done = subprocess.run(
                    ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                smi, code = done.stdout + done.stderr, done.returncode
            except (OSError, subprocess.TimeoutExpired) as exc:
                smi, code = f"{type(exc).__name__}: {exc}", -1
            found = {
                "node": self.node,
                "visible": torch.cuda.device_count(),
                "expected": int(os.environ.get("CLOUDTRAIN_GPUS_PER_NODE") or 0),
                "returncode": code,
                "smi": smi,
            }
        every: list[dict[str, Any] | None] = [None] * self.world
        dist.all_gather_object(every, found, group=self.ctl)
        if self.rank == 0:
            for item in every:
                if item is not None:
                    _emit("gpus", **item)

    def allreduce(self) -> None:
        gpu = self.cuda
        high = self.args.max_bytes or (1 << 30 if gpu else 64 * MIB)
        iters = self.args.iters or (20 if gpu else 10)
        warmup = self.args.warmup if self.args.warmup is not None else (5 if gpu else 2)
        for size in sizes(self.args.min_bytes, high):
            buf = torch.zeros(size // 4, dtype=torch.float32, device=self.device)
            for _ in range(warmup):
                dist.all_reduce(buf)
            self._sync()
            dist.barrier(group=self.ctl)
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            self._sync()
            seconds = self._slowest((time.perf_counter() - start) / iters)
            if self.rank == 0:
                _emit("allreduce", bytes=size, seconds=seconds, iters=iters, ranks=self.world)
            del buf

    def pairs(self) -> None:
        """Every pair of nodes on its own: their first ranks send `pair_bytes` to each other
        `pair_iters` times (after one untimed exchange), the pairs of a round at once."""
        size = self.args.pair_bytes or (64 * MIB if self.cuda else 8 * MIB)
        reps = self.args.pair_iters
        buf = torch.zeros(size // 4, dtype=torch.float32, device=self.device)
        mine: list[dict[str, Any]] = []
        for pairs in round_robin(sorted(self.leaders)):
            for a, b in pairs:
                ra, rb = self.leaders[a], self.leaders[b]
                if self.rank not in (ra, rb):
                    continue
                peer = rb if self.rank == ra else ra
                start = 0.0
                for rep in range(reps + 1):
                    if rep == 1:
                        self._sync()
                        start = time.perf_counter()
                    if self.rank == ra:
                        dist.send(buf, peer)
                        dist.recv(buf, peer)
                    else:
                        dist.recv(buf, peer)
                        dist.send(buf, peer)
                self._sync()
                if self.rank == ra:
                    mine.append(
                        {
                            "a": a,
                            "b": b,
                            "bytes": 2 * size * reps,
                            "seconds": time.perf_counter() - start,
                        }
                    )
            dist.barrier(group=self.ctl)
        every: list[list[dict[str, Any]]] = [[] for _ in range(self.world)]
        dist.all_gather_object(every, mine, group=self.ctl)
        if self.rank == 0:
            for found in every:
                for pair in found:
                    _emit("pair", **pair)

    def tcp(self) -> None:
        """One plain TCP stream to rank 0 from the first rank on another node (or rank 1),
        `tcp_bytes` three times; the median time."""
        other = next((r for r in self.ranks if r["node"] != self.ranks[0]["node"]), self.ranks[1])
        sender, size = other["rank"], self.args.tcp_bytes
        listener = None
        where: list[Any] = [None]
        if self.rank == 0:
            listener = socket.create_server((self.ranks[0]["addr"], 0))
            listener.settimeout(self.args.timeout)
            where = [tuple(listener.getsockname()[:2])]
        dist.broadcast_object_list(where, src=0, group=self.ctl)
        result: dict[str, Any] | None = None
        times: list[float] = []
        try:
            for _ in range(3):
                if listener is not None:
                    _receive(listener, size)
                elif self.rank == sender:
                    times.append(_send(where[0], size, self.args.timeout))
        finally:
            if listener is not None:
                listener.close()
        if times:
            result = {
                "bytes": size,
                "seconds": sorted(times)[len(times) // 2],
                "from_node": other["node"],
                "to_node": self.ranks[0]["node"],
                "addr": f"{where[0][0]}:{where[0][1]}",
            }
        every: list[dict[str, Any] | None] = [None] * self.world
        dist.all_gather_object(every, result, group=self.ctl)
        found = next((r for r in every if r is not None), None)
        if self.rank == 0 and found is not None:
            _emit("tcp", **found)

    def run(self) -> None:
        self.meta()
        self.gpus()
        self.allreduce()
        if len(self.leaders) > 1:
            self.pairs()
        if self.world > 1:
            self.tcp()
        if self.rank == 0:
            _emit("done")
        dist.barrier(group=self.ctl)


def _receive(listener: socket.socket, size: int) -> None:
    conn, _ = listener.accept()
    with conn:
        view = memoryview(bytearray(4 * MIB))
        left = size
        while left:
            got = conn.recv_into(view, min(left, len(view)))
            if not got:
                raise ConnectionError(f"the TCP stream ended {left} bytes short")
            left -= got
        conn.sendall(b"k")


def _send(where: tuple[str, int], size: int, timeout: float) -> float:
    """Send `size` bytes to `where` and wait for its one-byte acknowledgement; the seconds
    from the first byte to the acknowledgement."""
    chunk = bytes(4 * MIB)
    with socket.create_connection(where, timeout=timeout) as conn:
        start = time.perf_counter()
        left = size
        while left:
            n = min(left, len(chunk))
            conn.sendall(memoryview(chunk)[:n])
            left -= n
        if conn.recv(1) != b"k":
            raise ConnectionError("the TCP stream's receiver did not acknowledge it")
        return time.perf_counter() - start


def _watchdog(seconds: float) -> None:
    def expire() -> None:
        print(
            f"preflight: still running after {seconds:g} s; giving up", file=sys.stderr, flush=True
        )
        os._exit(TIMEOUT_EXIT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    _watchdog(args.timeout)
    worker = Worker(args)
    try:
        worker.run()
    finally:
        rt.shutdown()


if __name__ == "__main__":
    main()
