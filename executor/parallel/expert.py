"""Expert parallelism, Megatron-Core's layout: a MoE layer's routed experts split over ``ep``
ranks carved out of its data-parallel group (and column/row over its TP group), tokens sent to
their experts and back with all_to_all_single, expert gradients summed over the ranks holding
the same experts (the expert-data-parallel group)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from executor.moe import Experts, MoE
from executor.parallel.layout import GroupCache
from specs import DPType, LayerSpec, LayerStrategy, ModelSpec, Plan, SpecError, layer_grid

EXPERT_DP_TYPES = (DPType.DDP, DPType.ZERO1, DPType.ZERO2)
"""How the expert-data-parallel group may hold the experts' states (flat buckets); the
executor's capabilities (executor/unsupported.py) refuse the others."""


def check_moe(i: int, spec: LayerSpec, s: LayerStrategy) -> None:
    """SpecError in one line for a MoE layer strategy the executor cannot run."""
    if spec.moe is None:
        return
    if {spec.bias, spec.mlp_bias} - {None, False} or not spec.gated_ffn:
        raise SpecError(f"layer {i}", "the executor's experts are SwiGLU without biases "
                        f"(gated_ffn {spec.gated_ffn}, bias {spec.bias}, mlp_bias {spec.mlp_bias})")
    if s.etp != s.tp:
        raise SpecError(f"layer {i}", f"expert_tp {s.etp} != tp {s.tp}: the executor splits experts over the "
                        "layer's TP group only")
    if s.megatron_sp and s.tp > 1:
        raise SpecError(f"layer {i}", f"sp megatron with tp {s.tp} on a MoE layer: the executor does not "
                        "sequence-split the tokens it dispatches")
    if spec.moe.shared_ffn_hidden_size % s.tp:
        raise SpecError(f"layer {i}", f"tp({s.tp}) does not divide the shared experts' width "
                        f"({spec.moe.shared_ffn_hidden_size})")


def _moe_strategies(model: ModelSpec, plan: Plan) -> list[LayerStrategy]:
    """The distinct strategies of the plan's MoE layers, in an order every rank agrees on."""
    found = {s for s, spec in zip(plan.layers, model.layers) if spec.moe is not None}
    return sorted(found, key=lambda s: (s.tp, s.dp, s.tp_consecutive, s.ep, s.expert_tp, str(s)))


def build_expert_groups(model: ModelSpec, plan: Plan, groups: GroupCache) -> None:
    """Create every ep and expert-dp group of every stage (collective: all ranks, same order)."""
    for s in _moe_strategies(model, plan):
        build_strategy_expert_groups(s, plan.pp, groups)


def build_strategy_expert_groups(s: LayerStrategy, pp: int, groups: GroupCache) -> None:
    """Create the ep and expert-dp groups of strategy ``s`` on each of ``pp`` stages
    (collective: all ranks, same order)."""
    grids = [layer_grid(stage * s.gpus, s.degrees) for stage in range(pp)]
    groups.group([g for grid in grids for g in grid.groups("ep")])
    groups.group([g for grid in grids for g in grid.groups("edp")])


@dataclass
class ExpertShard:
    """A MoE layer's expert weights on this rank and how data parallelism treats them."""

    params: list[nn.Parameter]
    group: dist.ProcessGroup | None
    """The expert-data-parallel group (the gradient SUM and the ZeRO shards)."""
    dp: int
    dp_type: str
    numel: int
    """Elements the plan puts on this rank: E / ep experts, each 1/etp of an expert (from the
    spec, so the byte check of --check sees a wrong split)."""


def apply_ep(block: nn.Module, spec: LayerSpec, s: LayerStrategy, i: int, stage: int, local: int,
             groups: GroupCache, device: str) -> ExpertShard | None:
    """Keep this rank's E/ep experts (and its TP slice of each) as DTensors on an (ep, etp)
    mesh, and route the block's tokens to them by all-to-all. None for a dense block."""
    moe = getattr(block, "mlp", None)
    if not isinstance(moe, MoE):
        return None
    check_moe(i, spec, s)
    base = stage * s.gpus
    grid = layer_grid(base, s.degrees)
    d = grid.coords(base + local, view="edp")["edp"]
    ranks = torch.tensor([[grid.rank(etp=k, ep=j, edp=d) for k in range(s.etp)] for j in range(s.ep)])
    mesh = groups.mesh(ranks, device, ("ep", "etp"))  # its groups exist: build_expert_groups, layout meshes
    _shard_experts(moe.experts, mesh)
    moe.dispatch = AllToAllDispatch(mesh["ep"].get_group() if s.ep > 1 else None,
                                    mesh["etp"].get_group() if s.tp > 1 else None, s.ep)
    dp_group = groups.groups[grid.group_of("edp", base + local)]
    dp_type = s.expert_dp_kind if s.expert_dp > 1 else DPType.DDP
    numel = spec.moe.num_experts // s.ep * 3 * spec.hidden_size * spec.moe.expert_ffn_hidden_size // s.tp
    return ExpertShard(params=[moe.experts.gate, moe.experts.up, moe.experts.down], group=dp_group,
                       dp=s.expert_dp, dp_type=dp_type, numel=numel)


def _shard_experts(experts: Experts, mesh) -> None:
    """Replace the full expert weights (the same on every rank: same seed) by this rank's
    slice: experts split on dim 0 over ep, gate/up by columns and down by rows over etp."""
    e, t = mesh.get_coordinate()
    for name, tp_dim in (("gate", 2), ("up", 2), ("down", 1)):
        full = getattr(experts, name).detach()
        part = full.chunk(mesh.size(0), dim=0)[e].chunk(mesh.size(1), dim=tp_dim)[t].contiguous()
        dt = DTensor.from_local(part, mesh, (Shard(0), Shard(tp_dim)), shape=full.shape, stride=full.stride(),
                                run_check=False)
        setattr(experts, name, nn.Parameter(dt))


def expert_major_order(counts: torch.Tensor) -> torch.Tensor:
    """Rows received from ``counts.shape[0]`` ranks, each rank's rows grouped by local expert
    (``counts[src, e]`` rows): the permutation that groups them by expert, source after source."""
    ep, n_local = counts.shape
    chunk = torch.repeat_interleave(torch.arange(ep * n_local, device=counts.device), counts.reshape(-1))
    return torch.argsort((chunk % n_local) * ep + chunk // n_local, stable=True)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with variable splits; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (in_splits, out_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllToAll.apply(grad, *ctx.splits, ctx.group), None, None, None


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, gradient SUM over the TP group (each shard adds its part)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: SUM of the row-parallel partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class AllToAllDispatch:
    """Send expert-sorted rows to the ranks of the ep group holding their experts (counts first,
    so each rank knows its split sizes), run the local experts on this rank's TP slice, sum the
    slices over the TP group, and send the outputs back in the order they came."""

    def __init__(self, ep_group, tp_group, ep: int) -> None:
        self.ep_group, self.tp_group, self.ep = ep_group, tp_group, ep

    def __call__(self, x: torch.Tensor, counts: torch.Tensor, experts: Experts) -> torch.Tensor:
        send = counts.reshape(self.ep, -1)  # [destination rank, its local expert]
        recv = send
        if self.ep_group is not None:
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send.contiguous(), group=self.ep_group)
            send_splits, recv_splits = send.sum(1).tolist(), recv.sum(1).tolist()
            x = _AllToAll.apply(x, recv_splits, send_splits, self.ep_group)
        order = expert_major_order(recv)
        rows = x[order]
        if self.tp_group is not None:
            rows = _CopyToTP.apply(rows, self.tp_group)
        y = experts(rows, recv.sum(0).tolist())
        if self.tp_group is not None:
            y = _ReduceFromTP.apply(y, self.tp_group)
        y = y[torch.argsort(order)]
        if self.ep_group is not None:
            y = _AllToAll.apply(y, send_splits, recv_splits, self.ep_group)
        return y
