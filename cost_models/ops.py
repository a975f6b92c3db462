"""The kernels of one Transformer block on one GPU: GEMMs (FLOPs and bytes) and memory-bound ops.

A Megatron-style block: norm, QKV GEMM, attention (eager: score GEMM, scale-mask softmax fused
where Megatron's kernel applies, dropout, context GEMM; flash: one fused kernel), output
projection, bias-dropout-add, norm, FC1, activation, FC2, bias-dropout-add. Widths split by the
tensor-parallel degree tp.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from specs import EmbeddingSpec, HeadSpec, LayerSpec

ELEMENT_BYTES = 2
"""fp16/bf16 tensors."""
MASK_BYTES = 1
"""A dropout mask element (PyTorch stores bool masks as one byte)."""
FLASH_LSE_BYTES = 4
"""Flash attention keeps one fp32 log-sum-exp per query row and head for its backward."""


def tp_collectives_per_pass(layer: LayerSpec) -> int:
    """Megatron TP all-reduces (Megatron-SP reduce-scatter and all-gather pairs) in one pass of a
    block: after the self-attention and after the MLP, and after a cross-attention."""
    return 3 if layer.cross_attention_seq_len else 2
LOSS_FORWARD_KERNELS = (("loss_to_fp32", 2 + 4), ("loss_max", 4), ("loss_subtract_max", 4 + 4),
                        ("loss_exp", 4 + 4), ("loss_sum", 4), ("loss_normalise", 4 + 4))
"""Megatron's vocab-parallel cross-entropy forward over the fp16 logits, one kernel per pass
over them: ``output.float()``, the max, ``sub_`` of it, ``exp`` in place, the sum, ``div_`` by it
(the softmax is kept for backward). (name, bytes read plus written per logit); the per-token
kernels (target mask, gather of the target logit, log) are left out."""
LOSS_BACKWARD_KERNELS = (("loss_scale_grad", 4 + 4), ("loss_to_fp16", 4 + 2))
"""Its backward: ``mul_`` of the kept fp32 softmax by the output gradient, then the cast's
backward to fp16."""


@dataclass(frozen=True)
class Op:
    """One kernel: FLOPs it computes and bytes it moves to and from device memory."""

    name: str
    flops: float
    """Matmul FLOPs (2 per multiply-add); 0 for memory-bound kernels."""
    nbytes: float
    """Device-memory traffic, bytes."""
    backward_flops_factor: float = 2.0
    """FLOPs of its backward over its forward: 2 for a GEMM (input and weight gradients, two
    kernels), FLASH_BACKWARD_FLOPS_FACTOR for fused attention (one kernel)."""
    backward_nbytes: float | None = None
    """Bytes its backward kernel moves, where known; None: BACKWARD_ELEMENTWISE_FACTOR x nbytes."""
    linear: tuple[float, float, float] | None = None
    """(m, n, k) of a linear layer's GEMM: m tokens of width k times a k x n weight. These are
    the GEMMs an FP8 recipe runs in FP8 (cost_models/fp8.py); None for attention, the router
    and memory-bound kernels."""
    fp8: bool = False
    """Runs at the GPU's FP8 peak (its operands are FP8)."""
    sdpa: bool = False
    """Fused attention run by PyTorch's scaled_dot_product_attention (the eager and compile
    stacks): at ``gpu.sdpa_flash_tflops`` where the cluster states it."""


def gemm(name: str, m: float, n: float, k: float, batch: float = 1, linear: bool = True) -> Op:
    """``batch`` independent (m x k) @ (k x n) products in one kernel; ``linear``: a layer's
    weight GEMM (batch 1), which an FP8 recipe runs in FP8."""
    return Op(name, 2.0 * batch * m * n * k, ELEMENT_BYTES * batch * (m * k + k * n + m * n),
              linear=(m, n, k) if linear and batch == 1 else None)


def elementwise(name: str, elements_read: float, elements_written: float, masks: float = 0.0) -> Op:
    return Op(name, 0.0, ELEMENT_BYTES * (elements_read + elements_written) + MASK_BYTES * masks)


FLASH_BACKWARD_FLOPS_FACTOR = 2.5
"""FlashAttention backward runs five s x s matmuls (scores recomputed, dV, dP, dQ, dK) to the
forward's two (Dao 2023, FlashAttention-2, section 3.1)."""


def flash_attention(name: str, batch_heads: float, s: float, span: float, d: float, dv: float | None = None) -> Op:
    """One fused attention kernel: the score and context matmuls on chip; device memory sees
    only Q, K, V, the output and the per-row log-sum-exp (fp32). ``dv``: the value width when
    it differs from the query/key width ``d`` (MLA)."""
    dv = d if dv is None else dv
    flops = 2.0 * batch_heads * s * span * (d + dv)
    nbytes = ELEMENT_BYTES * batch_heads * ((d + dv) * (s + span)) + FLASH_LSE_BYTES * batch_heads * s
    return Op(name, flops, nbytes, backward_flops_factor=FLASH_BACKWARD_FLOPS_FACTOR)


FUSED_SOFTMAX_MAX_KEYS = 4096
"""Megatron's fused scale-mask-softmax kernels take 16 < keys <= 4096 (2048 before 2022)."""
FUSED_SOFTMAX_THREADS_PER_BLOCK = 128
"""Its CUDA kernels run 128 threads a block, a warp (32 threads, fewer for short rows) a row."""
UNFUSED_SOFTMAX_BYTES = (("softmax_to_fp32", 2 + 4, 4 + 2), ("softmax_scale", 4 + 4, 4 + 4),
                         ("softmax_mask", 4 + 4, 4 + 4), ("softmax", 4 + 4, 4 + 4 + 4),
                         ("softmax_to_fp16", 4 + 2, 2 + 4))
"""Megatron's fallback when the fused kernel does not apply (FusedScaleMaskSoftmax.
forward_torch_softmax, softmax in fp32 as query-key layer scaling forces it): cast to fp32,
scale, masked_fill_, softmax, cast back; five kernels each way. (name, forward bytes, backward
bytes) per score: reads plus writes of fp16 (2) and fp32 (4) elements; softmax's backward reads
its output and the gradient. The fused kernel moves 2 + 2 forward and 2 + 2 + 2 backward."""


def _softmax_batches_per_block(keys: int) -> int:
    """Rows one thread block of the fused softmax takes (Megatron's get_batch_per_block)."""
    pow2 = 1 << max(keys - 1, 0).bit_length()
    warp = min(pow2, 32)
    return (FUSED_SOFTMAX_THREADS_PER_BLOCK // warp) * (2 if pow2 <= 128 else 1)


def fused_softmax_available(attn_batches: int, queries: int, keys: int, causal: bool) -> bool:
    """Megatron's FusedScaleMaskSoftmax.is_kernel_available: fp16 scores of ``attn_batches``
    (micro-batch x heads per rank) matrices of queries x keys. Otherwise the unfused path runs."""
    if not (16 < keys <= FUSED_SOFTMAX_MAX_KEYS and queries % 4 == 0 and keys % 4 == 0 and attn_batches % 4 == 0):
        return False
    per_block = _softmax_batches_per_block(keys)
    return attn_batches % per_block == 0 if causal else queries % per_block == 0


def softmax_ops(tag: str, attn_batches: float, queries: int, keys: int, causal: bool) -> list[Op]:
    """The scale-mask-softmax over the scores: one fused kernel, or Megatron's five-kernel
    fp32 fallback where the fused kernel does not apply."""
    scores = attn_batches * queries * keys
    if attn_batches != int(attn_batches) or not fused_softmax_available(int(attn_batches), queries, keys, causal):
        return [Op(f"{tag}{name}", 0.0, fwd * scores, backward_nbytes=bwd * scores)
                for name, fwd, bwd in UNFUSED_SOFTMAX_BYTES]
    return [elementwise(f"{tag}softmax", scores, scores)]


def _attention_ops(layer: LayerSpec, tp: int, tokens: float, batch: int, span: int,
                   tag: str, dropout: bool, causal: bool = True) -> list[Op]:
    h, d = layer.hidden_size, layer.head_size
    dv = layer.mla.v_head_dim if layer.mla is not None else d  # MLA: values narrower than keys
    heads = layer.num_heads / tp
    q, kv = layer.q_width / tp, layer.kv_width / tp
    s = tokens / batch  # the rank's queries: seq_len, or seq_len / cp
    scores = batch * heads * s * span  # span: keys per query (window or sliding window, <= s)
    ops = [gemm(f"{tag}qkv", tokens, q + 2 * kv, h)]
    if layer.attention == "flash":  # dropout is fused too (a seed, no mask)
        ops.append(flash_attention(f"{tag}flash_attn", batch * heads, s, span, d, dv))
    else:
        ops.append(gemm(f"{tag}scores", s, span, d, batch * heads, linear=False))
        ops += softmax_ops(tag, batch * heads, s, span, causal and layer.causal)
        if dropout:
            ops.append(elementwise(f"{tag}attn_dropout", scores, scores, masks=scores))
        ops.append(gemm(f"{tag}context", s, dv, span, batch * heads, linear=False))
    ops += [gemm(f"{tag}proj", tokens, h, heads * dv),
            elementwise(f"{tag}residual", 2 * tokens * h, tokens * h, masks=tokens * h if dropout else 0)]
    return ops


def _mla_projection_ops(layer: LayerSpec, tp: int, tokens: float) -> list[Op]:
    """DeepSeek MLA's projections in place of the QKV GEMM: the down-projections into the
    bottlenecks are replicated across tp, the up-projections to the heads split by heads."""
    mla, h, heads = layer.mla, layer.hidden_size, layer.num_heads
    q = heads * mla.qk_head_dim / tp
    ops = ([gemm("q_down", tokens, mla.q_lora_rank, h), gemm("q_up", tokens, q, mla.q_lora_rank)]
           if mla.q_lora_rank else [gemm("q", tokens, q, h)])
    return ops + [gemm("kv_down", tokens, mla.kv_lora_rank + mla.qk_rope_head_dim, h),
                  gemm("kv_up", tokens, heads * (mla.qk_nope_head_dim + mla.v_head_dim) / tp, mla.kv_lora_rank)]


def _mlp_ops(layer: LayerSpec, tokens: float, width: float, tag: str) -> list[Op]:
    """One dense MLP of inner width ``width`` (already split by tp) over ``tokens`` tokens."""
    h = layer.hidden_size
    if layer.gated_ffn:
        ops = [gemm(f"{tag}fc1", tokens, 2 * width, h), elementwise(f"{tag}act", 2 * tokens * width, tokens * width)]
    else:
        ops = [gemm(f"{tag}fc1", tokens, width, h), elementwise(f"{tag}act", tokens * width, tokens * width)]
    return ops + [gemm(f"{tag}fc2", tokens, h, width)]


class ExpertSplit(NamedTuple):
    """How one rank runs a MoE layer's routed experts under expert parallelism (experts.py)."""

    passes_per_token: float
    """Routed copies per token the rank's experts compute (the busiest rank's)."""
    etp: int
    """Tensor-parallel degree of each expert's MLP."""
    tokens_factor: float = 1.0
    """Tokens the rank's experts see over the tokens this list is written for."""


def _moe_ops(layer: LayerSpec, tp: int, tokens: float, split: ExpertSplit | None = None) -> list[Op]:
    """Router GEMM and top-k, the routed experts' MLPs over the token copies they receive
    (active experts only), the shared experts, and the weighted combine. Without ``split`` every
    rank holds all experts, tp-split like a dense MLP; with it the rank's experts take
    ``split``'s copies at width f / etp."""
    moe, h = layer.moe, layer.hidden_size
    routed = tokens * moe.expert_passes_per_token
    if split is not None:
        routed = tokens * split.tokens_factor * split.passes_per_token
    ops = [gemm("router", tokens, moe.num_experts, h, linear=False),
           elementwise("topk", tokens * moe.num_experts, tokens * moe.top_k),
           elementwise("dispatch", routed * h, routed * h)]
    # one grouped GEMM per matrix over all routed copies (as grouped-GEMM MoE kernels run)
    ops += _mlp_ops(layer, routed, moe.expert_ffn_hidden_size / (split.etp if split else tp), "experts_")
    if moe.num_shared_experts:
        ops += _mlp_ops(layer, tokens, moe.shared_ffn_hidden_size / tp, "shared_")
    if moe.shared_expert_gate:
        ops.append(gemm("shared_gate", tokens, 1, h, linear=False))
    return ops + [elementwise("combine", routed * h, tokens * h)]


def forward_ops(layer: LayerSpec, tp: int, batch: int, experts: ExpertSplit | None = None, cp: int = 1) -> list[Op]:
    """Kernels of one forward pass of ``layer`` over ``batch`` samples on one of tp GPUs
    (``experts``: the routed experts' split under expert parallelism, experts.compute_split);
    under context parallelism ``cp`` the rank's s / cp tokens, its queries attending to every key."""
    h = layer.hidden_size
    tokens = float(batch * layer.seq_len) / cp
    dropout = layer.has_dropout
    ops = [elementwise("norm1", tokens * h, tokens * h)]
    attention = _attention_ops(layer, tp, tokens, batch, layer.attention_span, "", dropout)
    if layer.mla is not None:  # MLA's projections replace the fused QKV GEMM
        attention = _mla_projection_ops(layer, tp, tokens) + attention[1:]
    ops += attention
    if layer.cross_attention_seq_len:
        ops.append(elementwise("norm_x", tokens * h, tokens * h))
        ops += _attention_ops(layer, tp, tokens, batch, layer.cross_attention_seq_len, "x_", dropout, causal=False)
    ops.append(elementwise("norm2", tokens * h, tokens * h))
    if layer.moe is not None:
        ops += _moe_ops(layer, tp, tokens, experts)
    else:
        ops += _mlp_ops(layer, tokens, layer.ffn_hidden_size / tp, "")
    ops.append(elementwise("residual2", 2 * tokens * h, tokens * h, masks=tokens * h if dropout else 0))
    if layer.downsample_to:
        merged = tokens / 4
        ops += [elementwise("merge_norm", 4 * merged * h, 4 * merged * h),
                gemm("merge", merged, layer.downsample_to / tp, 4 * h)]
    return ops


BACKWARD_ELEMENTWISE_FACTOR = 1.5
"""A memory-bound backward kernel reads the output gradient and the saved input and writes
the input gradient: about 1.5x the traffic of its forward (read 1, write 1)."""


def backward_ops(forward: list[Op]) -> list[Op]:
    """Each GEMM becomes two of equal FLOPs (input gradient, weight gradient); fused attention
    one kernel of backward_flops_factor times its FLOPs (reading the output gradient too, and
    writing dQ, dK, dV: twice its bytes); each memory-bound kernel moves
    BACKWARD_ELEMENTWISE_FACTOR times its forward bytes."""
    out: list[Op] = []
    for op in forward:
        if op.flops and op.backward_flops_factor != 2.0:
            out.append(Op(op.name + "_bwd", op.flops * op.backward_flops_factor, 2 * op.nbytes, sdpa=op.sdpa))
        elif op.flops:
            out += [replace(op, name=op.name + "_dgrad"), replace(op, name=op.name + "_wgrad")]
        else:
            nbytes = op.nbytes * BACKWARD_ELEMENTWISE_FACTOR if op.backward_nbytes is None else op.backward_nbytes
            out.append(Op(op.name + "_bwd", 0.0, nbytes))
    return out


def is_weight_gradient(op: Op) -> bool:
    """A weight-gradient GEMM of backward_ops (W of a split backward; the rest is B)."""
    return op.name.endswith("_wgrad")


def embedding_forward_ops(embedding: EmbeddingSpec, tokens: float, tp: int) -> list[Op]:
    """Lookup (or patch projection), positions, dropout."""
    h = embedding.hidden_size
    if embedding.kind == "patch":
        k = embedding.in_channels * embedding.patch_size ** 2
        return [gemm("patch", tokens, h, k), elementwise("emb_add", 2 * tokens * h, tokens * h)]
    ops = [elementwise("lookup", tokens * h, tokens * h)]
    if embedding.max_positions:
        ops.append(elementwise("positions", 2 * tokens * h, tokens * h))
    ops.append(elementwise("emb_dropout", tokens * h, tokens * h, masks=tokens * h))
    return ops


def embedding_backward_ops(embedding: EmbeddingSpec, tokens: float, tp: int) -> list[Op]:
    """Dropout backward, then a dense weight gradient: zero the (vocab/tp x h) buffer and
    scatter-add the token gradients into it."""
    h = embedding.hidden_size
    if embedding.kind == "patch":
        return backward_ops(embedding_forward_ops(embedding, tokens, tp))
    rows = embedding.vocab_size / tp
    return [elementwise("emb_dropout_bwd", 2 * tokens * h, tokens * h, masks=tokens * h),
            elementwise("emb_grad_zero", 0, rows * h), elementwise("emb_grad_scatter", 2 * tokens * h, tokens * h)]


def head_forward_ops(head: HeadSpec, batch: int, tp: int) -> list[Op]:
    """Final norm, logits GEMM (vocab split by tp) and the cross-entropy loss."""
    if head.kind == "none":
        return []
    return _head_ops(head, batch, tp) + _loss_ops(LOSS_FORWARD_KERNELS, head, batch, tp)


def head_backward_ops(head: HeadSpec, batch: int, tp: int) -> list[Op]:
    if head.kind == "none":
        return []
    return _loss_ops(LOSS_BACKWARD_KERNELS, head, batch, tp) + backward_ops(_head_ops(head, batch, tp))


def _head_ops(head: HeadSpec, batch: int, tp: int) -> list[Op]:
    """The head's kernels before the loss: final norm, pooler or MLM transform, logits GEMM."""
    h = head.hidden_size
    tokens = float(batch * head.seq_len)
    ops = [elementwise("final_norm", tokens * h, tokens * h)] if head.final_norm else []
    if head.pooler or head.transform:
        ops.append(gemm("head_dense", tokens, h, h))
    return ops + [gemm("logits", tokens, head.output_size / tp, h)]


def _loss_ops(kernels: tuple[tuple[str, int], ...], head: HeadSpec, batch: int, tp: int) -> list[Op]:
    """The loss's passes over one rank's logits (its vocabulary shard of every token)."""
    logits = batch * head.seq_len * head.output_size / tp
    return [Op(name, 0.0, nbytes * logits) for name, nbytes in kernels]
