"""Deliberately broken variants of executor.train.worker: each patches the executor inside the
rank process (so it works whichever way the launcher starts ranks) and must fail --check."""
from __future__ import annotations

import dataclasses

from executor import parallelize as parallelize_module
from executor import train
from executor.parallel import data


def zero3_run_as_ddp(rank, world_size, model, plan, cfg):
    """Runs every ZeRO-3 layer as plain DDP but reports it as ZeRO-3 (same numerics)."""
    real = train.parallelize

    def parallelize(model, plan, *args, **kwargs):
        ddp = dataclasses.replace(plan, layers=tuple(dataclasses.replace(s, dp_type="ddp") if s.dp_type == "zero3"
                                                     else s for s in plan.layers))
        pm = real(model, ddp, *args, **kwargs)
        by_name = {f"layer {i}": s for i, s in enumerate(plan.layers)}
        for unit in pm.units:
            if unit.name in by_name and by_name[unit.name].dp_type == "zero3":
                unit.dp_type = "zero3"
        return pm

    train.parallelize = parallelize
    return train.worker(rank, world_size, model, plan, cfg)


def dropped_all_reduce(rank, world_size, model, plan, cfg):
    """DDP buckets skip their gradient all-reduce."""
    real = data.FlatBucket.launch
    data.FlatBucket.launch = lambda self, flat: (None, flat, flat) if self.shards == 1 else real(self, flat)
    return train.worker(rank, world_size, model, plan, cfg)


def wrong_adam_shard(rank, world_size, model, plan, cfg):
    """ZeRO-1/2 buckets keep the master and Adam states of their neighbour's shard."""
    real = data.FlatBucket.shard_index
    data.FlatBucket.shard_index = lambda self: (real(self) + 1) % self.shards
    return train.worker(rank, world_size, model, plan, cfg)


# -- plans executed other than they say (issue: --check passed on each; now it must fail) -------------
def tp_not_applied(rank, world_size, model, plan, cfg):
    """Blocks keep their whole weights on every rank of the TP group (numerics unchanged)."""
    parallelize_module.apply_tp = lambda block, tp_mesh, sequence_parallel=False, **_ends: block
    return train.worker(rank, world_size, model, plan, cfg)


def megatron_sp_dropped(rank, world_size, model, plan, cfg):
    """Tensor parallel without the sequence split of the norms and residuals."""
    real = parallelize_module.apply_tp
    parallelize_module.apply_tp = lambda block, tp_mesh, sequence_parallel=False, **_ends: real(block, tp_mesh)
    return train.worker(rank, world_size, model, plan, cfg)


def recompute_dropped(rank, world_size, model, plan, cfg):
    """No activation checkpointing, whatever the plan's recompute."""
    parallelize_module.apply_ac = lambda block, recompute: block
    return train.worker(rank, world_size, model, plan, cfg)


def one_micro_batch(rank, world_size, model, plan, cfg):
    """The whole batch as one micro-batch (same gradients, more activation memory)."""
    return train.worker(rank, world_size, model, dataclasses.replace(plan, micro_batches=1), cfg)


def gpipe_for_1f1b(rank, world_size, model, plan, cfg):
    """The pipeline runs GPipe's order instead of the plan's schedule (same gradients)."""
    return train.worker(rank, world_size, model, dataclasses.replace(plan, schedule="gpipe"), cfg)


def zero1_run_as_ddp(rank, world_size, model, plan, cfg):
    """ZeRO-1 layers run as DDP and say so (the rank's own labels read ddp)."""
    changed = dataclasses.replace(plan, layers=tuple(dataclasses.replace(s, dp_type="ddp") if s.dp_type == "zero1"
                                                     else s for s in plan.layers))
    return train.worker(rank, world_size, model, changed, cfg)


def skip_sync(unit_name: str) -> None:
    """Patch the executor so that unit ``unit_name``'s bucket keeps each rank's own gradients
    (its collective never runs); the other units sync as planned."""
    real = train.parallelize

    def parallelize(*args, **kwargs):
        pm = real(*args, **kwargs)
        unit = next(u for u in pm.units if u.name == unit_name)
        unit.bucket.launch = lambda flat: (None, flat, flat)
        return pm

    train.parallelize = parallelize


def one_layer_all_reduce_skipped(rank, world_size, model, plan, cfg):
    """Layer 1's DDP bucket keeps each rank's own gradients (no all-reduce); the rest is synced."""
    skip_sync("layer 1")
    return train.worker(rank, world_size, model, plan, cfg)


def zero3_averaged(rank, world_size, model, plan, cfg):
    """ZeRO-3 reduce-scatters average the gradients over the dp group instead of summing them."""
    real = parallelize_module.apply_fsdp

    def apply_fsdp(module, dp_mesh, *args):
        trace = real(module, dp_mesh, *args)
        module.set_gradient_divide_factor(float(dp_mesh.size()))
        return trace

    parallelize_module.apply_fsdp = apply_fsdp
    return train.worker(rank, world_size, model, plan, cfg)
