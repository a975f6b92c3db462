"""Activation checkpointing per layer: keep the block's input, recompute the rest in backward."""
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


def apply_ac(block: nn.Module, enabled: bool) -> nn.Module:
    return Checkpointed(block) if enabled else block
