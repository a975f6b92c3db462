"""Mixture-of-experts MLP of a 'moe' block, routed as Hugging Face's Mixtral does: softmax over
all experts, top-k, the k weights renormalised; SwiGLU experts; optional shared experts
(Qwen2-MoE) with a sigmoid gate; dropless or with a per-sequence capacity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from specs import LayerSpec, MoESpec


@dataclass(frozen=True)
class Routing:
    """Where a batch of tokens goes: the kept (token, expert) assignments, sorted by expert
    (stable, so token order is kept inside an expert)."""

    token: torch.Tensor
    """Token index of each assignment, [A]."""
    weight: torch.Tensor
    """Combine weight of each assignment (differentiable, fp32), [A]."""
    counts: torch.Tensor
    """Assignments per expert, [E] (int64); they sum to A."""


def capacity_mask(experts: torch.Tensor, num_experts: int, capacity: int, seq_len: int) -> torch.Tensor:
    """Which of the [T, k] choices ``experts`` fit: every sequence of ``seq_len`` tokens gives
    each expert at most ``capacity`` assignments, first come (token order, then the k slots)
    first served. Counted per sequence so that the drops do not depend on how the batch is
    split between ranks."""
    per_seq = experts.reshape(-1, seq_len * experts.shape[1])
    onehot = F.one_hot(per_seq, num_experts)
    position = (onehot.cumsum(dim=1) * onehot).sum(dim=-1) - 1  # arrival order at its expert
    return (position < capacity).reshape(experts.shape)


def route(logits: torch.Tensor, top_k: int, capacity_factor: float = 0.0, seq_len: int = 0) -> Routing:
    """Mixtral routing of [T, E] router logits (softmax in fp32, top-k, renormalised over the k;
    the same weights as a softmax over the top-k logits)."""
    tokens, num_experts = logits.shape
    probs = F.softmax(logits.float(), dim=-1)
    top_p, top_e = probs.topk(top_k, dim=-1)
    top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    token = torch.arange(tokens, device=logits.device).repeat_interleave(top_k)
    expert, weight = top_e.reshape(-1), top_p.reshape(-1)
    if capacity_factor:
        capacity = math.ceil(capacity_factor * seq_len * top_k / num_experts)
        keep = capacity_mask(top_e, num_experts, capacity, seq_len).reshape(-1)
        token, expert, weight = token[keep], expert[keep], weight[keep]
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=num_experts)
    return Routing(token=token[order], weight=weight[order], counts=counts)


def local_weight(w: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an expert weight (differentiable; the weight itself on one process)."""
    return w.to_local() if isinstance(w, DTensor) else w


class Experts(nn.Module):
    """E SwiGLU experts as stacked weights (gate/up [E, h, f], down [E, f, h]), initialised as
    nn.Linear would initialise each; run on rows grouped by expert."""

    def __init__(self, num_experts: int, hidden: int, width: int) -> None:
        super().__init__()

        def weight(fan_in: int, *shape: int) -> nn.Parameter:
            bound = 1 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty(num_experts, *shape).uniform_(-bound, bound))

        self.gate, self.up, self.down = weight(hidden, hidden, width), weight(hidden, hidden, width), weight(width, width, hidden)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``x`` holds counts[e] rows for local expert e, expert after expert."""
        # unbind, not gate[e]: indexing's backward writes each expert's gradient into a zeroed
        # copy of the whole stack (E zero-fills of E experts); unbind's stacks them once
        gate, up, down = (local_weight(w).unbind(0) for w in (self.gate, self.up, self.down))
        out = [(F.silu(rows @ gate[e]) * (rows @ up[e])) @ down[e] for e, rows in enumerate(x.split(counts))]
        return torch.cat(out)


def local_dispatch(x: torch.Tensor, counts: torch.Tensor, experts: Experts) -> torch.Tensor:
    """One process: every expert is local, rows already grouped by expert."""
    return experts(x, counts.tolist())


class MoE(nn.Module):
    """Router, routed experts, shared experts (+ gate). ``dispatch`` moves the expert-sorted
    rows to the ranks holding their experts and back (executor.parallel.expert)."""

    def __init__(self, spec: LayerSpec, make_mlp) -> None:
        """``make_mlp(width)``: the block's dense MLP of inner width ``width`` (shared experts)."""
        super().__init__()
        moe: MoESpec = spec.moe
        h = spec.hidden_size
        self.top_k, self.capacity_factor = moe.top_k, moe.capacity_factor
        self.router = nn.Linear(h, moe.num_experts, bias=moe.router_bias)
        self.experts = Experts(moe.num_experts, h, moe.expert_ffn_hidden_size)
        self.shared = None
        if moe.num_shared_experts:  # they act together as one wider MLP
            self.shared = make_mlp(moe.shared_ffn_hidden_size)
        self.shared_gate = nn.Linear(h, 1, bias=False) if moe.shared_expert_gate else None
        self.dispatch = local_dispatch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        r = route(self.router(flat), self.top_k, self.capacity_factor, s)
        y = self.dispatch(flat[r.token], r.counts, self.experts)
        out = torch.zeros_like(flat).index_add(0, r.token, y * r.weight.to(y.dtype)[:, None])
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * shared)
        return out.view(b, s, h)
