"""Targets: what a training framework can run, as a restricted search space, and the search for
the best plan of it. Megatron, torchtitan and DeepSpeed run one strategy for every layer, so their
spaces are searched exhaustively over uniform plans with even stages (every candidate scored by
plan_cost, refused ones filtered by the framework's own export check); Galvatron runs per-layer
choices with one default dp type besides ZeRO-3, so its DP runs once per dp-type family."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

import frameworks
from frameworks.base import schedule_fields, vocab_sharded
from cost_models import CostModel
from planners.base import (Budget, Planner, PlanResult, RankedPlan, SearchStats, infeasible_result, overlapped,
                           pop_options, scored_result)
from planners.galvatron import GalvatronPlanner
from planners.registry import register
from planners.space import SearchSpace, runs_tp_overlap
from specs import (MEGATRON_RECOMPUTE, ClusterSpec, DPType, ModelSpec, Plan, Recompute, Schedule, SequenceParallel,
                   SpecError)
from specs.precision import Precision
from specs.schedules import schedule_entry
from specs.stack import SoftwareStack
from specs.units import GIB

TARGETS = ("none", "megatron", "torchtitan", "deepspeed", "galvatron")
UNIFORM = ("megatron", "torchtitan", "deepspeed")
SCHEDULES = {"megatron": (Schedule.ONE_F_ONE_B,),
             "torchtitan": (Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.ZBV, Schedule.DUALPIPE_V),
             "deepspeed": (Schedule.ONE_F_ONE_B,)}
"""Pipeline schedules each uniform target runs (interleaving where its space has virtual stages).
torchtitan's V-shaped ZBVZeroBubble and DualPipeV are tried at 1F1B's micro-batch counts, as the
unrestricted search tries them; its LoopedBFS, which the full space does not search (it holds
every micro-batch, as GPipe), is exported and imported but not searched."""
TP_OVERLAP_TARGETS = ("megatron", "torchtitan")
"""Targets whose files carry TP communication overlap: Megatron's tp_comm_overlap (Transformer
Engine's userbuffers) and torchtitan's async TP, which needs torch.compile (its export refuses
it under any other stack, so only a compile cost model's plans carry it); DeepSpeed's and
Galvatron's files have none."""
GALVATRON_FAMILIES = ((DPType.DDP, DPType.ZERO3), (DPType.ZERO2, DPType.ZERO3))
"""A Galvatron file names one default dp type (ddp or zero2) besides per-layer ZeRO-3."""
NONE, MEGATRON_SP = SequenceParallel.NONE, SequenceParallel.MEGATRON


def target_space(name: str, base: SearchSpace | None = None) -> SearchSpace:
    """``base`` (default: the full preset) restricted to what framework ``name`` runs."""
    base = base or SearchSpace.preset("full")
    common = dict(tp_consecutive=(True,), vocab_zero3=(False,), precisions=(Precision.BF16,))  # exports are BF16
    no_cp = dict(cp=(1,))  # only the Megatron and Galvatron files carry context parallelism
    spaces = {
        "none": base,
        # DDP or the distributed optimizer; none, selective or full recompute; Megatron-SP;
        # interleaving; ep with etp
        "megatron": replace(base, dp_types=(DPType.DDP, DPType.ZERO1), sp=(NONE, MEGATRON_SP),
                            recompute=MEGATRON_RECOMPUTE, vocab_sp=(NONE, MEGATRON_SP), **common),
        # DDP or FSDP2 (zero3; zero2 = reshard_after_forward never); full AC, per-op selective AC
        # (where the cost model's stack runs it: within() drops it otherwise) or none; TP with or
        # without sequence parallelism; interleaving; ep with whole experts
        "torchtitan": replace(base, dp_types=(DPType.DDP, DPType.ZERO2, DPType.ZERO3), sp=(NONE, MEGATRON_SP),
                              recompute=(Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE_OP),
                              vocab_sp=(NONE, MEGATRON_SP), **common, **no_cp),
        # ZeRO 0-3 (0-1 under its pipeline engine, checked on export); full checkpointing or none;
        # Megatron-SP and Ulysses; no interleaving, no expert parallelism
        "deepspeed": replace(base, sp=tuple(SequenceParallel), recompute=(Recompute.NONE, Recompute.FULL),
                             virtual_stages=(1,), expert_parallel=(1,), **common, **no_cp),
        # per-layer tp/Ulysses/cp (the full preset's p2p, a2a+p2p), ZeRO flavours, full checkpointing;
        # no ZeRO-1, Megatron-SP, interleaving, ep
        "galvatron": replace(base, dp_types=(DPType.DDP, DPType.ZERO2, DPType.ZERO3), sp=(NONE, SequenceParallel.ULYSSES),
                             recompute=(Recompute.NONE, Recompute.FULL), virtual_stages=(1,), expert_parallel=(1,),
                             vocab_sp=(NONE, SequenceParallel.ULYSSES), precisions=(Precision.BF16,)),
    }
    if name not in spaces:
        raise SpecError("target", f"unknown target {name!r}; choose from {', '.join(TARGETS)}")
    if name == "none" or name in TP_OVERLAP_TARGETS:  # both ways (none: no target's plan may beat it);
        spaces[name] = replace(spaces[name], tp_comm_overlap=(False, True))  # within() drops what cannot be scored
    # the uniform targets' schedules are SCHEDULES' (uniform_plans), Galvatron's 1F1B
    return spaces[name] if name == "none" else replace(spaces[name], uniform_schedules=())


def uniform_plans(target: str, model: ModelSpec, cluster: ClusterSpec, batch: int,
                  space: SearchSpace, overlap_stack: SoftwareStack | None = None) -> Iterator[Plan]:
    """Every uniform plan of ``space`` at global batch ``batch`` (even stages, the vocabulary split
    like the layers) that framework ``target`` exports without refusal; with ``overlap_stack``
    (where the space searches TP communication overlap), also each one that can run it with it on,
    stating that stack."""
    framework = frameworks.get(target)
    for pp in space.pp_choices(model, cluster):
        if model.num_layers % pp:
            continue
        for s in space.stage_strategies(cluster.world_size // pp, model):
            for schedule in SCHEDULES[target]:
                for v, counts in _micro_batch_counts(space, schedule, batch, pp):
                    for m in counts:
                        plan = _uniform(model, cluster, s, pp, m, v, batch, schedule)
                        if plan is None:
                            continue
                        on = overlapped(plan, overlap_stack) if overlap_stack is not None else None
                        yield from (p for p in (plan, on) if p is not None and _launchable(framework, p, model, cluster))


def _micro_batch_counts(space: SearchSpace, schedule: str, batch: int, pp: int) -> Iterator[tuple[int, list[int]]]:
    """(chunks per rank, micro-batch counts) of ``schedule`` on ``pp`` stages: a flat schedule's
    own rules, interleaving at each of the space's virtual stages, a split or V-shaped one at
    1F1B's counts that it allows (as the unrestricted search's uniform phase tries it)."""
    entry = schedule_entry(schedule)
    if entry.splits_backward:
        v = entry.min_virtual_stages
        flat = replace(space, schedule=Schedule.ONE_F_ONE_B).micro_batch_choices(batch, pp)
        yield v, [m for m in flat if entry.allows(pp, m, v)]
        return
    spaced = replace(space, schedule=schedule)
    for v in (space.virtual_stages if schedule == Schedule.ONE_F_ONE_B and pp > 1 else (1,)):
        yield v, spaced.micro_batch_choices(batch, pp, v)


def _uniform(model: ModelSpec, cluster: ClusterSpec, s: Any, pp: int, m: int, v: int, batch: int,
             schedule: str) -> Plan | None:
    dense = replace(s, ep=1, expert_tp=0, expert_dp_type=None)
    layers = tuple(s if spec.moe is not None else dense for spec in model.layers)
    try:
        plan = Plan(pp=pp, stage_layers=(model.num_layers // pp,) * pp, layers=layers, global_batch=batch,
                    micro_batches=m, **schedule_fields(schedule, v), vocab_tp=s.degrees.split, vocab_sp=s.sp,
                    vocab_zero3=vocab_sharded(s.dp_type, s.degrees.grad_sync, model), model=model.name, cluster=cluster.name)
        plan.validate(model, cluster)
    except SpecError:
        return None
    return plan


def _launchable(framework: frameworks.Framework, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> bool:
    try:
        framework.check(plan, model, cluster)
    except SpecError:
        return False
    return True


DEFAULTS = {"target": "none", "top_k": 3, "galvatron": {}}
"""target: one of TARGETS; galvatron: options of the galvatron planner (targets none and galvatron)."""


@register
class TargetPlanner(Planner):
    """The best plan a framework can launch (``target`` option): uniform targets exhaustively,
    galvatron by its DP per dp-type family, none by the DP over the full space."""

    name = "target"
    defaults: dict[str, Any] = DEFAULTS

    def _search(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                options: dict[str, Any]) -> PlanResult:
        opts = pop_options(options, self.defaults, self.name)
        target, space = opts["target"], target_space(opts["target"])
        if target in UNIFORM:
            return _best_uniform(self.name, target, model, cluster, budget, cost_model, space, int(opts["top_k"]))
        families = GALVATRON_FAMILIES if target == "galvatron" else (space.dp_types,)
        # _search, not plan: ``budget`` is already less the allocator reserve (plan would take it twice)
        results = [GalvatronPlanner()._search(model, cluster, budget, cost_model,
                                              {**opts["galvatron"], "space": replace(space, dp_types=f)})
                   for f in families]
        best = max(results, key=lambda r: (r.feasible, r.throughput_samples_per_s))
        if not best.feasible:
            floors = [r.min_memory_gib for r in results if r.min_memory_gib is not None]
            return replace(best, planner=self.name, min_memory_gib=min(floors) if floors else None)
        return replace(best, planner=self.name)


def _best_uniform(name: str, target: str, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                  space: SearchSpace, top_k: int) -> PlanResult:
    scored, smallest, tried = [], None, 0
    space = space.within(cost_model.capabilities)  # e.g. selective-op only where the model's stack runs it
    overlap = True in space.tp_comm_overlap and runs_tp_overlap(cost_model.capabilities)
    for batch in budget.global_batches():
        for plan in uniform_plans(target, model, cluster, batch, space, cost_model.stack if overlap else None):
            cost = cost_model.plan_cost(model, plan)
            tried += 1
            smallest = cost.peak_memory_bytes if smallest is None else min(smallest, cost.peak_memory_bytes)
            if cost.peak_memory_bytes <= budget.memory_bytes:
                scored.append((cost.throughput_samples_per_s, cost.iteration_time_s, cost.peak_memory_bytes, plan))
    stats = SearchStats(states_explored=tried, candidates=tried, solver_status="exhaustive")
    if not scored:
        return infeasible_result(name, smallest, stats)
    scored.sort(key=lambda row: (-row[0], row[1]))
    stats = replace(stats, gap=0.0, bound_s=scored[0][1])
    top = tuple(RankedPlan(plan=p, iteration_time_s=t, throughput_samples_per_s=thr, peak_memory_gib=pk / GIB)
                for thr, t, pk, p in scored[:top_k])
    return scored_result(name, cost_model, model, scored[0][3], stats, top,
                         message=f"target {target}: {tried} uniform plans scored")


def _fixed(target: str) -> type[TargetPlanner]:
    """A registered planner ``target_<name>``: TargetPlanner whose target defaults to ``name``,
    so that one compare table shows every target beside the others."""
    cls = type(f"Target{target.title()}", (TargetPlanner,), {
        "name": f"target_{target}", "defaults": {**DEFAULTS, "target": target},
        "__doc__": f"The best plan {target} can launch (TargetPlanner with target {target})."})
    return register(cls)


for _name in TARGETS[1:]:
    _fixed(_name)


def plan_for_target(target: str, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                    **options: Any) -> PlanResult:
    """The best plan ``target`` can launch (TargetPlanner with ``target``)."""
    return TargetPlanner().plan(model, cluster, budget, cost_model, {"target": target, **options})
