"""Baselines as users run them: pure DDP / ZeRO-2 / ZeRO-3 (FSDP), Megatron TP inside a node,
GPipe-style pp x dp, and the Megatron / DeepSpeed 3D grids users tune by hand. Each enumerates
its uniform plans, scores them with plan_cost, and returns the fastest that fits. For MoE models,
megatron_moe and deepspeed_moe add the expert-parallel degree (and expert tp) to their grids."""
from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import replace
from typing import Any, ClassVar, Iterator

from cost_models import CostModel
from planners.base import (Budget, Planner, PlanResult, RankedPlan, SearchStats, infeasible_result, overlapped,
                           pop_options, scored_result, time_limit)
from planners.deadline import passed
from planners.registry import register
from planners.space import SearchSpace, powers_of_two, runs_tp_overlap, tp_splits, with_ep
from planners.tables import memo
from specs import MEGATRON_RECOMPUTE, ClusterSpec, DPType, LayerStrategy, ModelSpec, Plan, Schedule, SpecError, uniform_plan
from specs.precision import Precision
from specs.schedules import schedule_entry
from specs.stack import SoftwareStack
from specs.units import GIB

DEFAULTS = {"top_k": 3, "precisions": (Precision.BF16,), "time_limit_s": None}
"""time_limit_s: bounds the whole call from its first second; stopped, the grid returns its best
plan so far (no gap: the candidates not scored are not bounded), or says it has none."""


class GridPlanner(Planner):
    """Enumerate ``candidates``, each in every precision of the ``precisions`` option (bf16 by
    default); keep the fastest plan whose peak memory fits."""

    tp_comm_overlap: ClassVar[bool] = False
    """Whether its candidates run TP communication overlap where they can (tp > 1 with Megatron-SP,
    under a megatron-te cost model that scores it): the Megatron recipes, as NeMo's performance
    recipes set comm_overlap.tp_comm_overlap (hiding the collectives never slows a plan down nor
    adds memory in the cost models)."""

    def fix_precision(self, options: dict[str, Any], value: str, cluster: ClusterSpec) -> dict[str, Any]:
        """The ``precisions`` option: what SearchSpace.with_precision gives for ``value``."""
        return {**options, "precisions": SearchSpace().with_precision(value, cluster.gpu).precisions}

    @abstractmethod
    def candidates(self, model: ModelSpec, cluster: ClusterSpec, batch: int) -> Iterator[dict]:
        """uniform_plan keyword sets to try at global batch ``batch``."""

    def build(self, model: ModelSpec, cluster: ClusterSpec, batch: int, kw: dict) -> Plan | None:
        """The plan of one candidate, None if it cannot run."""
        return _plan_or_none(model, cluster, batch, kw)

    def _search(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                options: dict[str, Any]) -> PlanResult:
        opts = pop_options(options, DEFAULTS, self.name)
        limit = opts["time_limit_s"]
        deadline = None if limit is None else time.monotonic() + time_limit(limit)
        scored, smallest, tried, complete = [], None, 0, True
        for batch in budget.global_batches():
            rows, complete = self._grid(model, cluster, batch, cost_model, tuple(opts["precisions"]), deadline)
            for thr, time_s, peak, plan in rows:
                tried += 1
                smallest = peak if smallest is None else min(smallest, peak)
                if peak <= budget.memory_bytes:
                    scored.append((thr, time_s, peak, plan))
            if not complete:
                break
        stats = SearchStats(states_explored=tried, candidates=tried,
                            solver_status="exhaustive" if complete else "time_limit")
        stopped = "" if complete else f"time limit of {limit:g} s reached while scoring the grid ({tried} plans scored)"
        if not scored:
            return infeasible_result(self.name, None if stopped else smallest, stats,
                                     f"{stopped}: no plan found before it" if stopped else "")
        scored.sort(key=lambda s: (-s[0], s[1]))
        top = tuple(RankedPlan(plan=p, iteration_time_s=t, throughput_samples_per_s=thr, peak_memory_gib=pk / GIB)
                    for thr, t, pk, p in scored[:int(opts["top_k"])])
        if stopped:
            return scored_result(self.name, cost_model, model, scored[0][3], stats, top,
                                 f"{stopped}: the best plan so far, no bound")
        # every candidate scored by plan_cost: the plan is the best of the grid, its time the bound
        stats = replace(stats, gap=0.0, bound_s=scored[0][1])
        return scored_result(self.name, cost_model, model, scored[0][3], stats, top)

    def _grid(self, model: ModelSpec, cluster: ClusterSpec, batch: int, cost_model: CostModel,
              precisions: tuple[str, ...] = (Precision.BF16,), deadline: float | None = None
              ) -> tuple[list[tuple], bool]:
        """(throughput, time, peak memory, plan) of every candidate that can run at ``batch``, and
        whether that is all of them: a grid is the same for every budget, so kept per cost model
        (the budgets of a compare share it) once complete; past ``deadline`` (time.monotonic) the
        rows scored so far, not kept."""
        key = ("grid", self.name, model, cluster, batch, precisions)
        cache = memo(cost_model)
        if key in cache:
            return cache[key], True
        rows = []
        for kw in (dict(kw, precision=p) for kw in self.candidates(model, cluster, batch) for p in precisions):
            if passed(deadline):
                return rows, False
            plan = self.build(model, cluster, batch, kw)
            if plan is not None and self.tp_comm_overlap and _megatron_overlap(cost_model):
                plan = overlapped(plan, cost_model.stack) or plan
            if plan is not None:
                cost = cost_model.plan_cost(model, plan)
                rows.append((cost.throughput_samples_per_s, cost.iteration_time_s, cost.peak_memory_bytes, plan))
        cache[key] = rows
        return rows, True


def _megatron_overlap(cost_model: CostModel) -> bool:
    """Whether Megatron's TP communication overlap (Transformer Engine's userbuffers) can be
    scored: a megatron-te cost model that runs it."""
    return cost_model.stack == SoftwareStack.MEGATRON_TE and runs_tp_overlap(cost_model.capabilities)


def _plan_or_none(model: ModelSpec, cluster: ClusterSpec, batch: int, kw: dict) -> Plan | None:
    """The uniform plan of ``kw`` (vocabulary padded as Megatron pads it), None if it cannot run."""
    try:
        plan = uniform_plan(model.num_layers, global_batch=batch, model=model.name, cluster=cluster.name, **kw)
        plan.validate(model, cluster)
    except SpecError:
        return None
    if not all(tp_splits(l, s.tp) for l, s in zip(model.layers, plan.layers)):
        return None  # the executor could not run it
    return plan


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
    """Tensor parallelism over the GPUs of a scale-up domain (a node, or an NVLink rack; largest
    degree the heads allow), dp across them."""

    name = "megatron_tp"

    def candidates(self, model, cluster, batch):
        for tp in sorted(powers_of_two(min(cluster.domain_gpus, SearchSpace().max_tp)), reverse=True):
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


MEGATRON_VIRTUAL_STAGES = (1, 2, 4)
"""Interleaving degrees Megatron-LM's recipes use (--num-layers-per-virtual-pipeline-stage)."""


def micro_batch_sizes(batch: int, dp: int) -> list[int]:
    """Micro-batch sizes 1, 2, 4, ... that divide the samples each replica gets (Megatron's
    --micro-batch-size; 1 is what GPT-3-class runs use)."""
    per_replica = batch // dp if batch % dp == 0 else 0
    return [b for b in powers_of_two(per_replica) if per_replica % b == 0]


def megatron_tp_degrees(model: ModelSpec, cluster: ClusterSpec, gpus: int) -> list[int]:
    """tp inside a scale-up domain (powers of two), dividing the stage and every layer's heads."""
    return [t for t in powers_of_two(min(cluster.domain_gpus, gpus)) if gpus % t == 0
            and all(l.num_heads % t == 0 for l in model.layers)]


def megatron_pp_degrees(model: ModelSpec, cluster: ClusterSpec) -> list[int]:
    """Every pp dividing the world up to the layer count (Megatron's scripts go to pp = layers)."""
    world = cluster.world_size
    return [p for p in range(1, min(world, model.num_layers) + 1) if world % p == 0]


@register
class Megatron3d(GridPlanner):
    """The grid Megatron-LM users tune today: tp inside a node x pp up to the layer count x dp
    the rest x micro-batch size (from 1) x recompute {none, selective, full}, sequence
    parallelism on whenever tp > 1 (with TP communication overlap under megatron-te),
    interleaved 1F1B with v in {1, 2, 4} where the layers and micro-batches allow; the
    vocabulary sharded like the layers."""

    name = "megatron_3d"
    dp_type = DPType.DDP
    tp_comm_overlap = True

    def candidates(self, model, cluster, batch):
        for pp in megatron_pp_degrees(model, cluster):
            gpus = cluster.world_size // pp
            for tp in megatron_tp_degrees(model, cluster, gpus):
                dp = gpus // tp
                sp = "megatron" if tp > 1 and model.seq_len % tp == 0 else "none"
                for b in micro_batch_sizes(batch, dp):
                    m = batch // (dp * b)
                    for v in MEGATRON_VIRTUAL_STAGES:
                        schedule = Schedule.ONE_F_ONE_B if v == 1 else Schedule.INTERLEAVED_1F1B
                        if v > 1 and not schedule_entry(schedule).allows(pp, m, v):
                            continue
                        for recompute in MEGATRON_RECOMPUTE:
                            yield {"pp": pp, "tp": tp, "dp": dp, "micro_batches": m, "recompute": recompute,
                                   "sp": sp, "dp_type": self.dp_type if dp > 1 else DPType.DDP, "vocab_tp": tp,
                                   "vocab_sp": sp, "schedule": schedule, "virtual_stages": v}


@register
class DeepSpeed3d(Megatron3d):
    """The same grid with ZeRO-1 on the data-parallel dimension (DeepSpeed's 3D recipe; DeepSpeed
    has no TP communication overlap)."""

    name = "deepspeed_3d"
    dp_type = DPType.ZERO1
    tp_comm_overlap = False


@register
class MegatronSpSelective(GridPlanner):
    """Korthikanti et al.'s fixed recipe: tp = one node (largest degree the heads allow) with
    sequence parallelism, selective recomputation, micro-batch size 1, 1F1B; only pp is searched
    (every pp dividing the world up to the layer count), dp the rest."""

    name = "megatron_sp_selective"
    tp_comm_overlap = True

    def candidates(self, model, cluster, batch):
        for pp in megatron_pp_degrees(model, cluster):
            gpus = cluster.world_size // pp
            tps = megatron_tp_degrees(model, cluster, gpus)
            tp = tps[-1]
            dp = gpus // tp
            if batch % dp:
                continue
            sp = "megatron" if tp > 1 and model.seq_len % tp == 0 else "none"
            yield {"pp": pp, "tp": tp, "dp": dp, "micro_batches": batch // dp, "recompute": "selective",
                   "sp": sp, "vocab_tp": tp, "vocab_sp": sp}


@register
class MegatronCp(GridPlanner):
    """Megatron-LM's long-context recipe: tp inside a node with sequence parallelism, context
    parallelism (ring, --cp-comm-type p2p) of every power of two >= 2 whose 2 * cp chunks divide
    the sequence, pp up to the layer count, dp the rest with the distributed optimizer (ZeRO-1),
    micro-batch size 1, recompute {none, selective, full}, 1F1B."""

    name = "megatron_cp"
    tp_comm_overlap = True

    def candidates(self, model, cluster, batch):
        for pp in megatron_pp_degrees(model, cluster):
            gpus = cluster.world_size // pp
            for tp in megatron_tp_degrees(model, cluster, gpus):
                sp = "megatron" if tp > 1 and model.seq_len % tp == 0 else "none"
                for cp in powers_of_two(gpus // tp)[1:]:
                    dp = gpus // (tp * cp)
                    if model.seq_len % (2 * cp) or batch % dp:
                        continue
                    for recompute in MEGATRON_RECOMPUTE:
                        yield {"pp": pp, "tp": tp, "cp": cp, "dp": dp, "micro_batches": batch // dp,
                               "recompute": recompute, "sp": sp, "dp_type": DPType.ZERO1, "vocab_tp": tp,
                               "vocab_sp": sp}


# -- mixture-of-experts baselines -------------------------------------------------------------
def with_experts(model: ModelSpec, plan: Plan, ep: int, expert_tp: int = 0) -> Plan:
    """``plan`` with every MoE layer's routed experts over ``ep`` ranks at expert tp ``expert_tp``
    (0 = the layer's tp); the experts keep the layer's dp type unless no expert-dp replica is
    left to shard over (then DDP)."""
    if ep == 1 and expert_tp == 0:
        return plan
    split: dict[LayerStrategy, LayerStrategy] = {}  # one object per strategy: the cost model's memo hits by id
    for spec, s in zip(model.layers, plan.layers):
        if spec.moe is not None and s not in split:
            split[s] = with_ep(s, ep, expert_tp)
    return replace(plan, layers=tuple(split[s] if spec.moe is not None else s
                                      for spec, s in zip(model.layers, plan.layers)))


def ep_degrees(model: ModelSpec, room: int) -> list[int]:
    """Expert-parallel degrees (powers of two) dividing every MoE layer's experts and ``room``
    (the ranks ep may take: dp x tp / expert tp)."""
    counts = {l.moe.num_experts for l in model.layers if l.moe is not None}
    if not counts:
        return [1]
    return [e for e in powers_of_two(room) if room % e == 0 and all(n % e == 0 for n in counts)]


class _MoEGrid(GridPlanner):
    """A grid whose candidates carry ``ep`` and ``expert_tp`` for the MoE layers (on a dense
    model only ep 1: the framework's dense grid)."""

    def build(self, model: ModelSpec, cluster: ClusterSpec, batch: int, kw: dict) -> Plan | None:
        kw = dict(kw)
        ep, etp = kw.pop("ep"), kw.pop("expert_tp")
        plan = _plan_or_none(model, cluster, batch, kw)
        if plan is None:
            return None
        plan = with_experts(model, plan, ep, etp)
        try:
            plan.validate(model, cluster)
        except SpecError:
            return None
        return plan


@register
class MegatronMoE(_MoEGrid):
    """What Megatron-Core MoE users tune: the megatron_3d grid (tp inside a node with sequence
    parallelism, pp, micro-batch size, recompute, interleaving) x ep (carved out of dp) x expert
    tp in {tp, 1}, with the distributed optimizer (ZeRO-1) as its MoE recipes run."""

    name = "megatron_moe"
    dp_type = DPType.ZERO1
    tp_comm_overlap = True

    def candidates(self, model, cluster, batch):
        for kw in Megatron3d.candidates(self, model, cluster, batch):
            gpus = kw["tp"] * kw["dp"]
            moe = any(l.moe is not None for l in model.layers)
            for etp in dict.fromkeys((kw["tp"], 1) if moe else (kw["tp"],)):
                for ep in ep_degrees(model, gpus // etp):
                    yield {**kw, "ep": ep, "expert_tp": 0 if etp == kw["tp"] else etp}


@register
class DeepSpeedMoE(_MoEGrid):
    """DeepSpeed-MoE as its tutorials run it: no pipeline, tp inside a node for the dense part,
    experts whole (expert tp 1) over ep ranks, ZeRO-1 or ZeRO-2 on the dense and the expert
    data-parallel groups, gradient accumulation (micro-batch counts) and full checkpointing or none."""

    name = "deepspeed_moe"

    def candidates(self, model, cluster, batch):
        world = cluster.world_size
        for tp in megatron_tp_degrees(model, cluster, world):
            dp = world // tp
            for b in micro_batch_sizes(batch, dp):
                for ep in ep_degrees(model, world):
                    for dp_type in (DPType.ZERO1, DPType.ZERO2):
                        for recompute in ("none", "full"):
                            yield {"tp": tp, "dp": dp, "micro_batches": batch // (dp * b), "recompute": recompute,
                                   "dp_type": dp_type if dp > 1 else DPType.DDP, "vocab_tp": tp,
                                   "ep": ep, "expert_tp": 1 if tp > 1 else 0}
