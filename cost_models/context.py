"""Context parallelism's attention traffic: the K/V ring (p2p, a2a+p2p) hidden behind the blockwise
attention core, the all-gather variant, their buffers, and the causal imbalance of contiguous chunks.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

from cost_models.ops import Op
from cost_models.sequence import attention_core_ops
from specs import CPComm, LayerSpec, LayerStrategy, RankGroups, Recompute, layer_grid

BYTES_PER_ACTIVATION = 2
CollectiveFn = Callable[[str, float, Sequence[Sequence[int]]], float]


@dataclass(frozen=True)
class CPTime:
    """What context parallelism adds to one micro-batch of one layer (seconds)."""

    comm_s: float = 0.0
    """K/V traffic not hidden behind the attention core: forward, backward and a recomputed
    forward (reruns_core: the recomputed core re-runs the ring)."""
    unbalanced_s: float = 0.0
    """Extra attention-core time on the critical path when the tokens are in contiguous chunks
    (a plan's ``cp_load_balance`` none) under a causal mask; 0 otherwise."""
    core_fwd_s: float = 0.0
    """The rank's attention core in forward, load-balanced (what the ring overlaps)."""
    core_bwd_s: float = 0.0
    """The same in backward."""


def blockwise_ops(ops: Sequence[Op]) -> list[Op]:
    """The forward kernels a ring runs block by block: the attention core (QK^T, softmax, its
    dropout, attention over V) or the fused flash-attention kernel that holds all of them."""
    return [op for op in ops if op.name == "flash_attn"] + attention_core_ops(
        [op for op in ops if not op.name.startswith("x_")])


@lru_cache(maxsize=65536)
def cp_groups(first_rank: int, strategy: LayerStrategy) -> RankGroups:
    """The layer's context-parallel groups (the ring's ranks, in ring order); cached: every
    micro-batch size of a cp strategy asks for them."""
    return layer_grid(first_rank, strategy.degrees).groups("cp")


def kv_block_bytes(layer: LayerSpec, strategy: LayerStrategy, mbs: int) -> float:
    """One rank's K and V block: its s / cp tokens (after a2a+p2p's all-to-all too: the Ulysses
    group holds the cp chunk, split by heads) for its kv heads. GQA: kv heads / (tp * ulysses),
    at least one (a rank with fewer kv heads than its share of query heads keeps a copy)."""
    d = strategy.degrees
    kv_heads = max(1.0, layer.kv_heads / (d.tp * d.ulysses))
    tokens = mbs * layer.seq_len / d.cp
    return 2 * tokens * kv_heads * layer.head_size * BYTES_PER_ACTIVATION


def ring_step_s(collective: CollectiveFn, block_bytes: float, groups: RankGroups, cp: int) -> float:
    """One ring step: every rank sends one block to its neighbour at once. A ring all-gather of
    cp blocks is exactly cp - 1 such steps over the same edges, so one step is that time / (cp - 1)."""
    return collective("all_gather", cp * block_bytes, groups) / (cp - 1)


def cp_time(collective: CollectiveFn, layer: LayerSpec, strategy: LayerStrategy, mbs: int,
            first_rank: int, core_fwd_s: float, core_bwd_s: float) -> CPTime:
    """Context parallelism's time for one micro-batch, given the rank's attention-core compute
    (forward, backward; load-balanced, recomputation excluded).

    p2p and a2a+p2p (TransformerEngine's ring, as Megatron-Core runs it): forward runs cp steps,
    step i attends to the block in hand while the next block travels; cp - 1 steps carry a block
    of c seconds beside a compute of a_f = core_fwd / cp, so forward exposes (cp - 1) max(0, c - a_f).
    Backward sends the K/V block and the gradient block travelling with it (2c per step) beside
    a_b = core_bwd / cp, and the last dK/dV block returns to its owner after the loop:
    (cp - 1) max(0, 2c - a_b) + c. A recomputed core (reruns_core) runs the forward ring again.

    all_gather: the whole sequence's K/V gathered before the core (not overlapped) in forward,
    again in backward with a reduce-scatter of their gradients.

    Without load balancing a causal mask gives rank r of cp contiguous chunks r + 1/2 blocks of
    work, and each step waits for the busiest rank: cp - 1/2 blocks on the critical path against
    cp / 2 balanced, so the core takes (2 cp - 1) / cp of its balanced time: (cp - 1) / cp more."""
    cp = strategy.cp
    if cp <= 1:
        return CPTime()
    groups = cp_groups(first_rank, strategy)
    block = kv_block_bytes(layer, strategy, mbs)
    rerun = reruns_core(layer, strategy)
    if strategy.cp_comm == CPComm.ALL_GATHER:
        gather = collective("all_gather", cp * block, groups)
        scatter = collective("reduce_scatter", cp * block, groups)
        comm = gather + (gather + scatter) + (gather if rerun else 0.0)
    else:
        step = ring_step_s(collective, block, groups, cp)
        fwd, bwd = max(0.0, step - core_fwd_s / cp), max(0.0, 2 * step - core_bwd_s / cp)
        comm = (cp - 1) * (fwd * (2 if rerun else 1) + bwd) + step
    unbalanced = (core_fwd_s * (2 if rerun else 1) + core_bwd_s) * (imbalance(layer, cp) - 1)
    return CPTime(comm_s=comm, unbalanced_s=unbalanced, core_fwd_s=core_fwd_s, core_bwd_s=core_bwd_s)


def reruns_core(layer: LayerSpec, strategy: LayerStrategy) -> bool:
    """Whether backward runs the attention core's forward again (and with it the ring): full
    recomputation, or selective and selective-op on an unfused core (a fused flash kernel is
    not re-run; under selective-op its ring's exchanges are taken as kept with it)."""
    return strategy.recompute == Recompute.FULL or (strategy.recompute != Recompute.NONE
                                                    and layer.attention != "flash")


def imbalance(layer: LayerSpec, cp: int) -> float:
    """The attention core's time on contiguous chunks over its load-balanced time: (2 cp - 1) / cp
    under a causal mask (see cp_time), 1 without one."""
    return (2 * cp - 1) / cp if layer.causal and cp > 1 else 1.0


def cp_buffer_bytes(layer: LayerSpec, strategy: LayerStrategy, mbs: int) -> float:
    """Temporary buffers of the attention under cp, live while the layer runs: the ring's blocks
    in flight (the one in hand and the one arriving, for K/V in forward and K/V plus their
    gradients in backward: 4 blocks); the all-gather's whole-sequence K/V and gradients (2 cp)."""
    if strategy.cp <= 1:
        return 0.0
    block = kv_block_bytes(layer, strategy, mbs)
    return (2 * strategy.cp if strategy.cp_comm == CPComm.ALL_GATHER else 4) * block
