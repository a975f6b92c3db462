"""The outer loops every search planner shares: global batch x pp x micro-batches groups, ordered
by a lower bound and pruned by it, each solved by a planner-specific group solver, every plan
re-scored with plan_cost; and the smallest memory of the space when nothing fits."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from cost_models import CostModel, pipeline_time, stage_in_flight
from planners.base import (
    PlanResult,
    RankedPlan,
    SearchStats,
    infeasible_result,
    scored_result,
)
from planners.deadline import DeadlinePassed, check, passed
from planners.seed import uniform_activation_sums, uniform_layer_sums, uniform_seed
from planners.segments import GAP_RTOL, GroupSolution
from planners.space import Combo, SearchSpace, VocabChoice, combos
from planners.tables import (ComboTables, build_layer_tables, build_tables, cached_table_bytes, is_built,
                             relayout_table_bytes, temp_levels)
from specs import ModelSpec, Plan, Schedule, SpecError, chunk_layout, even_stage_layers
from specs.schedules import PipelineFormula, schedule_entry
from specs.units import GIB

RESCORE_RTOL = 1e-6
"""Planner objective vs plan_cost: they are the same formula, so they agree to rounding."""


@dataclass
class OuterState:
    """What the outer loop collected."""

    solutions: list[tuple[float, float, object]] = field(default_factory=list)
    """(throughput, time, plan) of every group's plan."""
    candidates: int = 0
    pruned: int = 0
    states: int = 0
    mismatch: float = 0.0
    """Largest relative gap between a solver objective and plan_cost (should be ~0)."""
    upper_thr: float = 0.0
    """The most throughput a plan not found could have: max over groups not solved to proof of
    global batch / their lower bound (groups skipped by a bound never exceed the best found)."""
    unbounded: int = 0
    """Groups left without any bound (their tables not built before the time limit)."""
    timed_out: bool = False
    """The time limit ended the search before every group was settled."""
    tables_s: float = 0.0
    groups_s: float = 0.0
    """Seconds spent building tables / inside the group solver."""
    proof_s: float = 0.0
    """Of groups_s: proving open groups after the search (galvatron's fast mode)."""
    limit_s: float | None = None
    """The call's time_limit_s (None: no limit), named in the message of a search it stops."""
    doing: str = ""
    """The step the time limit stopped (``stop``), named in the search's message."""

    def keep(self, cost_model: CostModel, model: ModelSpec, plan, budget_bytes: float):
        """Score ``plan`` with plan_cost and keep it if it fits the budget (a solver working in
        rounded units may overshoot; such plans are not returned). Returns the cost if kept."""
        cost = cost_model.plan_cost(model, plan)
        if cost.peak_memory_bytes > budget_bytes * (1 + 1e-12):
            return None
        self.solutions.append((cost.throughput_samples_per_s, cost.iteration_time_s, plan))
        return cost

    def keep_solution(self, cost_model: CostModel, model: ModelSpec, t: ComboTables, sol: GroupSolution,
                      budget_bytes: float, meta: dict) -> None:
        """``keep`` the plan of a group solver's solution, noting how far plan_cost's time is from
        the solver's objective."""
        cost = self.keep(cost_model, model, t.plan(sol.choice, sol.stage_layers, sol.vocab_tp, meta), budget_bytes)
        if cost is not None:
            rel = abs(cost.iteration_time_s - sol.objective_s) / cost.iteration_time_s
            self.mismatch = max(self.mismatch, rel)

    def stop(self, doing: str) -> None:
        """The time limit stopped the search during ``doing`` (the first step it stopped is named)."""
        if not self.timed_out:
            self.timed_out, self.doing = True, doing

    def throughputs(self, top_k: int) -> tuple[float, float]:
        """(best, top_k-th best) throughput kept so far, 0 where there are not that many plans:
        a group must beat the first to matter, the second to enter the top_k."""
        ranked = sorted((s[0] for s in self.solutions), reverse=True)
        return (ranked[0] if ranked else 0.0), (ranked[top_k - 1] if len(ranked) >= top_k else 0.0)

    def bound(self, global_batch: int, lower_bound_s: float) -> None:
        """Record a group's lower bound on iteration time (inf: proven to have no plan)."""
        if lower_bound_s > 0:
            self.upper_thr = max(self.upper_thr, global_batch / lower_bound_s)
        else:
            self.unbounded += 1

    def gap(self) -> tuple[float | None, float | None]:
        """(bound_s, relative gap) of the best plan: the iteration time at its global batch that
        the best throughput any plan could reach would take; None where some group has no bound."""
        if not self.solutions or self.unbounded:
            return None, None
        thr, _, plan = max(self.solutions, key=lambda s: (s[0], -s[1]))
        upper = max(thr, self.upper_thr)
        gap = 1.0 - thr / upper
        return plan.global_batch / upper, 0.0 if gap <= GAP_RTOL else gap


def grouped_tables(model: ModelSpec, cost_model: CostModel, budget_bytes: float, space: SearchSpace,
                   batches: tuple[int, ...]) -> list[ComboTables]:
    """One ComboTables per (global batch, pp, micro-batches), with all its vocab tps."""
    space = space.for_cluster(cost_model.cluster)
    return [build_tables(model, cost_model, cs[0], [c.vocab for c in cs], space, budget_bytes)
            for cs in combo_groups(model, cost_model, space, batches)]


def combo_groups(model: ModelSpec, cost_model: CostModel, space: SearchSpace, batches: tuple[int, ...]
                 ) -> list[list[Combo]]:
    """The combos of ``space`` (already for the cluster's GPU) by (global batch, pp, micro-batches,
    schedule): one list per group, one combo per vocab choice. SpecError where the relayout tables
    of the groups not built yet would not fit in memory (_check_table_memory)."""
    groups: dict[tuple, list[Combo]] = {}
    for c in combos(model, cost_model.cluster, batches, space):
        groups.setdefault((c.global_batch, c.pp, c.micro_batches, c.schedule), []).append(c)
    _check_table_memory(model, cost_model, space, [cs for cs in groups.values()
                                                   if not is_built(model, cost_model, cs[0], [c.vocab for c in cs], space)])
    return list(groups.values())


def build_layer_groups(model: ModelSpec, cost_model: CostModel, budget_bytes: float, space: SearchSpace,
                       groups: list[list[Combo]], deadline: float | None = None) -> list[ComboTables]:
    """The layer tables (build_layer_tables) of ``groups`` in order, until ``deadline``
    (time.monotonic) passes, part-way through one group or before it (then possibly none)."""
    out = []
    try:
        for cs in groups:
            check(deadline)
            out.append(build_layer_tables(model, cost_model, cs[0], space, budget_bytes, deadline))
    except DeadlinePassed:
        pass
    return out


TABLE_MEMORY_FRACTION = 0.5
"""Of the machine's physical memory, the most the cost tables of one search may take (their
relayout tables grow with the square of the strategies per stage)."""


def _check_table_memory(model: ModelSpec, cost_model: CostModel, space: SearchSpace, groups: list[list[Combo]]
                        ) -> None:
    """SpecError before any table is built when the groups' relayout tables would need more than
    TABLE_MEMORY_FRACTION of physical memory: a search that would be killed for memory stops
    with the numbers instead."""
    by_pp: dict[int, float] = {}
    need = sum(by_pp.setdefault(cs[0].pp, relayout_table_bytes(model, cost_model, space, cs[0].pp)) for cs in groups)
    held = cached_table_bytes(cost_model) if need else 0.0
    allowed = TABLE_MEMORY_FRACTION * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need + held > allowed:
        gpus = cost_model.cluster.world_size // min(by_pp)
        raise SpecError("space", f"cost tables would need {need / GIB:.1f} GiB for {len(groups)} (global batch, "
                        f"pp, micro-batch) groups ({len(space.stage_strategies(gpus, model))} strategies per "
                        f"stage at {gpus} GPUs) beside {held / GIB:.1f} GiB cached, more than "
                        f"{TABLE_MEMORY_FRACTION:.0%} of this machine's {allowed / TABLE_MEMORY_FRACTION / GIB:.0f} "
                        "GiB: search a smaller space (for a MoE model: space=moe) or fewer global batches")


def lower_bound_s(t: ComboTables) -> float:
    """The schedule's linear form, least over the vocab choices, with sum_k T_k >= the sum of each
    layer's fastest strategy (+ embedding/head) and max_k T_k >= their mean, and on a pipeline
    >= the first stage's least (the embedding and layer 0) and the last's (the head and the last
    layer): on a deep pipeline the stages holding the embedding and the head, not the mean,
    floor the slowest."""
    pp, formula = t.combo.pp, t.combo.formula
    layers = _least_layers_s(t)
    ends = (float(np.min(t.stages[0].time_s[t.layer_type[0]])), float(np.min(t.stages[-1].time_s[t.layer_type[-1]])))
    out = np.inf
    for costs in t.vocab.values():
        vocab = [vc.time_s + _least_delta(vc) for vc in costs]  # each stage's embedding/head at its least
        total = layers + sum(vocab)
        slowest = max(total / pp, vocab[0] + ends[0], vocab[-1] + ends[1]) if pp > 1 else total
        out = min(out, formula.fill * total + formula.steady * slowest)
    return out


def layers_lower_bound_s(t: ComboTables) -> float:
    """lower_bound_s with the embedding and head left out (each stage's share of them >= 0), which
    layer tables (build_layer_tables) alone give: the schedule's linear form with sum_k T_k >= the
    sum of each layer's fastest strategy and max_k T_k >= their mean."""
    total, formula = _least_layers_s(t), t.combo.formula
    return formula.fill * total + formula.steady * total / t.combo.pp


def _least_layers_s(t: ComboTables) -> float:
    """The sum over the layers of each one's least time on any stage under any strategy."""
    per_type = np.min([np.min(s.time_s, axis=1) for s in t.stages], axis=0)
    return float(per_type[t.layer_type].sum())


def _least_delta(vc) -> float:
    """The most the first/last layer's dp type can take off one stage's embedding/head time (<= 0)."""
    out = 0.0
    for d in (vc.first_delta, vc.last_delta):
        if d is not None:
            out += min(0.0, float(d[:, 0].min()))
    return out


def run_outer(name: str, model: ModelSpec, cost_model: CostModel, budget_bytes: float, space: SearchSpace,
              batches: tuple[int, ...], solve: Callable[[ComboTables, float], list[GroupSolution]],
              top_k: int, meta: dict, state: OuterState | None = None, deadline: float | None = None,
              seed: bool = True, refine: Callable[[ComboTables, float], float] | None = None,
              layers_floor: Callable[[ComboTables, float], float] | None = None
              ) -> tuple[OuterState, list[ComboTables]]:
    """Build every group's layer tables; seed with the interleaved plans and then the uniform
    recipes (``seed``; else the interleaved plans come last); complete the tables (relayouts,
    sends, vocabulary) of the groups whose layers alone may still beat the top_k plans; solve
    those in order of their lower bound, skipping a group whose bound cannot beat the best.
    ``refine(tables, incumbent_s)``: a tighter bound of a group, asked of every group the cheap
    bound keeps after the seeds, so that the groups are searched in its order (the best group
    first, whose plan then rules the others out). Past ``deadline`` (time.monotonic) every step
    stops where it is (tables, seeds, groups): the groups with full tables keep their lower
    bound, those with layer tables alone their layers-only bound, those with none no bound;
    ``state.doing`` names the step. ``layers_floor(layer tables, incumbent_s)``: a lower bound on
    a group's objective from its layer tables alone, asked before its tables are completed where
    the memory-blind layers-only bound cannot rule it out (0: none). Returns the full tables built."""
    state = state or OuterState()
    # no table for what the cost model cannot price, nor for a precision the GPU cannot run
    space = space.within(cost_model.capabilities).for_cluster(cost_model.cluster)
    prune = cost_model.objective_is_plan_cost  # else a bound on the planners' sum bounds nothing
    groups = combo_groups(model, cost_model, space, batches)
    start = time.perf_counter()
    layers = build_layer_groups(model, cost_model, budget_bytes, space, groups, deadline)
    state.tables_s += time.perf_counter() - start
    if len(layers) < len(groups):
        state.unbounded += len(groups) - len(layers)
        state.stop(f"building cost tables ({len(layers)} of {len(groups)} groups built)")
    if seed:
        _all_interleaved(layers, model, cost_model, budget_bytes, space, top_k, meta, state, deadline)
    start = time.perf_counter()
    tables = _complete_groups(layers, groups, model, cost_model, budget_bytes, space, top_k, state, deadline, prune,
                              layers_floor)
    state.tables_s += time.perf_counter() - start
    bounds = [lower_bound_s(t) for t in tables]
    if seed:
        _seed_uniform(tables, model, cost_model, budget_bytes, top_k, meta, state, deadline)
    order = sorted(range(len(tables)), key=lambda i: -tables[i].combo.global_batch / bounds[i])
    if refine is not None and prune:
        start = time.perf_counter()
        _refine(tables, bounds, order, refine, state, top_k, deadline)
        state.groups_s += time.perf_counter() - start
        order = sorted(order, key=lambda i: -tables[i].combo.global_batch / bounds[i])
    for i in order:
        t = tables[i]
        state.candidates += len(t.vocab)
        best_thr, threshold = state.throughputs(top_k)
        if prune and t.combo.global_batch / bounds[i] <= threshold:
            state.pruned += len(t.vocab)
            continue
        if passed(deadline):
            state.stop("searching the groups")
            state.bound(t.combo.global_batch, bounds[i])
            continue
        incumbent = t.combo.global_batch / best_thr if best_thr > 0 and prune else float("inf")
        start = time.perf_counter()
        found = solve(t, incumbent)
        state.groups_s += time.perf_counter() - start
        for sol in found:
            state.keep_solution(cost_model, model, t, sol, budget_bytes, meta)
    if not seed:
        _all_interleaved(layers, model, cost_model, budget_bytes, space, top_k, meta, state, deadline)
    return state, tables


def _complete_groups(layers: list[ComboTables], groups: list[list[Combo]], model: ModelSpec, cost_model: CostModel,
                     budget_bytes: float, space: SearchSpace, top_k: int, state: OuterState, deadline: float | None,
                     prune: bool, layers_floor: Callable[[ComboTables, float], float] | None = None
                     ) -> list[ComboTables]:
    """The full tables (build_tables) of the groups of layer tables ``layers`` whose layers-only
    bound, and then ``layers_floor`` (if given), may still beat the top_k-th plan kept (with
    ``prune``), in order; the others are pruned, every vocab choice (their relayouts, sends and
    vocabulary are never built). Past ``deadline`` a group not completed keeps its layers-only
    bound."""
    out = []
    for t, cs in zip(layers, groups):
        floor_s = layers_lower_bound_s(t)
        threshold = state.throughputs(top_k)[1]
        gb = t.combo.global_batch
        if prune and threshold > 0 and (gb / floor_s <= threshold or (
                layers_floor is not None and gb / max(floor_s, layers_floor(t, gb / threshold)) <= threshold)):
            state.candidates += len(cs)
            state.pruned += len(cs)
            continue
        try:
            check(deadline)
            out.append(build_tables(model, cost_model, t.combo, [c.vocab for c in cs], space, budget_bytes, deadline))
        except DeadlinePassed:
            state.stop(f"building cost tables ({len(out)} of {len(groups)} groups' relayouts built)")
            state.bound(t.combo.global_batch, floor_s)
    return out


def _refine(tables: list[ComboTables], bounds: list[float], order: list[int], refine: Callable, state: OuterState,
            top_k: int, deadline: float | None) -> None:
    """bounds[i] lifted by ``refine`` for the groups the cheap bound does not prune under the
    seeds' incumbent (in the cheap bound's order, until ``deadline``)."""
    best_thr, threshold = state.throughputs(top_k)
    for i in order:
        gb = tables[i].combo.global_batch
        if gb / bounds[i] <= threshold:
            continue
        if passed(deadline):
            state.stop("bounding the groups")
            return
        bounds[i] = max(bounds[i], refine(tables[i], gb / best_thr if best_thr > 0 else np.inf))


def _all_interleaved(tables: list[ComboTables], model: ModelSpec, cost_model: CostModel, budget_bytes: float,
                     space: SearchSpace, top_k: int, meta: dict, state: OuterState, deadline: float | None) -> None:
    """The uniform phase of every schedule beyond the tables' own: interleaved 1F1B at each
    ``virtual_stages`` > 1 and each of ``space.uniform_schedules``, those the cost model scores."""
    runs = [(Schedule.INTERLEAVED_1F1B, v) for v in space.virtual_stages if v > 1]
    runs += [(s, schedule_entry(s).min_virtual_stages) for s in space.uniform_schedules]
    runs = [(s, v) for s, v in runs if cost_model.capabilities.supports("schedule", s)]
    for t in tables:
        for schedule, v in runs:
            _interleaved(t, schedule, v, model, cost_model, budget_bytes, space, top_k, meta, state, deadline)


def _seed_uniform(tables: list[ComboTables], model: ModelSpec, cost_model: CostModel, budget_bytes: float,
                  top_k: int, meta: dict, state: OuterState, deadline: float | None) -> None:
    """Before any group is searched: the best uniform plans (one strategy for every layer, even
    stages: the recipes Megatron and DeepSpeed run) of every group and vocab choice, scored from
    the tables at once; the top_k of them are re-scored with plan_cost and kept. The first
    incumbent is then at least as good as every uniform recipe of the space, so a search stopped
    by its time limit after the seeds never returns less (``deadline`` is checked between groups
    and between the plans re-scored)."""
    seeds = []
    for t in tables:
        if passed(deadline):
            state.stop("seeding uniform plans")
            return
        for v in t.vocab:
            found = uniform_seed(t, v)
            if found is not None:
                seeds.append((t.combo.global_batch / found[0], found[1], v, t))
    for _, strategy, v, t in sorted(seeds, key=lambda s: -s[0])[:top_k]:
        if passed(deadline):
            state.stop("seeding uniform plans")
            return
        n, pp = len(t.layer_type), t.combo.pp
        state.keep(cost_model, model, t.plan([strategy] * n, list(even_stage_layers(n, pp)), v, meta), budget_bytes)


def _interleaved(t: ComboTables, schedule: str, v: int, model: ModelSpec, cost_model: CostModel,
                 budget_bytes: float, space: SearchSpace, top_k: int, meta: dict, state: OuterState,
                 deadline: float | None) -> None:
    """``schedule`` with v chunks per rank (interleaved 1F1B, zero-bubble, V-shaped, looped)
    over uniform plans (one strategy for every layer, the vocabulary sharded like the layers,
    Megatron's chunk layout: how frameworks run them), scored by plan_cost. Strategies go in
    order of a lower bound from the tables and stop once it cannot reach the top_k plans found
    so far; plans the tables show cannot fit are not scored, nor (where plan_cost is the
    planners' formula: CostModel.objective_is_plan_cost) those whose uniform_plan_floor_s cannot
    reach them. The first bound is the schedule's formula over the layers alone, with no
    bubble under a split-backward schedule."""
    c, n, entry = t.combo, len(t.layer_type), schedule_entry(schedule)
    if c.schedule != Schedule.ONE_F_ONE_B or not entry.allows(c.pp, c.micro_batches, v) or n < c.pp * v:
        return
    uniform = np.flatnonzero(t.allowed.all(axis=0))
    if not len(uniform):
        return
    layout = uniform_schedule_plan(t, int(uniform[0]), schedule, v, space, meta)  # every strategy's layers
    stage_ids = tuple(tuple(ids) for ids in layout.stage_ranges())
    floor = _interleaved_floor(t, uniform, entry.formula(c.micro_batches, v), stage_ids)
    order = np.argsort(floor)
    tables_fit = _tables_fit(t, uniform, stage_ids) if holds_1f1b_count(schedule, c.pp, c.micro_batches) else None
    fits = None  # worked out when a plan first passes both (the schedule's program is played)
    for pos, i in enumerate(order):
        threshold = state.throughputs(top_k)[1]
        if c.global_batch / floor[i] <= threshold:
            state.pruned += len(order) - pos
            return
        if tables_fit is not None and not tables_fit[i]:
            state.pruned += 1
            continue
        if fits is None:
            fits = _scheduled_fits(t, uniform, layout, stage_ids)
        if not fits[i]:
            state.pruned += 1
            continue
        if passed(deadline):  # the rest, bounded by the best of them
            state.stop(f"scoring {schedule} plans")
            state.bound(c.global_batch, floor[i])
            return
        state.candidates += 1
        plan = uniform_schedule_plan(t, int(uniform[i]), schedule, v, space, meta)
        bounded = threshold > 0 and cost_model.objective_is_plan_cost  # else the floor bounds nothing
        beat_s = c.global_batch / threshold if bounded else np.inf
        if bounded and uniform_plan_floor_s(t, cost_model, model, plan, int(uniform[i]), beat_s) >= beat_s:
            state.pruned += 1
            continue
        state.keep(cost_model, model, plan, budget_bytes)


def uniform_schedule_plan(t: ComboTables, strategy: int, schedule: str, v: int, space: SearchSpace,
                          meta: dict) -> Plan:
    """Group ``t``'s plan under ``schedule`` with v chunks per rank whose every layer runs strategy
    index ``strategy``, the vocabulary sharded like the layers, in Megatron's chunk layout."""
    c, n = t.combo, len(t.layer_type)
    stage_layers, chunk_layers = chunk_layout(n, c.pp, v, schedule) if v > 1 else (even_stage_layers(n, c.pp), ())
    s = t.strategies[strategy]
    vocab = VocabChoice(s.degrees.split, False, s.sp if s.sp in space.vocab_sp else "none")
    return replace(t.plan([strategy] * n, list(stage_layers), vocab, meta), schedule=schedule, virtual_stages=v,
                   chunk_layers=chunk_layers)


def _interleaved_floor(t: ComboTables, uniform: np.ndarray, formula: PipelineFormula,
                       stage_ids: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Per uniform strategy: a lower bound on its plan's time under the schedule, stage k holding
    layers ``stage_ids[k]``. A stage's time is at least its layers' (sends and the embedding/head
    left out) and m max T + bubble (sum T - max T) / v + max D grows with every T_k."""
    T, D, _, _ = uniform_layer_sums(t, uniform, stage_ids)
    return formula.time_s(T.max(axis=0), T.sum(axis=0), D.max(axis=0))


def uniform_plan_floor_s(t: ComboTables, cost_model: CostModel, model: ModelSpec, plan: Plan, strategy: int,
                         beat_s: float = np.inf) -> float:
    """A lower bound on plan_cost's time of ``plan``, a plan of group ``t`` whose every layer runs
    strategy index ``strategy`` (any schedule, chunk layout and vocabulary): each stage's T_k and
    D_k are its layers' (the tables') plus, on the stages holding the embedding and the head, the
    vocabulary's (vocab_cost, plan_cost's own call); relayouts, sends and the vocabulary's
    overheads on other stages (each >= 0) are left out. The pipeline's time grows with every T_k
    and D_k: the formula's coefficients are >= 0, and a split-backward schedule's played time
    grows with every op's length, each of F, B and W growing with T_k (CostModel.stage_work).
    A split-backward schedule's bubble is played only where its formula (no bubble) is below
    ``beat_s`` (the time a plan must beat to count)."""
    ids = plan.stage_ranges()
    T = [float(st.time_s[t.layer_type[list(ids[k])], strategy].sum()) for k, st in enumerate(t.stages)]
    D = [float(st.tail_s[t.layer_type[list(ids[k])], strategy].sum()) for k, st in enumerate(t.stages)]
    for k in {0, plan.head_stage}:
        vocab, _ = cost_model.vocab_cost(model, plan, k, cost_model.cluster.world_size)
        T[k] += vocab.micro_batch_s
        D[k] += vocab.tail_s
    entry = schedule_entry(plan.schedule)
    if not entry.splits_backward:
        return pipeline_time(T, D, plan.micro_batches, plan.schedule, plan.virtual_stages)
    floor_s = entry.formula(plan.micro_batches, plan.virtual_stages).time_s(max(T), sum(T), max(D))
    if floor_s >= beat_s:
        return floor_s
    work = cost_model.stage_work(model, plan, T)
    return max(floor_s, pipeline_time(T, D, plan.micro_batches, plan.schedule, plan.virtual_stages, work))


def holds_1f1b_count(schedule: str, pp: int, micro_batches: int) -> bool:
    """Whether every stage holds at least 1F1B's micro-batches in flight under ``schedule``
    (interleaved, ZB-H1, DualPipeV, Looped BFS always; ZB-V from 2 pp micro-batches: below, its
    stage 0 holds fewer, pp 2 m 2: 1.5 against 2); tests/planners/test_uniform_plan_floor.py
    checks it on every schedule. Where it holds and memory is linear in the count, a uniform plan
    that overflows a stage in the 1F1B tables overflows it under the schedule too."""
    return schedule != Schedule.ZBV or micro_batches >= 2 * pp


def _tables_fit(t: ComboTables, uniform: np.ndarray, stage_ids: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Per uniform strategy, whether its layers fit every stage in the 1F1B tables (a memory
    linear in the in-flight count; else only the layouts of finite memory): no played program."""
    _, _, mem, temp = uniform_layer_sums(t, uniform, stage_ids)
    if t.stages[0].activation_bytes is None:
        return np.isfinite(mem + temp).all(axis=0)
    return (mem + temp <= t.budget_bytes).all(axis=0)


def _scheduled_fits(t: ComboTables, uniform: np.ndarray, layout: Plan,
                    stage_ids: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Per uniform strategy, whether its layers can fit every stage holding the schedule's own
    in-flight count of micro-batches, its chunks weighted by their layers as plan_cost weighs
    them (``stage_in_flight`` of ``layout``, the group's chunk layout whatever the strategy;
    states + count x activations + the largest temporary, the
    tables holding both parts where memory is linear in the count; what a split backward keeps
    for W, >= 0, left to plan_cost). A schedule may hold fewer than 1F1B on a stage (ZB-V with
    fewer than 2 pp micro-batches), so the 1F1B tables alone bound nothing. Where memory is not
    linear, only the layouts the cost model cannot score (infinite memory) are ruled out."""
    _, _, mem, temp = uniform_layer_sums(t, uniform, stage_ids)
    if t.stages[0].activation_bytes is None:
        return np.isfinite(mem + temp).all(axis=0)
    held = np.array([stage_in_flight(layout, k) - st.in_flight for k, st in enumerate(t.stages)])
    mem = mem + held[:, None] * uniform_activation_sums(t, uniform, stage_ids)
    return (mem + temp <= t.budget_bytes).all(axis=0)


def finish(name: str, model: ModelSpec, cost_model: CostModel, state: OuterState, tables: list[ComboTables],
           budget_bytes: float, top_k: int, status: str, gap: float | None, extra_states: int = 0) -> PlanResult:
    """PlanResult of the best plan (re-scored), or the smallest memory at which the space fits; a
    search the time limit stopped says so in one line (with no plan: nothing else)."""
    stats = SearchStats(states_explored=state.states + extra_states, candidates=state.candidates,
                        pruned=state.pruned, gap=gap, tables_s=state.tables_s, groups_s=state.groups_s,
                        proof_s=state.proof_s,
                        solver_status=status if state.solutions or status == "time_limit" else "infeasible")
    stopped = f"time limit of {state.limit_s:g} s reached while {state.doing}" if status == "time_limit" else ""
    if not state.solutions:
        if stopped:  # the groups not searched may hold plans: no smallest memory to claim
            return infeasible_result(name, None, stats, f"{stopped}: no plan found before it")
        if not tables:
            return infeasible_result(name, None, stats, "the search space is empty for these global batches "
                                     "(no pp, micro-batch and tp/dp split divides them)")
        floor = min(min_memory_bytes(t) for t in tables)
        return infeasible_result(name, floor if np.isfinite(floor) else None, stats)
    ranked = list({s[2]: s for s in sorted(state.solutions, key=lambda s: (-s[0], s[1]))}.values())
    top = tuple(RankedPlan(plan=p, iteration_time_s=tm, throughput_samples_per_s=thr,
                           peak_memory_gib=cost_model.plan_cost(model, p).peak_memory_bytes / GIB)
                for thr, tm, p in ranked[:top_k])
    mismatch = f"objective vs plan_cost mismatch {state.mismatch:.1e}" if state.mismatch > RESCORE_RTOL else ""
    if mismatch and stats.solver_status == "optimal":  # the bounds bound the solver's objective, not plan_cost
        stats = replace(stats, solver_status="heuristic")
    if stopped:
        stopped += (f": the best plan so far, gap {gap:.2%}" if gap is not None else
                    f": the best plan so far, no bound ({state.unbounded} groups not bounded)")
    note = "; ".join(n for n in (stopped, mismatch) if n)
    return scored_result(name, cost_model, model, ranked[0][2], stats, top, note)


def min_memory_bytes(t: ComboTables) -> float:
    """Smallest peak memory over the group's plans (any partition, vocab tp and strategies),
    runtime overhead included: a min-max partition over per-stage minimum memory."""
    return min(vocab_min_memory_bytes(t, v) for v in t.vocab) + t.overhead_bytes


def vocab_min_memory_bytes(t: ComboTables, v) -> float:
    """Smallest peak memory of the group's plans under vocab choice ``v``, runtime overhead not
    counted (compare with t.budget_bytes): above it, the group has no plan for ``v``."""
    n, pp = len(t.layer_type), t.combo.pp
    levels = temp_levels(t)
    seg = [_stage_min_memory(t, k, levels, t.vocab[v][k]) for k in range(pp)]
    M = seg[0][0].copy()
    for k in range(1, pp):
        M = np.min(np.maximum(M[:, None], seg[k]), axis=0)
    return float(M[n])


def _stage_min_memory(t: ComboTables, k: int, levels: np.ndarray, vc) -> np.ndarray:
    """[a, b] -> least memory of layers a..b-1 on stage k (inf where b <= a): the least over the
    temporary levels j of the segment's layers, each at its least memory among the strategies
    whose temporary is at most level j (all levels at once, as [level, a, b])."""
    mem = _level_layer_memory(t, t.stages[k], levels, vc)
    # a level whose layers' memory is the level below's only adds a larger temporary: never the least
    kept = np.concatenate(([True], (mem[1:] != mem[:-1]).any(axis=1)))
    mem, levels = mem[kept], levels[kept]
    finite = np.isfinite(mem)
    zeros = np.zeros((len(levels), 1))
    missing = np.concatenate((zeros, np.cumsum(~finite, axis=1)), axis=1)
    prefix = np.concatenate((zeros, np.cumsum(np.where(finite, mem, 0.0), axis=1)), axis=1)
    peak = np.fmax(levels, vc.temp_bytes)[:, None, None]  # max(level, temp): a NaN temp never wins, as with max()
    seg = prefix[:, None, :] - prefix[:, :, None] + peak + vc.memory_bytes
    best = np.where(missing[:, None, :] - missing[:, :, None] > 0, np.inf, seg).min(axis=0)
    a, b = np.indices(best.shape)
    return np.where(b > a, best, np.inf)


def _level_layer_memory(t: ComboTables, st, levels: np.ndarray, vc) -> np.ndarray:
    """[level j, layer] least memory of the layer among the strategies whose temporary is at most
    level j (the embedding/head's memory deltas added on the first and last layer)."""
    lvl = np.searchsorted(levels, np.where(np.isfinite(st.temp_bytes), st.temp_bytes, np.inf))
    upto = lvl[None] <= np.arange(len(levels))[:, None, None]
    by_type = np.where(t.allowed[None] & upto, st.memory_bytes[None], np.inf)  # [level, type, strategy]
    mem = by_type.min(axis=2)[:, t.layer_type]
    n = len(t.layer_type)
    ends = {i: by_type[:, t.layer_type[i]] for i in (0, n - 1)}
    for i, delta in ((0, vc.first_delta), (n - 1, vc.last_delta)):
        if delta is not None:
            ends[i] = ends[i] + delta[:, 2]
    for i, row in ends.items():
        mem[:, i] = row.min(axis=1)
    return mem
