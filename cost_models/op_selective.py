"""torchtitan's per-op selective activation checkpointing (Recompute.SELECTIVE_OP): what a block
keeps for backward and which of its forward kernels backward runs again.

torchtitan wraps each Transformer block in ``torch.utils.checkpoint`` with a policy over the ATen
ops the block dispatches (``_save_list`` and ``_custom_policy`` in
torchtitan/models/llama3/parallelize_llama.py, read at 4d88a8a and e7c0cae):
- the output of ``aten.mm`` is saved except every second one, by a counter over the block's
  forward: the 1st, 3rd, 5th and 7th are kept, wq, wv, w1 and w2 of a Llama block;
- the outputs of the flash and memory-efficient SDPA kernels are saved (the attention output and
  its fp32 log-sum-exp per head);
- the results of functional reduce-scatters are saved (Megatron-SP's, after the row-parallel
  GEMMs), and of ``aten.max`` (FP8 amaxes: scalars, left out);
- everything else is recomputed in backward: norms, the other GEMMs, the SwiGLU product, the
  residual adds, FP8 casts, and the all-gathers and all-reduces (not in the list).

torchao's float8 linears call ``torch.mm`` on their FP8 tensor subclass
(``matmul_with_hp_or_float8_args``, torchao at 0afa4c1); the checkpoint's dispatch mode sees that
``aten.mm`` before the subclass turns it into ``_scaled_mm``, so an FP8 block keeps the same
GEMMs' BF16 outputs and re-runs every cast. MoE experts run ``_grouped_mm``, which the counter
does not see: recomputed. The op order is the PyTorch block's (separate Q, K, V and w1, w3
linears, cost_models/stacks.py), whatever stack times the kernels.
"""
from __future__ import annotations

from typing import Sequence

from cost_models.ops import ELEMENT_BYTES, FLASH_LSE_BYTES, Op, forward_ops, tp_collectives_per_pass
from cost_models.stacks import forward_ops as stack_forward_ops
from specs import LayerSpec, LayerStrategy, SequenceParallel
from specs.stack import SoftwareStack

GROUPED_GEMM_PREFIX = "experts_"
"""The routed experts' GEMMs (cost_models.ops): ``_grouped_mm`` in torchtitan, not counted."""


def saved_gemms(ops: Sequence[Op]) -> tuple[Op, ...]:
    """The linear GEMMs whose outputs the policy keeps: the 1st, 3rd, ... ``mm`` in forward order."""
    counted = [op for op in ops if op.linear is not None and not _grouped(op)]
    return tuple(counted[::2])


def recomputed_ops(ops: Sequence[Op]) -> list[Op]:
    """The forward kernels backward runs again: all but the kept GEMMs and the fused attention."""
    kept = {id(op) for op in saved_gemms(ops)}
    return [op for op in ops if id(op) not in kept and not _fused_attention(op)]


def activation_bytes(layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int) -> float:
    """Bytes one micro-batch of ``layer`` keeps for backward on one GPU: its input (split by tp
    under a sequence split), the kept GEMMs' outputs (m tokens x n columns of the rank), the fused
    attention's output and log-sum-exp, and under Megatron-SP the reduce-scatters' results."""
    d = strategy.degrees
    heads_split, cp = d.split // d.cp, d.cp
    tokens = micro_batch_size * layer.seq_len / cp
    ops = stack_forward_ops(forward_ops(layer, heads_split, micro_batch_size, cp=cp), layer, SoftwareStack.EAGER)
    seq_split = heads_split if strategy.sp != SequenceParallel.NONE else 1
    kept = tokens * layer.hidden_size / seq_split
    kept += sum(op.linear[0] * op.linear[1] for op in saved_gemms(ops))
    if layer.attention == "flash":
        attentions = 2 if layer.cross_attention_seq_len else 1
        kept += attentions * tokens * layer.q_width / heads_split
        kept += attentions * tokens * layer.num_heads / heads_split * FLASH_LSE_BYTES / ELEMENT_BYTES
    if strategy.megatron_sp and strategy.tp > 1:
        kept += tp_collectives_per_pass(layer) * tokens * layer.hidden_size / strategy.tp
    return ELEMENT_BYTES * kept


def _grouped(op: Op) -> bool:
    return op.name.startswith(GROUPED_GEMM_PREFIX)


def _fused_attention(op: Op) -> bool:
    return op.name.removeprefix("x_") == "flash_attn"
