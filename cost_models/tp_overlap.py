"""TP communication overlap (Plan.tp_comm_overlap): each Megatron-SP all-gather and reduce-scatter
runs chunked beside the GEMM that consumes or produces its tensor, and only what that GEMM cannot
cover stays on the critical path.

Facts used (docs/cost_models.md, "TP communication overlap"):
- Under Megatron-SP the all-gather of a block's sequence-split input feeds the column-parallel
  GEMMs (QKV, FC1) and the reduce-scatter takes the row-parallel GEMMs' output (projection, FC2);
  in backward each turns into the other over the same GEMMs' input-gradient (dgrad) kernels.
- Transformer Engine's userbuffers (``tp_comm_overlap``) and PyTorch's micro-pipelined
  collective matmuls (torchtitan's async TP) split the GEMM into tp chunks, one per rank's shard,
  and move the next shard while the current chunk computes. The chunk on the rank's own shard
  (the all-gather's first, the reduce-scatter's last) has no transfer beside it.

So, with C the collective's time, G its GEMM's and n = tp chunks, the pair takes
G / n + max(C, G (n - 1) / n): the exposed communication is max(0, C - G (n - 1) / n).
Collectives without a GEMM of the dense block beside them (MoE experts, MLA's projections,
cross-attention, the vocabulary) stay exposed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from cost_models.ops import Op

SITES = (("all_gather", "reduce_scatter", ("qkv", "q", "k", "v")),
         ("reduce_scatter", "all_gather", ("proj",)),
         ("all_gather", "reduce_scatter", ("fc1", "w1", "w3")),
         ("reduce_scatter", "all_gather", ("fc2",)))
"""Per TP collective of a pass: (its kind in forward, in backward, the forward GEMMs beside it:
the fused list's names and their eager/compile split, cost_models/stacks.py). Backward runs the
other kind beside the same GEMMs' dgrad kernels."""


@dataclass(frozen=True)
class OverlapPair:
    """One TP collective of a micro-batch and the GEMM seconds that can run beside it."""

    phase: str
    """``F`` (forward) or ``B`` (backward, a full recompute's forward included)."""
    kind: str
    """all_gather or reduce_scatter."""
    comm_s: float
    """The collective's time alone (the cost model's, counted in LayerTime.tp_comm_s)."""
    beside_s: float
    """Its GEMM's (n - 1) / n: the chunks that run while a shard moves."""
    gemm_s: float
    """The whole GEMM (part of the layer's forward_s or backward_s)."""
    forward_pass: bool
    """A forward pass's collective (a full recompute's in phase B too): it moves the forward's
    bytes, an FP8 layer's all-gather its FP8 copy (sequence.forward_gather_bytes)."""

    @property
    def hidden_s(self) -> float:
        """What of comm_s the GEMM covers: min(C, G (n - 1) / n)."""
        return min(self.comm_s, self.beside_s)


def site_gemm_s(op_time: Callable[[Op], float], fwd: Sequence[Op], bwd: Sequence[Op]) -> tuple[tuple[float, float], ...]:
    """Per site of SITES, (its forward GEMMs' seconds, their dgrad kernels' seconds); 0 where the
    layer has no such GEMM."""
    out = []
    for _, _, names in SITES:
        dgrads = {f"{n}_dgrad" for n in names}
        out.append((sum(op_time(op) for op in fwd if op.name in names),
                    sum(op_time(op) for op in bwd if op.name in dgrads)))
    return tuple(out)


def overlap_pairs(gemms: Sequence[tuple[float, float]], comm_s: dict[str, float], tp: int,
                  recomputes_forward: bool, forward_comm_s: dict[str, float] | None = None) -> tuple[OverlapPair, ...]:
    """The micro-batch's pairs: each site's forward collective beside its GEMM, its backward one
    beside the dgrad, and the forward's again in backward under full recomputation. ``comm_s``:
    one collective's time by kind; ``forward_comm_s``: the forward's where they differ (an FP8
    layer's all-gathers, sequence.forward_gather_bytes)."""
    share, fwd_comm = (tp - 1) / tp, forward_comm_s or comm_s
    forward = [(kind, g, True) for (kind, _, _), (g, _) in zip(SITES, gemms) if g > 0]
    backward = [(kind, g, False) for (_, kind, _), (_, g) in zip(SITES, gemms) if g > 0]
    if recomputes_forward:
        backward = forward + backward
    return tuple(OverlapPair(phase, kind, (fwd_comm if fwd else comm_s)[kind], g * share, g, fwd)
                 for phase, pairs in (("F", forward), ("B", backward)) for kind, g, fwd in pairs)
