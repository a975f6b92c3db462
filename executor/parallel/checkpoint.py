"""Activation checkpointing per layer: full (keep the block's input, recompute the rest in backward)
or selective (recompute only the attention core)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Checkpointed(nn.Module):
    """``inner`` with its activations recomputed in backward (non-reentrant checkpoint)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


def apply_ac(block: nn.Module, recompute: str) -> nn.Module:
    """full: checkpoint the whole block; selective: only its attention core(s) (Korthikanti
    et al.: keep every matmul output, re-run QK^T, softmax and attention over V); none: as is."""
    if recompute == "full":
        return Checkpointed(block)
    if recompute == "selective":
        for attn in (getattr(block, "attn", None), getattr(block, "cross", None)):
            if attn is not None:
                attn.recompute_core = True
    return block
