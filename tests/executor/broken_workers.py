"""Deliberately broken variants of executor.train.worker: each patches the executor inside the
rank process (so it works whichever way the launcher starts ranks) and must fail --check."""
from __future__ import annotations

import dataclasses

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
