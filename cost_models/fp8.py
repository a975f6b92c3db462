"""FP8 linear layers (specs.precision) in the analytical model: their GEMMs at the FP8 peak with
FP8 operands, the cast and amax passes around them, the FP8 copies kept for backward and the
FP8 parameter all-gather of ZeRO-3, and under Megatron-SP the inputs cast on the sequence shard and
gathered in FP8 (sequence.forward_gather_bytes). Attention, norms, TP all-reduces and gradients'
collectives stay BF16."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from cost_models.ops import ELEMENT_BYTES, Op
from specs import DPType, LayerSpec
from specs.precision import Precision

FP8_BYTES = 1
"""E4M3 (forward) and E5M2 (gradients) elements."""
MX_BLOCK_ELEMENTS = 32
"""MXFP8: one one-byte E8M0 scale per 32 elements (OCP Microscaling v1.0)."""


def element_bytes(p: Precision) -> float:
    """Bytes of one FP8 element with its share of the scales (per-tensor scales are free)."""
    return FP8_BYTES + (1 / MX_BLOCK_ELEMENTS if p == Precision.MXFP8 else 0.0)


def gather_bytes_per_param(p: Precision) -> float:
    """Bytes per parameter of a ZeRO-3 parameter all-gather: FP8 when the layer is FP8 (torchao's
    FP8 all-gather under FSDP2, Megatron's --fp8-param-gather), BF16 otherwise."""
    return element_bytes(p) if p.is_fp8 else ELEMENT_BYTES


def _casts(name: str, elements: float, p: Precision) -> list[Op]:
    """Quantising a BF16 tensor of ``elements`` into its two FP8 copies, one per GEMM layout
    (Hopper's FP8 GEMMs take only the TN layout, so one copy is transposed; MXFP8 scales rows and
    columns apart): one fused kernel reading 2 B and writing 2 FP8 elements per element; current
    scaling first reads the tensor once more for its amax (delayed scaling takes the amax of
    earlier iterations, MXFP8 the block's own, both inside the cast)."""
    cast = Op(f"{name}_cast", 0.0, elements * (ELEMENT_BYTES + 2 * element_bytes(p)))
    if p == Precision.FP8_CURRENT:
        return [Op(f"{name}_amax", 0.0, elements * ELEMENT_BYTES), cast]
    return [cast]


def _fp8_gemm(op: Op, p: Precision, operands: tuple[float, float], output: float) -> Op:
    """``op`` with FP8 operands of ``operands`` elements and a BF16 output, at the FP8 peak."""
    return replace(op, fp8=True, nbytes=element_bytes(p) * sum(operands) + ELEMENT_BYTES * output)


def _per_linear(ops: list[Op], p: Precision, fp8: Callable[[Op, float, float, float], list[Op]]) -> list[Op]:
    """``ops`` with each linear GEMM (m, n, k) replaced by ``fp8``'s kernels; unchanged under BF16."""
    if not p.is_fp8:
        return ops
    out: list[Op] = []
    for op in ops:
        out += [op] if op.linear is None else fp8(op, *op.linear)
    return out


SHARED_INPUTS = (("qkv", "q", "k", "v"), ("fc1", "w1", "w3"))
"""The column-parallel GEMMs that read one input, the block's normed activation (the fused
list's names and their eager/compile split, cost_models/stacks.py). Under Megatron-SP an FP8
layer casts that input once, on the rank's sequence shard, and gathers the FP8 copy: torchao's
PrepareFloat8ModuleInput and Float8ColwiseParallel, Transformer Engine's quantized all-gather
(which fuses the cast into the norm; charged here as its own kernels). Without SP, torch.compile
merges the separate GEMMs' identical casts of it into one (stacks.shares_input_casts)."""


def forward_ops(ops: list[Op], p: Precision, sp: int = 1, shared_inputs: bool = False) -> list[Op]:
    """A layer's BF16 forward kernels under ``p``: each linear GEMM (m tokens, k x n weight) gets
    the casts of its input (m k) and of its weight (k n) and runs in FP8 (reads m k + k n FP8
    elements, writes m n BF16). The weight is cast every micro-batch (torchao; Transformer
    Engine casts it once per iteration, which this over-charges). Under Megatron-SP over ``sp``
    ranks, or with ``shared_inputs``, each SHARED_INPUTS group casts its input once, m k / sp
    elements."""
    cast_groups: set[int] = set()

    def input_casts(op: Op, elements: float) -> list[Op]:
        group = _shared_input(op.name) if sp > 1 or shared_inputs else None
        if group is None:
            return _casts(f"{op.name}_input", elements, p)
        if group in cast_groups:
            return []
        cast_groups.add(group)
        return _casts(f"{SHARED_INPUTS[group][0]}_input", elements / sp, p)

    def fp8(op: Op, m: float, n: float, k: float) -> list[Op]:
        return [*input_casts(op, m * k), *_casts(f"{op.name}_weight", k * n, p),
                _fp8_gemm(op, p, (m * k, k * n), m * n)]
    return _per_linear(ops, p, fp8)


def _shared_input(name: str) -> int | None:
    """The SHARED_INPUTS group of the GEMM named ``name``, None where it is in none."""
    return next((i for i, names in enumerate(SHARED_INPUTS) if name in names), None)


def backward_ops(ops: list[Op], p: Precision) -> list[Op]:
    """A layer's BF16 backward kernels (ops.backward_ops) under ``p``: the output gradient of each
    linear GEMM (m n) is cast once for both GEMMs; dgrad reads it and the weight's transposed copy
    (m n + n k FP8) and writes m k BF16; wgrad reads it and the input's saved FP8 copy (m n + m k)
    and writes the k n weight gradient in BF16."""
    def fp8(op: Op, m: float, n: float, k: float) -> list[Op]:
        if op.name.endswith("_dgrad"):
            return [*_casts(f"{op.name.removesuffix('_dgrad')}_grad_output", m * n, p),
                    _fp8_gemm(op, p, (m * n, n * k), m * k)]
        return [_fp8_gemm(op, p, (m * n, m * k), k * n)]
    return _per_linear(ops, p, fp8)


def saved_input_savings_per_token(layer: LayerSpec) -> tuple[float, float]:
    """(replicated, tp-split) bytes per token that FP8 saves on what backward keeps: the inputs of
    the linear layers are kept as their FP8 copy for wgrad (Transformer Engine saves the
    columnwise FP8 input instead of the BF16 one), 1 B per element instead of 2: the QKV and FC1
    inputs (h each, replicated over tp) and the projection and FC2 inputs (q and f, split).
    MoE MLPs and MLA projections are left at BF16 (not modelled)."""
    saving = ELEMENT_BYTES - FP8_BYTES
    replicated, split = 0.0, 0.0
    if layer.mla is None:
        replicated += saving * layer.hidden_size
        split += saving * layer.q_width
    if layer.moe is None:
        replicated += saving * layer.hidden_size
        split += saving * layer.ffn_hidden_size
    return replicated, split


def weight_copy_bytes(params: float, dp_type: str, dp: int, p: Precision) -> tuple[float, float]:
    """(kept, temporary) bytes of the FP8 weight copies of ``params`` local parameters: both
    layouts (2 FP8 elements per parameter) kept through the iteration under DDP/ZeRO-1/2; under
    ZeRO-3 (dp > 1) the gathered weights are FP8 and live while the layer runs, in place of the
    BF16 gathered copy (layer_memory's transient)."""
    if not p.is_fp8:
        return 0.0, 0.0
    copies = 2 * element_bytes(p) * params
    if dp_type == DPType.ZERO3 and dp > 1:
        return 0.0, copies
    return copies, 0.0
