"""Terms of the post-2022 space shared by the cost models: TP traffic with Megatron sequence
parallelism (reduce-scatter + all-gather instead of all-reduce), Ulysses all-to-alls, selective
recomputation (the attention core re-run in backward) and the interleaved pipeline.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

from cost_models import fp8, op_selective, stacks
from cost_models.ops import ExpertSplit, Op, forward_ops
from specs import LayerSpec, LayerStrategy, RankGroups, Recompute, layer_grid
from specs.stack import SoftwareStack

BYTES_PER_ACTIVATION = 2
ATTENTION_CORE_OPS = ("scores", "softmax", "attn_dropout", "context")
"""What Megatron's selective recomputation re-runs: QK^T, softmax (its unfused steps are named
softmax_*), its dropout, attention over V."""
ULYSSES_ALL_TO_ALLS_PER_PASS = 2
"""DeepSpeed-Ulysses: one all-to-all of Q, K, V (sequence -> head split) before the attention
core and one of its output (head -> sequence split) after, in forward and again in backward."""

CollectiveFn = Callable[[str, float, Sequence[Sequence[int]]], float]


def attention_core_ops(ops: Sequence[Op]) -> list[Op]:
    """The forward kernels selective recomputation runs again (self- and cross-attention)."""
    names = [op.name.removeprefix("x_") for op in ops]
    return [op for op, name in zip(ops, names) if name in ATTENTION_CORE_OPS or name.startswith("softmax_")]


def rank_ops(layer: LayerSpec, strategy: LayerStrategy, mbs: int, experts: ExpertSplit | None = None) -> list[Op]:
    """forward_ops of one rank of ``strategy``: heads split by tp * ulysses, tokens by cp."""
    d = strategy.degrees
    return forward_ops(layer, d.split // d.cp, mbs, experts, cp=d.cp)


def recompute_ops(layer: LayerSpec, strategy: LayerStrategy, mbs: int) -> tuple[Op, ...]:
    """Kernels re-run in backward: the whole forward (full), the attention core (selective), all
    but the kept GEMMs and the fused attention (selective-op, on the PyTorch block's kernels)."""
    if strategy.recompute == Recompute.NONE:
        return ()
    d = strategy.degrees
    return _recompute_ops(layer, d.split // d.cp, d.cp, mbs, strategy.recompute)


@lru_cache(maxsize=4096)
def _recompute_ops(layer: LayerSpec, heads_split: int, cp: int, mbs: int, recompute: Recompute) -> tuple[Op, ...]:
    """recompute_ops per (layer, split, micro-batch): the tables ask for them thousands of times."""
    ops = forward_ops(layer, heads_split, mbs, cp=cp)
    if recompute == Recompute.SELECTIVE_OP:
        return tuple(op_selective.recomputed_ops(stacks.forward_ops(ops, layer, SoftwareStack.EAGER)))
    return tuple(ops if recompute == Recompute.FULL else attention_core_ops(ops))


def forward_passes(strategy: LayerStrategy) -> int:
    """Passes whose TP/SP collectives run: forward, backward, and a recomputed forward (full and
    selective-op: the attention core alone has no collective inside it)."""
    return 3 if strategy.recompute.reruns_forward_collectives else 2


def reduce_scatter_passes(strategy: LayerStrategy) -> int:
    """Passes whose Megatron-SP reduce-scatters run: forward_passes, less the recomputed forward
    under selective-op (torchtitan keeps the reduce-scatters' results)."""
    return forward_passes(strategy) - (1 if strategy.recompute == Recompute.SELECTIVE_OP else 0)


def tp_message_bytes(layer: LayerSpec, mbs: int) -> float:
    """One Megatron TP collective's buffer: the block's hidden activation of one micro-batch."""
    if layer.downsample_to:
        return float(mbs * layer.seq_len * layer.hidden_size * BYTES_PER_ACTIVATION)
    return float(layer.output_elements(mbs) * BYTES_PER_ACTIVATION)


def ulysses_message_bytes(layer: LayerSpec, strategy: LayerStrategy, mbs: int) -> tuple[float, float]:
    """Send buffer per rank of the (QKV, output) all-to-alls: the rank's s/(u cp) tokens of Q, K, V
    and of the attention output."""
    tokens = mbs * layer.seq_len / (strategy.ulysses * strategy.cp)
    return (tokens * (layer.q_width + 2 * layer.kv_width) * BYTES_PER_ACTIVATION,
            tokens * layer.q_width * BYTES_PER_ACTIVATION)


def tp_comm_time(collective: CollectiveFn, layer: LayerSpec, strategy: LayerStrategy, mbs: int,
                 tp_groups: Sequence[Sequence[int]], allreduces_per_pass: int) -> float:
    """TP-group traffic of one micro-batch, forward and backward (and a recompute that re-runs it,
    forward_passes; selective-op keeps the reduce-scatters' results):
    Megatron TP all-reduces; Megatron-SP replaces each by a reduce-scatter and an all-gather
    (same bytes on the ring, twice the latency steps; forward_gather_bytes for FP8 layers);
    Ulysses all-to-alls instead. Under cp each rank holds s / cp tokens, so each message is
    1 / cp of the block's."""
    if strategy.tp * strategy.ulysses <= 1:
        return 0.0
    passes = forward_passes(strategy)
    if strategy.ulysses > 1:
        qkv, out = ulysses_message_bytes(layer, strategy, mbs)
        return passes * (collective("all_to_all", qkv, tp_groups) + collective("all_to_all", out, tp_groups))
    nbytes = tp_message_bytes(layer, mbs) / strategy.cp
    if strategy.megatron_sp:
        gather, forward_bytes = collective("all_gather", nbytes, tp_groups), forward_gather_bytes(nbytes, strategy)
        forward_gather = gather if forward_bytes == nbytes else collective("all_gather", forward_bytes, tp_groups)
        return allreduces_per_pass * (reduce_scatter_passes(strategy) * collective("reduce_scatter", nbytes, tp_groups)
                                      + (passes - 1) * forward_gather + gather)
    return passes * allreduces_per_pass * collective("all_reduce", nbytes, tp_groups)


def forward_gather_bytes(nbytes: float, strategy: LayerStrategy) -> float:
    """Bytes of a forward Megatron-SP all-gather of ``nbytes`` BF16 activations: an FP8 layer casts
    the sequence shard before gathering it for its column-parallel GEMMs (torchao's
    Float8ColwiseParallel, Transformer Engine's quantized all-gather). The reduce-scatters and the
    backward's all-gathers of gradients stay BF16."""
    if not strategy.precision.is_fp8:
        return nbytes
    return nbytes * fp8.element_bytes(strategy.precision) / BYTES_PER_ACTIVATION


TP_COLLECTIVE_AXES = ("tp", "ulysses")
"""The axes of a layer's TP collectives or Ulysses all-to-alls (cp runs its own, context.py)."""


def sync_groups(first_rank: int, strategy: LayerStrategy) -> tuple[RankGroups, RankGroups]:
    """(the TP collectives' groups: tp, or Ulysses' all-to-all groups; gradient-sync groups: the
    ranks holding the same weight shard, cp * ulysses * dp)."""
    grid = layer_grid(first_rank, strategy.degrees)
    return grid.groups(TP_COLLECTIVE_AXES), grid.groups(strategy.degrees.grad_sync_axes)


@lru_cache(maxsize=65536)
def sequence_groups(first_rank: int, strategy: LayerStrategy) -> RankGroups:
    """The groups that split one replica's tokens (tp under Megatron-SP, cp, ulysses): a
    sequence-split activation is whole again after an all-gather over one. Cached: every
    relayout to or from a sequence-split layout asks for them."""
    axes = tuple(a for a, on in (("tp", strategy.megatron_sp), ("cp", strategy.cp > 1),
                                 ("ulysses", strategy.ulysses > 1)) if on)
    return layer_grid(first_rank, strategy.degrees).groups(axes)
