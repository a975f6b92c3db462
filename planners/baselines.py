"""Baselines as users run them: pure DDP / ZeRO-2 / ZeRO-3 (FSDP), Megatron TP inside a node,
GPipe-style pp x dp, and the Megatron / DeepSpeed 3D grids users tune by hand. Each enumerates
its uniform plans, scores them with plan_cost, and returns the fastest that fits."""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Iterator

from cost_models import CostModel
from planners.base import (Budget, Planner, PlanResult, RankedPlan, SearchStats, infeasible_result,
                           pop_options, scored_result)
from planners.registry import register
from planners.space import SearchSpace, powers_of_two, tp_splits
from specs import ClusterSpec, DPType, ModelSpec, Plan, Schedule, SpecError, uniform_plan
from specs.units import GIB

DEFAULTS = {"top_k": 3}


class GridPlanner(Planner):
    """Enumerate ``candidates``; keep the fastest plan whose peak memory fits."""

    @abstractmethod
    def candidates(self, model: ModelSpec, cluster: ClusterSpec, batch: int) -> Iterator[dict]:
        """uniform_plan keyword sets to try at global batch ``batch``."""

    def _search(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                options: dict[str, Any]) -> PlanResult:
        opts = pop_options(options, DEFAULTS, self.name)
        scored, smallest, tried = [], None, 0
        for batch in budget.global_batches():
            for kw in self.candidates(model, cluster, batch):
                plan = _plan_or_none(model, cluster, batch, kw)
                if plan is None:
                    continue
                tried += 1
                cost = cost_model.plan_cost(model, plan)
                peak = cost.peak_memory_bytes
                smallest = peak if smallest is None else min(smallest, peak)
                if peak <= budget.memory_bytes:
                    scored.append((cost.throughput_samples_per_s, cost.iteration_time_s, peak, plan))
        stats = SearchStats(states_explored=tried, candidates=tried, solver_status="exhaustive")
        if not scored:
            return infeasible_result(self.name, smallest, stats)
        scored.sort(key=lambda s: (-s[0], s[1]))
        top = tuple(RankedPlan(plan=p, iteration_time_s=t, throughput_samples_per_s=thr, peak_memory_gib=pk / GIB)
                    for thr, t, pk, p in scored[:int(opts["top_k"])])
        return scored_result(self.name, cost_model, model, scored[0][3], stats, top)


def _plan_or_none(model: ModelSpec, cluster: ClusterSpec, batch: int, kw: dict) -> Plan | None:
    try:
        plan = uniform_plan(model.num_layers, global_batch=batch, model=model.name, cluster=cluster.name,
                            **{k: v for k, v in kw.items() if k != "vocab_tp"})
        from dataclasses import replace
        plan = replace(plan, vocab_tp=_vocab_tp(model, kw.get("vocab_tp", 1)))
        plan.validate(model, cluster)
    except SpecError:
        return None
    if not all(tp_splits(l, s.tp) for l, s in zip(model.layers, plan.layers)):
        return None  # the executor could not run it
    return plan


def _vocab_tp(model: ModelSpec, want: int) -> int:
    """Megatron shards the vocabulary like the layers; fall back to the largest degree dividing it."""
    vocab = model.embedding.vocab_size or 0
    v = want
    while v > 1 and vocab and vocab % v:
        v //= 2
    return v


def _micro_batches(batch: int, pp: int, space: SearchSpace) -> list[int]:
    return space.micro_batch_choices(batch, pp)


class _Pure(GridPlanner):
    dp_type = DPType.DDP

    def candidates(self, model, cluster, batch):
        yield {"tp": 1, "dp": cluster.world_size, "dp_type": self.dp_type}


@register
class Ddp(_Pure):
    """Pure data parallelism (PyTorch DDP), one micro-batch."""

    name = "ddp"


@register
class Zero2(_Pure):
    """Pure data parallelism with ZeRO-2 (optimizer states and gradients sharded)."""

    name = "zero2"
    dp_type = DPType.ZERO2


@register
class Zero3(_Pure):
    """Pure sharded data parallelism (FSDP / ZeRO-3)."""

    name = "zero3"
    dp_type = DPType.ZERO3


@register
class MegatronTp(GridPlanner):
    """Tensor parallelism over the GPUs of a node (largest degree the heads allow), dp across nodes."""

    name = "megatron_tp"

    def candidates(self, model, cluster, batch):
        for tp in sorted(powers_of_two(min(cluster.gpus_per_node, SearchSpace().max_tp)), reverse=True):
            if all(tp_splits(l, tp) for l in model.layers):
                yield {"tp": tp, "dp": cluster.world_size // tp, "vocab_tp": tp}
                return


@register
class GPipe(GridPlanner):
    """Pipeline x data parallelism, GPipe schedule, even stages; pp and micro-batches searched."""

    name = "gpipe"

    def candidates(self, model, cluster, batch):
        space = SearchSpace(schedule=Schedule.GPIPE)
        for pp in space.pp_choices(model, cluster):
            if pp == 1:
                continue
            for m in _micro_batches(batch, pp, SearchSpace()):
                yield {"pp": pp, "dp": cluster.world_size // pp, "micro_batches": m, "schedule": Schedule.GPIPE}


@register
class Megatron3d(GridPlanner):
    """The grid Megatron users tune: tp <= GPUs per node, pp dividing the layers, dp the rest,
    micro-batch count, activation checkpointing on/off; 1F1B; vocabulary sharded like the layers."""

    name = "megatron_3d"
    dp_type = DPType.DDP

    def candidates(self, model, cluster, batch):
        space = SearchSpace()
        for pp in space.pp_choices(model, cluster):
            if model.num_layers % pp:
                continue
            gpus = cluster.world_size // pp
            for tp in space.tp_choices(gpus):
                if tp > cluster.gpus_per_node:
                    continue
                dp = gpus // tp
                for m in _micro_batches(batch, pp, space):
                    for ckpt in (False, True):
                        yield {"pp": pp, "tp": tp, "dp": dp, "micro_batches": m, "checkpoint": ckpt,
                               "dp_type": self.dp_type if dp > 1 else DPType.DDP, "vocab_tp": tp}


@register
class DeepSpeed3d(Megatron3d):
    """The same grid with ZeRO-1 on the data-parallel dimension (DeepSpeed's 3D recipe)."""

    name = "deepspeed_3d"
    dp_type = DPType.ZERO1
