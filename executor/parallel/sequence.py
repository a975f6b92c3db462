"""Sequence splits of activations over a group: DeepSpeed-Ulysses (sequence split outside the
attention core, head split inside it, all-to-alls between) and the scatter/gather steps that
the Ulysses blocks and the vocabulary-parallel embedding/head put around themselves.

Convention (the same as the tensor-parallel blocks'): between blocks an activation is
replicated on its group and every copy's gradient is the whole gradient; a sequence-split
activation's gradient is its own chunk's. Between two blocks that split the sequence the same way
(specs.keeps_sequence_split) the activation stays split: the first leaves out its gather, the
second its cut.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


def _all_gather_seq(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _my_chunk(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    return x.chunk(dist.get_world_size(group), dim=dim)[dist.get_rank(group)].contiguous()


def _reduce_scatter_seq(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    parts = [p.contiguous() for p in x.chunk(dist.get_world_size(group), dim=dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out


def _sequence_function(name: str, doc: str, forward, backward) -> type[torch.autograd.Function]:
    """An autograd Function ``f.apply(x, group, dim)`` that runs ``forward(x, group, dim)`` and
    whose backward runs ``backward(grad, group, dim)``."""
    def fwd(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return forward(x, group, dim)

    def bwd(ctx, grad):
        return backward(grad, ctx.group, ctx.dim), None, None

    return type(name, (torch.autograd.Function,), {"__doc__": doc, "forward": staticmethod(fwd),
                                                    "backward": staticmethod(bwd)})


ScatterSeq = _sequence_function(
    "ScatterSeq", "Replicated -> this rank's sequence chunk; backward all-gathers the chunks' gradients.",
    _my_chunk, _all_gather_seq)
GatherSeq = _sequence_function(
    "GatherSeq", "Sequence chunks -> the whole sequence, replicated; backward keeps this rank's chunk "
    "of the (whole, replicated) gradient.", _all_gather_seq, _my_chunk)
GatherSeqReduceGrad = _sequence_function(
    "GatherSeqReduceGrad", "Megatron-SP's all-gather before a column-parallel matmul: the gradient "
    "that comes back is a partial sum over the group (one vocabulary shard each), so backward "
    "reduce-scatters it.", _all_gather_seq, _reduce_scatter_seq)
ReduceScatterSeq = _sequence_function(
    "ReduceScatterSeq", "Partial sums over the group -> this rank's sequence chunk of the sum "
    "(Megatron-SP after a vocabulary-parallel embedding); backward all-gathers the chunks' gradients.",
    _reduce_scatter_seq, _all_gather_seq)


# -- Ulysses ------------------------------------------------------------------------------
def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[b, H, s/t, d] (all heads, my sequence chunk) -> [b, H/t, s, d] (my heads, the whole
    sequence): slot j of the all-to-all carries head group j to rank j."""
    t = dist.get_world_size(group)
    b, h, s, d = x.shape
    send = x.reshape(b, t, h // t, s, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = _AllToAll.apply(send, group)  # [t (sequence chunk), b, H/t, s/t, d]
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // t, t * s, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of seq_to_heads: [b, H/t, s, d] -> [b, H, s/t, d]."""
    t = dist.get_world_size(group)
    b, h, s, d = x.shape
    send = x.reshape(b, h, t, s // t, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = _AllToAll.apply(send, group)  # [t (head group), b, H/t, s/t, d]
    return recv.permute(1, 0, 2, 3, 4).reshape(b, t * h, s // t, d)


def _exchange(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    # functional (out-of-place) collective: a selective-checkpoint policy can keep its output,
    # which it cannot do for an in-place one writing into a buffer it would re-create
    return funcol.wait_tensor(funcol.all_to_all_single(x.contiguous(), None, None, group))


class _AllToAll(torch.autograd.Function):
    """all_to_all_single along dim 0 (slot j to rank j); its own inverse, so backward is the
    same exchange of the gradients."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _exchange(grad, ctx.group), None


class UlyssesCore:
    """What Attention runs around its core under Ulysses: heads split in (Q, K and V in one
    all-to-all), sequence split out (one more)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def __call__(self, core, q, k, v, causal: bool) -> torch.Tensor:
        # one all-to-all for Q, K and V together (the cost model's one QKV message), stacked
        # along the batch: [3 b, H, s/t, d]
        q, k, v = seq_to_heads(torch.cat([q, k, v]), self.group).chunk(3)
        return heads_to_seq(core(q, k, v, causal), self.group)


class Nested:
    """Two wrappers of the attention core, ``outer`` around ``inner`` (Ulysses' all-to-alls
    around context parallelism's ring: a2a+p2p)."""

    def __init__(self, outer, inner) -> None:
        self.outer, self.inner = outer, inner

    def __call__(self, core, q, k, v, causal: bool) -> torch.Tensor:
        return self.outer(partial(self.inner, core), q, k, v, causal)


def wrap_core(attn: nn.Module, around) -> None:
    """Run ``around`` (``f(core, q, k, v, causal)``) next to ``attn``'s core, inside whatever
    already runs around it."""
    attn.around_core = around if attn.around_core is None else Nested(attn.around_core, around)


def apply_ulysses(block: nn.Module, group: dist.ProcessGroup, *, split_in: bool = False,
                  split_out: bool = False) -> nn.Module:
    """Run ``block`` with its sequence split over ``group`` (weights replicated): the replicated
    input is cut into sequence chunks on entry (unless ``split_in``: it arrives as one) and
    gathered back on exit (unless ``split_out``: it leaves as one), and every attention core sees
    all tokens of its heads through two all-to-alls."""
    if dist.get_world_size(group) == 1:
        return block
    for attn in (getattr(block, "attn", None), getattr(block, "cross", None)):
        if attn is not None:
            wrap_core(attn, UlyssesCore(group))
    if not split_in:
        block.register_forward_pre_hook(lambda _m, args: (ScatterSeq.apply(args[0], group, 1), *args[1:]))
    if not split_out:
        block.register_forward_hook(lambda _m, _args, out: GatherSeq.apply(out, group, 1))
    return block
