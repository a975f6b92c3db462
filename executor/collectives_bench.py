"""Collective benchmarks for the profiler, run on every rank with the job's own backend and
device (gloo on CPU tensors, NCCL on GPU tensors): all-reduce, all-gather and reduce-scatter
bus bandwidth per group size and layout, p2p bandwidth per pipeline degree,
compute/communication overlap."""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


DEVICE = {"name": "cpu"}
"""Where the benchmark buffers live (set by measure_collectives for this rank)."""


def _sync() -> None:
    if DEVICE["name"].startswith("cuda"):
        torch.cuda.synchronize()


def _buffer(numel: int) -> torch.Tensor:
    return torch.ones(numel, device=DEVICE["name"])


def _timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=DEVICE["name"])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    return float(t)


def _groups(world: int, size: int, consecutive: bool) -> list[list[int]]:
    if consecutive:
        return [list(range(i, i + size)) for i in range(0, world, size)]
    stride = world // size
    return [list(range(j, world, stride)) for j in range(stride)]


BUS_FACTOR = {"all_reduce": lambda g: 2 * (g - 1) / g, "all_gather": lambda g: (g - 1) / g,
              "reduce_scatter": lambda g: (g - 1) / g}
"""Bytes each rank moves per byte of the full buffer, on a ring (nccl-tests' bus bandwidth)."""


def _call(kind: str, nbytes: int, group, size: int):
    """One ``kind`` over ``group`` on an ``nbytes`` buffer (the gathered / reduced whole)."""
    whole = _buffer(nbytes // 4)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(whole, group=group)
    part = _buffer(nbytes // 4 // size)
    whole = whole[:part.numel() * size]
    if kind == "all_gather":
        return lambda: _ALL_GATHER(whole, part, group=group)
    return lambda: _REDUCE_SCATTER(part, whole, group=group)


# torch 2.13 renamed the flat-tensor collectives (the old names warn); older releases have only those
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def bus_table(kind: str, nbytes: int, repeats: int) -> dict[str, float]:
    """Bus bandwidth GB/s of ``kind`` (BUS_FACTOR * bytes / time) keyed '<g>_consec' / '<g>_strided'."""
    world, rank = dist.get_world_size(), dist.get_rank()
    table = {}
    size = 2
    while size <= world:
        for consecutive in (True, False):
            if not consecutive and size == world:
                continue  # the same group as consecutive
            mine = None
            for ranks in _groups(world, size, consecutive):  # every rank creates every group
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = group
            seconds = _timed(_call(kind, nbytes, mine, size), repeats)
            key = f"{size}_{'consec' if consecutive else 'strided'}"
            table[key] = BUS_FACTOR[kind](size) * nbytes / seconds / 1e9
        size *= 2
    return table


def p2p_table(nbytes: int, repeats: int) -> dict[str, float]:
    """Send/recv bandwidth GB/s between neighbouring stages, keyed by pipeline degree."""
    world, rank = dist.get_world_size(), dist.get_rank()
    table = {}
    pp = 2
    while pp <= world:
        stride = world // pp
        buf = _buffer(nbytes // 4)

        def exchange():
            if rank == 0:
                dist.send(buf, stride)
            elif rank == stride:
                dist.recv(buf, 0)
        table[str(pp)] = nbytes / _timed(exchange, repeats) / 1e9
        pp *= 2
    return table


def overlap_coefficient(nbytes: int, repeats: int) -> float:
    """Galvatron's gamma as its formula uses it: compute B and communication C run together
    in max(B, C) + (gamma - 1) min(B, C), so gamma = 1 + (together - max) / min (>= 1)."""
    a = torch.randn(256, 256, device=DEVICE["name"])

    def compute():
        for _ in range(20):
            a @ a
    alone = _timed(compute, repeats)
    buf = _buffer(nbytes // 4)

    def together():
        work = dist.all_reduce(buf, async_op=True)
        compute()
        work.wait()
    both = _timed(together, repeats)
    comm = _timed(lambda: dist.all_reduce(buf), repeats)
    return max(1.0, 1.0 + (both - max(alone, comm)) / min(alone, comm))


def measure_collectives(rank: int, world_size: int, nbytes: int, repeats: int, device: str = "cpu") -> dict:
    """Profile-file fields measured by this world (same result on every rank)."""
    DEVICE["name"] = device
    small = _buffer(1)
    latency = _timed(lambda: dist.all_reduce(small), repeats)
    return {"allreduce_gbytes_per_s": bus_table("all_reduce", nbytes, repeats),
            "collective_gbytes_per_s": {kind: bus_table(kind, nbytes, repeats) for kind in ("all_gather", "reduce_scatter")},
            "allreduce_latency_us": latency * 1e6,
            "p2p_gbytes_per_s": p2p_table(nbytes, repeats),
            "overlap_coefficient": overlap_coefficient(nbytes, repeats)}
