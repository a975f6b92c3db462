"""Context parallelism: a block's sequence split over its cp group (weights whole on it), its
attention core over every key by a K/V ring (p2p) or an all-gather of K/V, the causal mask read off
the tokens' global positions; zigzag (head-tail) or contiguous chunks.

Same convention as Ulysses (executor/parallel/sequence.py): the block's input is replicated on
the group and cut into this rank's chunks on entry, its output gathered back on exit, except
between two blocks that split the sequence the same way (they hand on this rank's chunks). cp is the
outermost split of a block: inside its chunk tp splits the heads (and Megatron-SP the chunk
further), or Ulysses splits the chunk and trades it for a head split around the ring (a2a+p2p).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from executor.parallel.sequence import GatherSeq, GatherSeqReduceGrad, ScatterSeq, wrap_core
from specs import CPComm, CPLoadBalance

MASKED = -1e30
"""A finite stand-in for -inf: a block whose keys are all masked gets softmax weight 0 after the
blocks are merged, without NaNs from an all -inf row."""


def chunk_ids(rank: int, cp: int, order: str) -> tuple[int, ...]:
    """Which chunks of the sequence a rank holds: (r, 2 cp - 1 - r) of 2 cp under zigzag, (r,) of cp."""
    return (rank, 2 * cp - 1 - rank) if order == CPLoadBalance.ZIGZAG else (rank,)


def positions(rank: int, cp: int, order: str, seq: int) -> torch.Tensor:
    """Global positions of a rank's tokens, in the order it holds them."""
    pieces = 2 * cp if order == CPLoadBalance.ZIGZAG else cp
    size = seq // pieces
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunk_ids(rank, cp, order)])


def _shift(x: torch.Tensor, group: dist.ProcessGroup, step: int) -> torch.Tensor:
    """Send ``x`` to the rank ``step`` ahead in the group's ring, receive from the one behind."""
    ranks = dist.get_process_group_ranks(group)
    me, n = dist.get_rank(group), len(ranks)
    x = x.contiguous()
    recv = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, ranks[(me + step) % n], group),
           dist.P2POp(dist.irecv, recv, ranks[(me - step) % n], group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return recv


class _RingPass(torch.autograd.Function):
    """One ring step: this block goes to the next rank; its gradient comes back the other way."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return _shift(x, group, 1)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _shift(grad, ctx.group, -1), None


def _block_attention(q, k, v, q_pos, k_pos, causal: bool):
    """(output, log-sum-exp) of q over one K/V block, masked where a key comes after the query;
    in fp32 whatever the inputs' dtype, as flash attention accumulates (in bf16 the merged blocks
    strayed from the reference's one SDPA call several times more than tp's rounding does)."""
    q, k, v = (t.float() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], MASKED)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


class ContextCore:
    """What Attention runs in place of its core under cp: the ring over the cp group's K/V blocks
    (merged by their log-sum-exps, as blockwise attention does: p2p, and a2a+p2p inside Ulysses'
    all-to-alls), or one all-gather of K/V. q, k, v hold this rank's heads (all, 1/tp or 1/ulysses)."""

    def __init__(self, group: dist.ProcessGroup, comm: str, order: str, seq: int) -> None:
        self.group, self.comm, self.order, self.seq = group, comm, order, seq
        self.cp, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def __call__(self, core, q, k, v, causal: bool) -> torch.Tensor:
        mine = positions(self.rank, self.cp, self.order, self.seq)
        if self.comm == CPComm.ALL_GATHER:  # every rank's keys, then one pass (gradients reduce-scattered)
            # K and V in one all-gather (one reduce-scatter of their gradients), stacked on the batch
            k, v = GatherSeqReduceGrad.apply(torch.cat([k, v]), self.group, 2).chunk(2)
            every = torch.cat([positions(r, self.cp, self.order, self.seq) for r in range(self.cp)])
            return _block_attention(q, k, v, mine, every, causal)[0].to(q.dtype)
        outs, lses = [], []
        for step in range(self.cp):
            source = (self.rank - step) % self.cp
            out, lse = _block_attention(q, k, v, mine, positions(source, self.cp, self.order, self.seq), causal)
            outs.append(out)
            lses.append(lse)
            if step < self.cp - 1:  # the K/V block as one message (stacked on the batch)
                k, v = _RingPass.apply(torch.cat([k, v]), self.group).chunk(2)
        total = torch.logsumexp(torch.stack(lses), dim=0)
        return sum(torch.exp(lse - total) * out for out, lse in zip(outs, lses)).to(q.dtype)


def _order(seq: int, cp: int, order: str) -> torch.Tensor:
    """The permutation that lays every rank's chunks out one after the other, rank by rank."""
    return torch.cat([positions(r, cp, order, seq) for r in range(cp)])


def apply_cp(block: nn.Module, group: dist.ProcessGroup, comm: str, order: str, seq: int, *,
             split_in: bool = False, split_out: bool = False) -> nn.Module:
    """Run ``block`` with its sequence split over ``group``: the replicated input is reordered so
    that each rank's chunks are contiguous, cut on entry (unless ``split_in``: this rank's chunks
    arrive), gathered and put back in order on exit (unless ``split_out``: they leave as they
    are); the attention core runs ContextCore. Applied after tp or Ulysses: its cut comes before
    theirs (a pre-hook put first), its gather after, its ring inside Ulysses' all-to-alls."""
    cp = dist.get_world_size(group)
    if cp == 1:
        return block
    perm = _order(seq, cp, order)
    back = torch.argsort(perm)
    wrap_core(block.attn, ContextCore(group, comm, order, seq))
    if not split_in:
        block.register_forward_pre_hook(
            lambda _m, args: (ScatterSeq.apply(args[0].index_select(1, perm.to(args[0].device)), group, 1),
                              *args[1:]), prepend=True)
    if not split_out:
        block.register_forward_hook(
            lambda _m, _args, out: GatherSeq.apply(out, group, 1).index_select(1, back.to(out.device)))
    return block
