"""Relayout of activations between consecutive layers whose batch slices differ.

Under a layout, rank j holds the activations of batch slice dp_index(j) (copies on its TP
group). Forward gathers every slice over the stage and keeps the one the next layout wants;
backward does the same with the gradients. Each slice's gradient is taken from one copy (its
TP group's first rank), never summed over copies, so the result stays exact.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from executor.parallel.layout import Layout


def _gather_slices(x: torch.Tensor, layout: Layout, group: dist.ProcessGroup) -> torch.Tensor:
    """The whole micro-batch, rebuilt from one copy of each of ``layout``'s batch slices."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat([parts[layout.local_rank(d, 0)] for d in range(layout.dp)], dim=0)


def _my_slice(full: torch.Tensor, layout: Layout, local: int) -> torch.Tensor:
    size = full.shape[0] // layout.dp
    start = layout.dp_index(local) * size
    return full[start:start + size].contiguous()


class _Relayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src: Layout, dst: Layout, group, local: int):  # type: ignore[override]
        ctx.src, ctx.dst, ctx.group, ctx.local = src, dst, group, local
        return _my_slice(_gather_slices(x, src, group), dst, local)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        full = _gather_slices(grad, ctx.dst, ctx.group)
        return _my_slice(full, ctx.src, ctx.local), None, None, None, None


class Relayout(nn.Module):
    """Hands a layer's output (layout ``src``) to a layer that runs under layout ``dst``."""

    def __init__(self, src: Layout, dst: Layout, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.src, self.dst, self.group = src, dst, group
        self.local = dist.get_rank(group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Relayout.apply(x, self.src, self.dst, self.group, self.local)

    def extra_repr(self) -> str:
        return f"{self.src} -> {self.dst}"


def needs_relayout(src: Layout, dst: Layout) -> bool:
    return not src.same_slices(dst)
