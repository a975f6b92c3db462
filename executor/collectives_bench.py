"""Collective benchmarks for the profiler, run on every rank with the job's own backend and
device (gloo on CPU tensors, NCCL on GPU tensors): all-reduce, all-gather and reduce-scatter
bus bandwidth per group size and layout, p2p bandwidth per pipeline degree,
compute/communication overlap.

``collective_entries`` gives the operations to time; the profiler times them in its rounds
(executor.profile.Timings: every entry once per round, more rounds for the noisy ones), so a
spell of slow transport falls on one repeat of many entries, not on every repeat of one;
``collective_fields`` turns the medians into the profile's fields. Every group comes from one
GroupCache (one process group per set of ranks): on this project's 2-core machine gloo's
transfers stalled for ~40 ms at a time once a dozen groups had been created, so the benchmark
creates each group once, as the executor does.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from executor.parallel.data import ALL_GATHER_FLAT, REDUCE_SCATTER_FLAT
from executor.parallel.layout import GroupCache
from specs import stage_grid

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda g: 2 * (g - 1) / g, "all_gather": lambda g: (g - 1) / g,
              "reduce_scatter": lambda g: (g - 1) / g}
"""Bytes each rank moves per byte of the full buffer, on a ring (nccl-tests' bus bandwidth)."""
OVERLAP_MATMULS = 20
"""256 x 256 matmuls of the overlap probe's compute."""


def rank_sets(world: int, size: int, consecutive: bool) -> list[tuple[int, ...]]:
    """The groups of ``size`` ranks that tile the world, consecutive or strided: a layer's tp
    groups at tp = size (specs.grid)."""
    return list(stage_grid(0, world, size, consecutive).groups("tp"))


def degrees(world: int) -> list[int]:
    """Group sizes (and pipeline degrees) the tables cover: the powers of two > 1 that divide
    the world."""
    return [1 << k for k in range(1, world.bit_length()) if world % (1 << k) == 0]


def layouts(world: int) -> list[tuple[int, bool]]:
    """(group size, consecutive) of every table entry (degrees), strided too where that is
    another group."""
    return [(size, c) for size in degrees(world) for c in (True, False) if c or size < world]


def _layout_key(size: int, consecutive: bool) -> str:
    return f"{size}_{'consec' if consecutive else 'strided'}"


def _call(kind: str, nbytes: int, group, size: int, device: str) -> Callable[[], None]:
    """One ``kind`` over ``group`` on an ``nbytes`` buffer (the gathered / reduced whole)."""
    whole = torch.ones(nbytes // 4, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(whole, group=group)
    part = torch.ones(nbytes // 4 // size, device=device)
    whole = whole[:part.numel() * size]
    if kind == "all_gather":
        return lambda: ALL_GATHER_FLAT(whole, part, group=group)
    return lambda: REDUCE_SCATTER_FLAT(part, whole, group=group)


def _exchange(nbytes: int, stride: int, device: str) -> Callable[[], None]:
    """Rank 0 sends ``nbytes`` to rank ``stride`` (its neighbour stage at pp = world / stride)."""
    buf, rank = torch.ones(nbytes // 4, device=device), dist.get_rank()

    def exchange():
        if rank == 0:
            dist.send(buf, stride)
        elif rank == stride:
            dist.recv(buf, 0)
    return exchange


def _overlap_entries(nbytes: int, device: str) -> dict[str, Callable[[], None]]:
    """Compute alone, an all-reduce alone, and both at once (Galvatron's overlap probe)."""
    a = torch.randn(256, 256, device=device)
    buf = torch.ones(nbytes // 4, device=device)

    def compute():
        for _ in range(OVERLAP_MATMULS):
            a @ a

    def together():
        work = dist.all_reduce(buf, async_op=True)
        compute()
        work.wait()
    return {"overlap/compute": compute, "overlap/comm": lambda: dist.all_reduce(buf), "overlap/together": together}


def collective_entries(world: int, nbytes: int, groups: GroupCache, device: str) -> dict[str, Callable[[], None]]:
    """Key -> operation, for every rank to time together (the same keys, in the same order, on
    every rank; groups are created here, collectively)."""
    small = torch.ones(1, device=device)
    entries: dict[str, Callable[[], None]] = {"all_reduce/latency": lambda: dist.all_reduce(small)}
    for size, consecutive in layouts(world):
        mine = groups.group(rank_sets(world, size, consecutive))
        for kind in COLLECTIVE_KINDS:
            entries[f"{kind}/{_layout_key(size, consecutive)}"] = _call(kind, nbytes, mine, size, device)
    for pp in degrees(world):
        entries[f"p2p/{pp}"] = _exchange(nbytes, world // pp, device)
    return {**entries, **_overlap_entries(nbytes, device)}


def collective_fields(median_ms: dict[str, float], world: int, nbytes: int) -> dict:
    """The profile's collective fields from the entries' median times (ms)."""
    def gbytes_per_s(kind: str) -> dict[str, float]:
        keys = {_layout_key(size, c): size for size, c in layouts(world)}
        return {key: BUS_FACTOR[kind](size) * nbytes / (median_ms[f"{kind}/{key}"] / 1e3) / 1e9
                for key, size in keys.items()}

    p2p = {str(pp): nbytes / (median_ms[f"p2p/{pp}"] / 1e3) / 1e9 for pp in degrees(world)}
    alone, comm, both = (median_ms[f"overlap/{k}"] for k in ("compute", "comm", "together"))
    # Galvatron's gamma as its formula uses it: compute B and communication C run together in
    # max(B, C) + (gamma - 1) min(B, C), so gamma = 1 + (together - max) / min (>= 1)
    gamma = max(1.0, 1.0 + (both - max(alone, comm)) / min(alone, comm))
    return {"allreduce_gbytes_per_s": gbytes_per_s("all_reduce"),
            "collective_gbytes_per_s": {kind: gbytes_per_s(kind) for kind in ("all_gather", "reduce_scatter")},
            "allreduce_latency_us": median_ms["all_reduce/latency"] * 1e3,
            "p2p_gbytes_per_s": p2p,
            "overlap_coefficient": gamma}
