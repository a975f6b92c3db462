"""Memory formulas shared by the cost models: mixed-precision Adam states under DDP/ZeRO-1/2/3 and
Transformer activation bytes (Korthikanti et al. 2022), per docs/cost_models.md (formulas).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from cost_models import context, experts, fp8, op_selective
from cost_models.ops import FLASH_LSE_BYTES
from cost_models.base import MemoryBreakdown
from specs import DP_TYPES, DPType, LayerSpec, LayerStrategy, Recompute, SequenceParallel
from specs.errors import one_of

WEIGHT_BYTES_PER_PARAM = 2
"""fp16/bf16 working copy of the weights (ZeRO paper, mixed precision)."""
GRAD_BYTES_PER_PARAM = 2
"""fp16/bf16 gradients."""
OPTIMIZER_BYTES_PER_PARAM = 12
"""fp32 master weights, Adam momentum and variance: 3 x 4 bytes (ZeRO paper)."""
ACTIVATION_BYTES = 2
"""Activations are 16-bit."""
MASK_BYTES = 1
"""Dropout masks are stored as one byte per element (Korthikanti et al.)."""


def optimizer_shard(dp_type: str, dp: int) -> int:
    """Ranks the optimizer states (and the step that updates them) are split over: dp under
    every ZeRO stage, 1 under DDP."""
    return max(1, dp) if dp_type != DPType.DDP else 1


def model_state_bytes(params: float, dp_type: str, dp: int,
                      weight_bytes: int = WEIGHT_BYTES_PER_PARAM) -> MemoryBreakdown:
    """Weights, gradients and Adam states of ``params`` parameters on one GPU of a dp group.

    Mixed precision (``weight_bytes`` 2): DDP 16 B/param; ZeRO-1 4 + 12/d; ZeRO-2 2 + 14/d;
    ZeRO-3 16/d (formulas.md). A run in a 4-byte working dtype keeps 4 B weights and gradients
    beside the same 12 B fp32 master and Adam states (the executor's flat buckets), except under
    ZeRO-3, whose fp32 shard is its own master: 16/d either way.
    """
    one_of(dp_type, DP_TYPES, "dp_type")
    d = max(1, dp)
    shard_opt = optimizer_shard(dp_type, d)
    shard_grad = d if dp_type in (DPType.ZERO2, DPType.ZERO3) else 1
    shard_param = d if dp_type == DPType.ZERO3 else 1
    optimizer = OPTIMIZER_BYTES_PER_PARAM
    if dp_type == DPType.ZERO3:
        optimizer += 2 * (WEIGHT_BYTES_PER_PARAM - weight_bytes)
    return MemoryBreakdown(parameters_bytes=weight_bytes * params / shard_param,
                           gradients_bytes=weight_bytes * params / shard_grad,
                           optimizer_bytes=optimizer * params / shard_opt)


def gradient_sync_transient_bytes(params: float, dp_type: str, dp: int,
                                  weight_bytes: int = WEIGHT_BYTES_PER_PARAM) -> float:
    """Bytes a layer's data parallelism holds for a moment beyond its states: ZeRO-3 its
    gathered weights; ZeRO-2 the layer's full gradients and their flat copy while its
    reduce-scatter starts (every micro-batch, one layer at a time)."""
    if dp <= 1:
        return 0.0
    if dp_type == DPType.ZERO3:
        return weight_bytes * params
    if dp_type == DPType.ZERO2:
        return 2 * weight_bytes * params
    return 0.0


def _has_dropout(layer: LayerSpec) -> bool:
    """LLaMA blocks train without dropout; the others keep one-byte masks."""
    return layer.has_dropout


def _attention_bytes_per_token(layer: LayerSpec, span: int) -> tuple[float, float, float]:
    """(replicated, tp-split, attention-core) activation bytes of one attention block per token.

    Korthikanti: 11 s b h + 5 a s^2 b = QKV input 2h, Q and K 4h, V 2h, projection input 2h,
    output-dropout mask h (the first two terms), and the attention core: softmax output 2 a s,
    its dropout mask a s and output 2 a s (what selective recomputation drops). Flash attention
    keeps no s x s tensor: its core is only an fp32 log-sum-exp per head (4 a).
    """
    h, q, kv, a = layer.hidden_size, layer.q_width, layer.kv_width, layer.num_heads
    mask = MASK_BYTES if _has_dropout(layer) else 0
    replicated = ACTIVATION_BYTES * h + mask * h
    if layer.attention == "flash":
        core = FLASH_LSE_BYTES * a
    else:
        core = (ACTIVATION_BYTES + (mask + ACTIVATION_BYTES if mask else 0)) * a * span
    split = ACTIVATION_BYTES * (2 * q + 2 * kv)
    return replicated, split, core


def _mlp_bytes_per_token(layer: LayerSpec) -> tuple[float, float]:
    """(replicated, tp-split) bytes of the MLP per token: FC1 input 2h, activation input 2f
    (two of them when gated), FC2 input 2f, dropout mask h (Korthikanti: 19 s b h at f = 4h)."""
    h, f = layer.hidden_size, layer.ffn_hidden_size
    mask = MASK_BYTES if _has_dropout(layer) else 0
    per_width = ACTIVATION_BYTES * (3 if layer.gated_ffn else 2)
    if layer.moe is not None:
        return _moe_bytes_per_token(layer, per_width, mask)
    return ACTIVATION_BYTES * h + mask * h, per_width * f


def _moe_bytes_per_token(layer: LayerSpec, per_width: int, mask: int) -> tuple[float, float]:
    """(replicated, tp-split) bytes of a MoE MLP per token: the router's input and its logits
    (one per expert), then for each routed copy (k per token, or k x capacity factor) the
    dispatched input 2h and the expert MLP's inner tensors, and the shared experts' as a dense
    MLP's, as if every rank held every expert; under expert parallelism
    experts.activation_correction_bytes moves the routed part to the experts' ranks."""
    moe, h = layer.moe, layer.hidden_size
    passes = moe.expert_passes_per_token
    replicated = ACTIVATION_BYTES * (h + moe.num_experts + passes * h) + mask * h
    split = per_width * (passes * moe.expert_ffn_hidden_size + moe.shared_ffn_hidden_size)
    return replicated, split


def activation_bytes(layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                     imbalance: float | None = None) -> float:
    """Bytes one micro-batch of ``layer`` keeps for backward on one GPU (Korthikanti et al.
    2022, Table 2). GPT at tp t: s b h (10 + 24/t + 5 a s / (h t)); with sequence parallelism
    (Megatron-SP, or Ulysses of degree t) all of it / t: s b h (34 + 5 a s / h) / t; selective
    recomputation drops the attention core (5 a s / h): s b h 34 / t; full: the layer input
    only (2 s b h, / t when the sequence is split); torchtitan's per-op selective:
    op_selective.activation_bytes. Context parallelism splits the tokens: all of it / cp."""
    cp, b = strategy.cp, micro_batch_size
    tp = strategy.degrees.split // cp
    tokens = b * layer.seq_len / cp
    seq_split = strategy.sp != SequenceParallel.NONE
    if strategy.recompute == Recompute.FULL:
        return ACTIVATION_BYTES * tokens * layer.hidden_size / (tp if seq_split else 1)
    if strategy.recompute == Recompute.SELECTIVE_OP:
        return op_selective.activation_bytes(layer, strategy, b)
    norms = 2 * ACTIVATION_BYTES * layer.hidden_size  # inputs of the two norms
    att_rep, att_split, core = _attention_bytes_per_token(layer, layer.attention_span)
    mlp_rep, mlp_split = _mlp_bytes_per_token(layer)
    replicated, split = norms + att_rep + mlp_rep, att_split + mlp_split
    if strategy.precision.is_fp8:  # linear layers' inputs kept as their FP8 copy
        rep_saved, split_saved = fp8.saved_input_savings_per_token(layer)
        replicated, split = replicated - rep_saved, split - split_saved
    if layer.cross_attention_seq_len:
        rep, spl, x_core = _attention_bytes_per_token(layer, layer.cross_attention_seq_len)
        replicated += rep + ACTIVATION_BYTES * layer.hidden_size
        split += spl
        core += x_core
    if strategy.recompute != Recompute.SELECTIVE:
        split += core
    # routed experts under an expert split: the busiest rank's copies at width f / etp
    per_width = ACTIVATION_BYTES * (3 if layer.gated_ffn else 2)
    moe_fix = experts.activation_correction_bytes(layer, strategy, b, per_width, imbalance)
    if seq_split:
        return tokens * (replicated + split) / tp + moe_fix
    return tokens * (replicated + split / tp) + moe_fix


def weight_wait_bytes(layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                      element_bytes: int = ACTIVATION_BYTES) -> float:
    """Bytes one micro-batch of ``layer`` keeps on one GPU between its B (input gradient) and
    its W (weight gradient) under a split backward, beyond its activations (which stay until W,
    the weight-gradient GEMMs' inputs among them): the gradient of every weighted op's output,
    the other operand of those GEMMs. Per token: the two norms' h, QKV's q + 2 kv and FC1's f
    (2 f gated; routed and shared experts' widths under MoE), split by tp; the projection's and
    FC2's h (one per expert pass under MoE), replicated unless the sequence is split. GPT
    (q = kv = h, f = 4 h): 11 h per token. Context parallelism splits the tokens."""
    h, cp = layer.hidden_size, strategy.cp
    tp = strategy.degrees.split // cp
    ffn_width = layer.ffn_hidden_size
    outputs_h = 1.0
    if layer.moe is not None:
        ffn_width = layer.moe.expert_passes_per_token * layer.moe.expert_ffn_hidden_size + \
            layer.moe.shared_ffn_hidden_size
        outputs_h = layer.moe.expert_passes_per_token + (1 if layer.moe.shared_ffn_hidden_size else 0)
    split = layer.q_width + 2 * layer.kv_width + ffn_width * (2 if layer.gated_ffn else 1)
    replicated = 2 * h + h + outputs_h * h
    tokens = micro_batch_size * layer.seq_len / cp
    if strategy.sp != SequenceParallel.NONE:
        return element_bytes * tokens * (replicated + split) / tp
    return element_bytes * tokens * (replicated + split / tp)


def attention_core_bytes(layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int) -> float:
    """The attention-core activations selective recomputation rebuilds in backward (temporary)."""
    core = _attention_bytes_per_token(layer, layer.attention_span)[2]
    if layer.cross_attention_seq_len:
        core += _attention_bytes_per_token(layer, layer.cross_attention_seq_len)[2]
    return micro_batch_size * layer.seq_len * core / strategy.degrees.split


def layer_memory(layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int, in_flight: int,
                 params: float | None = None, kept_bytes: float | None = None,
                 recomputed_bytes: float | None = None, imbalance: float | None = None,
                 weight_bytes: int = WEIGHT_BYTES_PER_PARAM) -> MemoryBreakdown:
    """States of the layer's local shard, ``in_flight`` stashed micro-batches, and temporaries:
    ZeRO-3's gathered weights, and under checkpointing the recomputed layer's activations (all of
    them under full, those it did not keep under selective-op).
    With an expert split the routed experts' states are / (ep * etp), ZeRO-sharded over expert dp.
    FP8 layers add their FP8 weight copies and keep FP8 inputs of their linear layers (fp8.py).
    ``weight_bytes``: the working dtype's bytes per weight (model_state_bytes)."""
    states, temporary = layer_state_bytes(layer, strategy, params, weight_bytes)
    kept = activation_bytes(layer, strategy, micro_batch_size, imbalance) if kept_bytes is None else kept_bytes
    if strategy.checkpoint or strategy.recompute == Recompute.SELECTIVE_OP:
        rebuilt = (activation_bytes(layer, _without_checkpoint(strategy), micro_batch_size, imbalance)
                   if recomputed_bytes is None else recomputed_bytes)
        temporary += rebuilt - (kept if strategy.recompute == Recompute.SELECTIVE_OP else 0.0)
    elif strategy.recompute == Recompute.SELECTIVE:
        temporary += attention_core_bytes(layer, strategy, micro_batch_size)
    temporary += context.cp_buffer_bytes(layer, strategy, micro_batch_size)
    return MemoryBreakdown(parameters_bytes=states.parameters_bytes, gradients_bytes=states.gradients_bytes,
                           optimizer_bytes=states.optimizer_bytes, activations_bytes=kept * in_flight,
                           temporary_bytes=temporary)


@lru_cache(maxsize=65536)
def layer_state_bytes(layer: LayerSpec, strategy: LayerStrategy, params: float | None = None,
                      weight_bytes: int = WEIGHT_BYTES_PER_PARAM) -> tuple[MemoryBreakdown, float]:
    """(states, their temporaries) of layer_memory: the local shard's weights, gradients and
    optimizer state per sync part, FP8 weight copies, and what a gradient sync or a ZeRO-3
    gather holds while it runs; independent of the micro-batch, so worked out once per layer
    and strategy (planners ask the same pair at every micro-batch size)."""
    states, temporary = MemoryBreakdown(), 0.0
    for part in experts.sync_parts(layer, strategy, 0, (), params):
        kept_copies, gathered_copies = fp8.weight_copy_bytes(part.params, part.dp_type, part.size, strategy.precision)
        states = states + model_state_bytes(part.params, part.dp_type, part.size, weight_bytes) + \
            MemoryBreakdown(parameters_bytes=kept_copies)
        transient = gradient_sync_transient_bytes(part.params, part.dp_type, part.size, weight_bytes)
        temporary += gathered_copies or transient  # FP8 ZeRO-3 gathers FP8 copies, not BF16 weights
    return states, temporary


@lru_cache(maxsize=65536)
def _without_checkpoint(strategy: LayerStrategy) -> LayerStrategy:
    return replace(strategy, recompute="none")
