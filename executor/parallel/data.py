"""Data parallelism per layer: DDP (gradient all-reduce) and ZeRO-1/2/3 (FSDP2 fully_shard).

Every rank's loss is its samples' share of the *global* mean (sum over its samples / global
batch), so gradients are summed, never averaged, over DP groups: that stays exact when
layers have different dp degrees. ZeRO-1 runs as ZeRO-2 (FSDP2 shards gradients with the
optimizer states; numerically identical).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from specs import DPType


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


class _Bucket:
    """One module's replicated parameters: their gradients, flattened, are summed over the DP
    group as soon as the last micro-batch's backward has produced all of them."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup, micro_batches: int) -> None:
        self.params, self.group, self.micro_batches = params, group, micro_batches
        self.calls, self.work, self.flat = 0, None, None
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, _param: nn.Parameter) -> None:
        self.calls += 1
        if self.calls == len(self.params) * self.micro_batches:
            self.launch(async_op=True)  # overlaps with the rest of backward

    def _grads(self) -> list[torch.Tensor]:
        return [_local(p.grad) for p in self.params if p.grad is not None]

    @torch.no_grad()
    def launch(self, async_op: bool) -> None:
        grads = self._grads()
        if grads:
            self.flat = torch.cat([g.reshape(-1) for g in grads])
            self.work = dist.all_reduce(self.flat, group=self.group, async_op=async_op)

    @torch.no_grad()
    def finish(self) -> None:
        if self.flat is None:  # some parameter got no gradient: the hooks never completed
            self.launch(async_op=False)
        if self.work is not None:
            self.work.wait()
        offset = 0
        for g in self._grads():
            g.copy_(self.flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.calls, self.work, self.flat = 0, None, None


@dataclass
class GradientSync:
    """DDP: per module, its replicated parameters' gradients summed over its DP group in one
    flat bucket, launched asynchronously when the iteration's last backward has produced them
    and waited for before the optimizer step."""

    micro_batches: int = 1
    """Backward passes per iteration (a bucket is ready after this many gradient accumulations)."""
    buckets: list[_Bucket] = field(default_factory=list)

    def add(self, params: list[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
        if size > 1 and params:
            self.buckets.append(_Bucket(params, group, self.micro_batches))

    def sync(self) -> None:
        for bucket in self.buckets:
            bucket.finish()


def apply_ddp(module: nn.Module, dp_mesh: DeviceMesh, sync: GradientSync) -> None:
    """Register ``module``'s parameters for a summed all-reduce over ``dp_mesh``."""
    sync.add(list(module.parameters()), dp_mesh.get_group(), dp_mesh.size())


def apply_fsdp(module: nn.Module, dp_mesh: DeviceMesh, dp_type: str) -> nn.Module:
    """Shard ``module`` over ``dp_mesh``: ZeRO-3 frees gathered parameters after forward,
    ZeRO-1/2 keep them until backward is done."""
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=dp_type == DPType.ZERO3)
    _sum_reduction(module)
    return module


def apply_fsdp_root(root: nn.Module, dp_mesh: DeviceMesh, ignored: set[nn.Parameter]) -> None:
    """One FSDP root over a stage whose blocks sit on different meshes; the parameters that
    DDP owns are ignored so FSDP leaves them alone."""
    fully_shard(root, mesh=dp_mesh, reshard_after_forward=False, ignored_params=ignored)
    _sum_reduction(root)


def _sum_reduction(module: nn.Module) -> None:
    module.set_gradient_divide_factor(1.0)
    # gloo has no PREMUL_SUM: a custom divide factor must go through a plain SUM
    module.set_force_sum_reduction_for_comms(True)
