"""The software stack a plan's times assume: which kernels a Transformer block runs as."""
from __future__ import annotations

from enum import StrEnum
from typing import Any

from specs.errors import SpecError


class SoftwareStack(StrEnum):
    """The framework and kernels that run the block (cost_models/stacks.py holds each one's
    kernel list; docs/cost_models.md, "Software stacks")."""

    MEGATRON_TE = "megatron-te"
    """Megatron-Core with Transformer Engine: fused QKV and FC1 GEMMs, one kernel per norm,
    bias-activation and bias-dropout-add (the analytical model's kernel list)."""
    EAGER = "eager"
    """PyTorch eager, as torchtitan runs without compile: separate Q/K/V and gated FC1 GEMMs, the
    RMSNorm composite of ATen (an fp32 pass per step), SiLU and the gate product as two kernels."""
    COMPILE = "compile"
    """torch.compile (Inductor) over the eager model: the GEMMs stay separate, each chain of
    pointwise and reduction kernels becomes one fused kernel."""


STACKS = tuple(SoftwareStack)


def software_stack(value: Any, field: str = "stack") -> SoftwareStack:
    """``value`` as a SoftwareStack; a one-line SpecError naming ``field`` otherwise."""
    try:
        return SoftwareStack(value)
    except ValueError:
        raise SpecError(field, f"{value!r} is not a software stack; choose from {', '.join(STACKS)}") from None


TP_OVERLAP_STACKS = (SoftwareStack.MEGATRON_TE, SoftwareStack.COMPILE)
"""The stacks that overlap Megatron-SP's collectives with their GEMMs (Plan.tp_comm_overlap):
Transformer Engine's userbuffers (Megatron's ``tp_comm_overlap``) and torchtitan's async TP
(``enable_async_tensor_parallel``, Inductor's micro-pipelined collective matmuls, which need
torch.compile). Eager PyTorch has none."""


def overlaps_tp_comm(stack: SoftwareStack | None) -> bool:
    """Whether ``stack`` runs TP communication overlap (None: no stack stated, so none)."""
    return stack in TP_OVERLAP_STACKS


SELECTIVE_OP_STACKS = (SoftwareStack.EAGER, SoftwareStack.COMPILE)
"""The stacks that run per-op selective checkpointing (Recompute.SELECTIVE_OP): torchtitan's
policy over the PyTorch block, eager or compiled. Megatron-Core has no such option."""
