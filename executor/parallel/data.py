"""Data parallelism per layer, run the way the cost model charges it (docs/executor.md):

- DDP: the module's gradients in one flat buffer, all-reduced once after the last micro-batch;
- ZeRO-1: the same buffer reduce-scattered after the last micro-batch, Adam on this rank's
  1/dp shard (fp32 master + states), updated parameters all-gathered after the step;
- ZeRO-2: the same, but every micro-batch's gradients are reduce-scattered into a sharded
  accumulator as soon as they are complete (full gradients never outlive a micro-batch);
- ZeRO-3: FSDP2 ``fully_shard`` (parameters gathered per micro-batch in forward and backward,
  gradients reduce-scattered per micro-batch, Adam on the fp32 shards).

Every rank's loss is its samples' share of the *global* mean, so every reduction is a plain
SUM: that stays exact when layers have different dp degrees.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, share_comm_ctx
# FSDP2's default collectives, subclassed to record them (set_custom_all_gather and
# set_custom_reduce_scatter take them; they have no public import path)
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
from torch.distributed.tensor import DTensor

from specs import DPType

# torch 2.13 renamed the flat-tensor collectives (the old names warn); older releases have only those
ALL_GATHER_FLAT = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_FLAT = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

SHARDED_OPTIMIZER = (DPType.ZERO1, DPType.ZERO2)
"""dp types whose flat bucket keeps only a 1/dp shard of the fp32 master and Adam states."""


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor-parallel shard a rank holds (the tensor itself when not a DTensor)."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _settled(p: nn.Parameter) -> torch.Tensor:
    """This rank's shard of ``p``'s gradient, laid out like ``p``: a sequence-parallel norm's
    gradient is Partial over the TP group and must be summed there first."""
    g = p.grad
    if isinstance(g, DTensor) and g.placements != p.placements:
        g = g.redistribute(placements=p.placements)
    return local(g)


class FlatBucket:
    """One module's replicated parameters (working dtype) with their gradients reduced over
    ``group`` in one flat buffer, and the fp32 master copy of this rank's shard that Adam updates.

    ``master`` holds 1/dp of the flat parameters under ZeRO-1/2, all of them under DDP.
    """

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup | None, dp_type: str,
                 micro_batches: int, master_init: torch.Tensor, eager: bool, in_flight: list["FlatBucket"]) -> None:
        """``in_flight``: the stage's ZeRO-2 buckets with a reduction under way, shared by them."""
        self.params, self.group, self.micro_batches = params, group, micro_batches
        self.in_flight = in_flight
        self.size = dist.get_world_size(group) if group is not None else 1
        self.dp_type = DPType(dp_type) if self.size > 1 else DPType.DDP
        self.shards = self.size if self.dp_type in SHARDED_OPTIMIZER else 1
        self.numel = sum(local(p).numel() for p in params)
        self.shard_numel = math.ceil(self.numel / self.shards)
        start = self.shard_index() * self.shard_numel
        padded = torch.zeros(self.shard_numel * self.shards, dtype=torch.float32, device=master_init.device)
        padded[:self.numel] = master_init
        self.master = padded[start:start + self.shard_numel].clone()
        """fp32 master of this rank's shard; Adam's parameter."""
        self.grad_shard: torch.Tensor | None = None
        """ZeRO-2: this rank's summed gradient shard, accumulated over the micro-batches."""
        self.reduced: torch.Tensor | None = None
        """After sync(): this rank's shard (or all, under DDP) of the summed gradients."""
        self.pending: list[tuple[object, torch.Tensor, torch.Tensor]] = []
        self.calls = 0
        self.trace: list[tuple[str, int, int]] = []
        """The training collectives started since the last ``clear``, in order: (kind, elements
        of the full flat buffer, group size); --check compares a step's with the cost model's."""
        for p in params if eager else ():  # else reduced in sync(), after backward
            p.register_post_accumulate_grad_hook(self._on_grad)

    def shard_index(self) -> int:
        """Which shard of the flat vector this rank owns (its rank in the DP group)."""
        return dist.get_group_rank(self.group, dist.get_rank()) if self.shards > 1 else 0

    # -- backward ------------------------------------------------------------------------------
    def _on_grad(self, _param: nn.Parameter) -> None:
        self.calls += 1
        n = len(self.params)
        if self.dp_type == DPType.ZERO2 and self.calls % n == 0:
            self._reduce_now()  # this micro-batch's gradients are complete
        elif self.calls == n * self.micro_batches:
            self._reduce_now()  # overlaps with the rest of backward

    def _flat_grads(self, take: bool) -> torch.Tensor:
        """The gradients as one padded flat vector (zeros where a parameter got none); ``take``
        frees them from the parameters (DDP keeps only the flat sum, ZeRO-2 its sharded sum)."""
        parts = []
        for p in self.params:
            g = _settled(p) if p.grad is not None else torch.zeros_like(local(p))
            parts.append(g.reshape(-1))
            if take:
                p.grad = None
        pad = self.shard_numel * self.shards - self.numel
        if pad:
            parts.append(parts[0].new_zeros(pad))
        return torch.cat(parts)

    @torch.no_grad()
    def _reduce_now(self) -> None:
        if self.dp_type == DPType.ZERO2:  # one ZeRO-2 reduction in flight on the stage: its flat
            for bucket in self.in_flight:  # copy of a module's gradients is the only transient
                bucket._drain()
            self.in_flight.clear()
        self._drain()
        flat = self._flat_grads(take=self.dp_type in (DPType.DDP, DPType.ZERO2))
        self.pending.append(self.launch(flat))
        if self.dp_type == DPType.ZERO2:
            self.in_flight.append(self)

    def launch(self, flat: torch.Tensor) -> tuple[object, torch.Tensor, torch.Tensor]:
        """Start the SUM over the DP group: all-reduce (DDP) or reduce-scatter (ZeRO-1/2).
        Returns (work, output, input kept alive until the work is done)."""
        if self.size == 1:
            return None, flat, flat
        self.trace.append(("all_reduce" if self.shards == 1 else "reduce_scatter", flat.numel(), self.size))
        if self.shards == 1:
            return dist.all_reduce(flat, group=self.group, async_op=True), flat, flat
        out = flat.new_empty(self.shard_numel)
        return REDUCE_SCATTER_FLAT(out, flat, group=self.group, async_op=True), out, flat

    def _drain(self) -> None:
        for work, out, _ in self.pending:
            if work is not None:
                work.wait()
            if self.dp_type == DPType.ZERO2:
                self.grad_shard = out if self.grad_shard is None else self.grad_shard.add_(out)
            else:
                self.reduced = out
        self.pending.clear()

    @torch.no_grad()
    def sync(self) -> None:
        """Wait for the reductions; reduce what no hook has sent yet (parameters without a
        gradient, or a leftover partial micro-batch)."""
        if self.dp_type == DPType.ZERO2:
            left = any(p.grad is not None for p in self.params)
        else:
            left = self.reduced is None and not self.pending
        if left:
            self._reduce_now()
        self._drain()
        if self.dp_type == DPType.ZERO2:
            self.reduced = self.grad_shard
        self.calls = 0

    # -- optimizer -----------------------------------------------------------------------------
    @torch.no_grad()
    def write_back(self) -> None:
        """Copy the updated master into the parameters (all-gathered in the working dtype
        under ZeRO-1/2: the cost model's parameter all-gather after the step)."""
        dtype = local(self.params[0]).dtype
        shard = self.master.to(dtype)
        if self.shards > 1:
            full = shard.new_empty(self.shard_numel * self.shards)
            self.trace.append(("all_gather", full.numel(), self.size))
            ALL_GATHER_FLAT(full, shard, group=self.group)
        else:
            full = shard
        self._scatter_into(full, lambda p: local(p))

    @torch.no_grad()
    def materialize_grads(self) -> None:
        """--check only: put the summed full gradients back on the parameters."""
        red = self.reduced
        if self.shards > 1:
            full = red.new_empty(self.shard_numel * self.shards)
            ALL_GATHER_FLAT(full, red.contiguous(), group=self.group)
            red = full
        self._grads_from(red)

    def _grads_from(self, flat: torch.Tensor) -> None:
        for p in self.params:  # laid out like p (a Partial gradient would be summed twice)
            if p.grad is None or (isinstance(p.grad, DTensor) and p.grad.placements != p.placements):
                p.grad = torch.zeros_like(p)
        self._scatter_into(flat, lambda p: local(p.grad))

    def _scatter_into(self, flat: torch.Tensor, target) -> None:
        offset = 0
        for p in self.params:
            t = target(p)
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def clear(self) -> None:
        for p in self.params:
            p.grad = None
        self.grad_shard = self.reduced = None
        self.trace.clear()

    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """What this bucket keeps per category (for the byte accounting of --check)."""
        grads = [local(p.grad) for p in self.params if p.grad is not None]
        flat = {DPType.ZERO2: self.grad_shard, DPType.DDP: self.reduced}.get(self.dp_type)
        if flat is not None:  # the sharded (ZeRO-2) or summed (DDP) gradients, flat
            grads.append(flat)
        return {"params": [local(p) for p in self.params], "grads": grads, "master": [self.master]}


class DataParallel:
    """Every bucket and FSDP module of a stage, and the Adam that updates them: the fp32
    masters of the buckets and the (fp32, sharded) FSDP parameters."""

    def __init__(self, micro_batches: int) -> None:
        self.micro_batches = micro_batches
        self.buckets: list[FlatBucket] = []
        self.fsdp_params: list[nn.Parameter] = []
        self.fsdp_modules: list[nn.Module] = []
        self.fsdp_traces: list[list[tuple[str, int, int]]] = []
        """Each FSDP module's recorded collectives (apply_fsdp), cleared with the gradients."""
        self.adam: torch.optim.Adam | None = None
        self.in_flight: list[FlatBucket] = []
        """ZeRO-2 buckets whose reduce-scatter is under way (FlatBucket._reduce_now)."""

    def add_bucket(self, params: list[nn.Parameter], group: dist.ProcessGroup | None, dp_type: str,
                   dtype: torch.dtype, eager: bool = True) -> FlatBucket | None:
        """Cast ``params`` to the working dtype and manage them as one flat bucket; ``eager``:
        start its reduction from backward (only safe when every rank of ``group`` reaches it at
        the same point of its collective sequence on that group)."""
        if not params:
            return None
        init = torch.cat([local(p).detach().reshape(-1).float() for p in params])
        for p in params:  # swap, not .data=: a DTensor's local shard must change dtype too
            if p.dtype != dtype:
                torch.utils.swap_tensors(p, nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad))
        bucket = FlatBucket(params, group, dp_type, self.micro_batches, init, eager, self.in_flight)
        self.buckets.append(bucket)
        return bucket

    def share_fsdp_comms(self) -> None:
        """One reduce-scatter in flight over all the stage's ZeRO-3 modules, as the cost model
        charges it. Each module is its own FSDP root (no stage root: see apply_fsdp), and a
        root keeps its reduce-scatter buffers until its end-of-backward callback, so every
        ZeRO-3 module's would otherwise stay alive until the micro-batch's backward ends;
        sharing their comm context lets each module's reduce-scatter free the previous one's.

        The shared context also carries FSDP2's implicit backward prefetch, which unshards the
        module that ran forward before this one. Under a pipeline that order spans micro-batches,
        so the last module of a stage would be gathered once more per step than the plan charges;
        a module naming itself as its prefetch target (already unsharded: a no-op) turns the
        implicit prefetch off."""
        if len(self.fsdp_modules) > 1:
            share_comm_ctx(self.fsdp_modules)
            for module in self.fsdp_modules:
                module.set_modules_to_backward_prefetch([module])

    def build_optimizer(self, lr: float, eps: float) -> None:
        tensors = [b.master for b in self.buckets] + self.fsdp_params
        self.adam = torch.optim.Adam(tensors, lr=lr, eps=eps, foreach=False)

    def sync(self) -> None:
        """After the last micro-batch's backward: every bucket's reduction finished."""
        for b in self.buckets:
            b.sync()

    @torch.no_grad()
    def step(self) -> None:
        for b in self.buckets:
            b.master.grad = b.reduced.float() if b.reduced is not None else torch.zeros_like(b.master)
        self.adam.step()
        for b in self.buckets:
            b.write_back()

    def zero_grad(self) -> None:
        self.adam.zero_grad(set_to_none=True)
        for b in self.buckets:
            b.clear()
        for p in self.fsdp_params:
            p.grad = None
        for trace in self.fsdp_traces:
            trace.clear()


class _TracedAllGather(DefaultAllGather):
    """FSDP2's all-gather, appending (kind, elements gathered, group size) to ``trace``."""

    def __init__(self, trace: list[tuple[str, int, int]]) -> None:
        self.trace = trace

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.trace.append(("all_gather", output_tensor.numel(), group.size()))
        return super().__call__(output_tensor, input_tensor, group, async_op)


class _TracedReduceScatter(DefaultReduceScatter):
    """FSDP2's reduce-scatter, appending (kind, elements reduced, group size) to ``trace``."""

    def __init__(self, trace: list[tuple[str, int, int]]) -> None:
        self.trace = trace

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.trace.append(("reduce_scatter", input_tensor.numel(), group.size()))
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def apply_fsdp(module: nn.Module, dp_mesh: DeviceMesh, dp: DataParallel, bf16: bool,
               ignored: set[nn.Parameter]) -> list[tuple[str, int, int]]:
    """ZeRO-3: shard ``module`` over ``dp_mesh``; gathered parameters are freed after forward
    and after backward of every micro-batch. Under bf16 the fp32 shards are the master
    weights; gathers and gradient reductions move bf16. Returns the list its collectives are
    recorded in (cleared by ``dp.zero_grad``), as FlatBucket.trace."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 \
        else MixedPrecisionPolicy()
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=True, mp_policy=policy,
                ignored_params=ignored or None)
    module.set_gradient_divide_factor(1.0)
    # gloo has no PREMUL_SUM: a custom divide factor must go through a plain SUM
    module.set_force_sum_reduction_for_comms(True)
    dp.fsdp_params.extend(p for p in module.parameters() if p not in ignored)
    dp.fsdp_modules.append(module)
    trace: list[tuple[str, int, int]] = []
    dp.fsdp_traces.append(trace)
    module.set_custom_all_gather(_TracedAllGather(trace))
    module.set_custom_reduce_scatter(_TracedReduceScatter(trace))
    return trace
