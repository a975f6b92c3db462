"""Galvatron's search, made exact and faster: Pareto (memory, time) DP per stage, stage boundaries
chosen by a DP over segments, inside the outer loops over global batch, pp and micro-batches.

Modes: ``exact`` keeps (memory, T, D) Pareto points and enumerates both pipeline caps (exact for
plan_cost's objective); ``fast`` (default) keeps (memory, T + D/m) points, exact for pp = 1 and
exact in the bottleneck for pp > 1, then proves the groups its bounds left open with the exact
DP within a budget of work (``prove``), so that most calls end proven optimal.
``memory_granularity_mib`` > 0 rounds memory up like the public code; ``partition="even"``
splits layers evenly like the public code.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from cost_models import CostModel
from planners.base import Budget, Planner, PlanResult, pop_options, time_limit
from planners.deadline import DeadlinePassed, passed
from planners.memory_floor import layers_floor
from planners.outer import OuterState, finish, lower_bound_s, run_outer, vocab_min_memory_bytes
from planners.partition import stage_windows
from planners.registry import register
from planners.segments import GAP_RTOL, GroupDP, GroupSolution
from planners.space import SearchSpace
from planners.tables import ComboTables
from specs import ClusterSpec, ModelSpec, SpecError
from specs.units import MIB

LAYERS_FLOOR_MAX_PP = 8
"""Groups of at most this many stages are asked the layers-only memory floor (layers_floor) before
their tables are completed: its cost grows with the stages (llama3-70b on 1024 H100: 1-50 ms a
group at pp <= 8, 30-130 ms at pp 16-64), and completing a group's tables costs ~50 ms there."""

DEFAULTS = {"space": "full", "mode": "fast", "memory_granularity_mib": 0.0, "partition": "search",
            "top_k": 3, "stage_imbalance": 2.0, "max_temp_levels": None, "time_limit_s": None, "gap_tolerance": 0.0,
            "prove_candidates": 2_000_000, "precision_per": "plan", "tp_comm_overlap": None,
            "ep_dispatcher": None}
"""stage_imbalance: in fast mode a stage holds at most ceil(imbalance * layers / pp) layers
(None: any); exact mode ignores it. max_temp_levels: round temporaries up to this many
distinct sizes (None: exact; fewer levels make the Pareto pruning cheaper). time_limit_s: bounds
the whole call (tables, every group, every batch); the best plan so far comes back with its bound
and gap and status "time_limit" (None: no limit). gap_tolerance: a group or vocab choice is searched only
when its lower bound is below the incumbent by more than this fraction of it (the relative gap at
which MIP solvers stop: Gurobi's MIPGap defaults to 1e-4); the gap returned is the one proven, at
most this where the tolerance skipped something; 0: search until the bounds prove the optimum.
prove_candidates: in fast mode, the work the exact DP may spend, after the search, on the
groups whose bound leaves a gap (lowest bound first, the best plan as cut), counted in points
handed to its Pareto pruning (about 1 us each on a 2-core machine): each group it finishes is
proven (its optimum, or that nothing in it beats the best) and may give a better plan; work, not
seconds, so that a call returns the same plan and gap on every machine (0: no proof; ignored with
memory_granularity_mib or max_temp_levels, where the DP is inexact). precision_per: ``plan``
searches each of the space's precisions for every layer and keeps the best plan (Megatron-Core and
Transformer Engine run one recipe for the whole model; the DP's strategies stay as many as in BF16);
``layer`` lets each layer choose (twice the strategies: exact, much slower on large models).
tp_comm_overlap: ``off``, ``on`` or ``search`` (one search each way, the best kept) sets the space's
SearchSpace.tp_comm_overlap; None keeps the space's (off in every preset but moe). ep_dispatcher:
``all_to_all``, ``deepep`` or ``search`` sets SearchSpace.ep_dispatcher; None keeps the space's
(all_to_all in every preset)."""


def resolve_space(space: Any, cost_model: CostModel | None = None, overlap: str | None = None,
                  dispatcher: str | None = None) -> SearchSpace:
    """The SearchSpace (or preset name) ``space`` with TP communication ``overlap`` (off, on,
    search; None: the space's) and expert ``dispatcher`` (all_to_all, deepep, search; None: the
    space's), less what ``cost_model`` cannot score and what its cluster cannot run."""
    if isinstance(space, str):
        space = SearchSpace.preset(space)
    if not isinstance(space, SearchSpace):
        raise SpecError("space", f"must be a SearchSpace or a preset name, got {space!r}")
    if overlap is not None:
        space = space.with_tp_overlap(str(overlap))
    if dispatcher is not None:
        space = space.with_ep_dispatcher(str(dispatcher))
    return space if cost_model is None else space.within(cost_model.capabilities).for_cluster(cost_model.cluster)


@register
class GalvatronPlanner(Planner):
    """The DP planner; by default over the full space (today's dimensions: every dp type, Megatron
    and Ulysses sequence parallelism, selective and full recomputation, interleaving, the
    vocabulary's splits, expert parallelism), any preset or SearchSpace with the ``space`` option."""

    name = "galvatron"
    defaults: dict[str, Any] = DEFAULTS

    def _search(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                options: dict[str, Any], deadline: float | None = None) -> PlanResult:
        """``deadline``: the time.monotonic() instant time_limit_s ends, where a caller's search
        has already started the clock (precision_per=plan)."""
        given = dict(options)
        opts = pop_options(options, self.defaults, self.name)
        space = resolve_space(opts["space"], cost_model, opts["tp_comm_overlap"], opts["ep_dispatcher"])
        if opts["precision_per"] not in ("plan", "layer"):
            raise SpecError("precision_per", f"must be plan or layer, got {opts['precision_per']!r}")
        spaces = space.one_choice_spaces(opts["precision_per"] == "plan")
        if len(spaces) > 1:
            return self._per_choice(model, cluster, budget, cost_model, given, spaces, opts)
        if opts["mode"] not in ("fast", "exact"):
            raise SpecError("mode", f"must be fast or exact, got {opts['mode']!r}")
        if opts["partition"] not in ("search", "even"):
            raise SpecError("partition", f"must be search or even, got {opts['partition']!r}")
        exact, even = opts["mode"] == "exact", opts["partition"] == "even"
        sound = cost_model.objective_is_plan_cost  # the bounds bound plan_cost
        tolerance = opts["gap_tolerance"]
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
            raise SpecError("gap_tolerance", f"must be a number in [0, 1), got {tolerance!r}")
        granularity = float(opts["memory_granularity_mib"]) * MIB
        limit = opts["time_limit_s"]
        state = OuterState(limit_s=None if limit is None else time_limit(limit))
        if deadline is None and limit is not None:
            deadline = time.monotonic() + state.limit_s

        provable = opts["prove_candidates"] > 0 and not granularity and opts["max_temp_levels"] is None
        pending: list[tuple[ComboTables, Any, float]] = []
        """(group, vocab choice, lower bound) fast mode left unproven, for prove()."""
        floors: dict[int, float] = {}
        """id(tables) -> the group's any-vocab floor, computed by ``refine`` before the search."""

        def group_dp(tables):
            return GroupDP(tables, exact=exact, even=even, granularity_bytes=granularity,
                           stage_imbalance=None if exact else opts["stage_imbalance"],
                           max_temp_levels=None if exact else opts["max_temp_levels"], deadline=deadline)

        def refine(tables, incumbent_s):  # the group's floor without the tail caps: cheaper, enough to order
            try:
                floors[id(tables)] = group_dp(tables).any_vocab_floor(
                    incumbent_s if len(tables.vocab) > 1 else None, tails=False)
            except DeadlinePassed:
                return 0.0
            return floors[id(tables)]

        def solve(tables, incumbent_s):
            incumbent_s *= 1.0 - tolerance  # what a plan of this group must beat to count
            dp = group_dp(tables)
            found = []

            def stopped():  # by the deadline, part-way or between vocab choices: the cheap bound
                state.stop("searching the groups")
                state.bound(tables.combo.global_batch, lower_bound_s(tables))
                return found

            try:
                if not sound:  # bounds on the planners' sum: no use for this cost model's score
                    choices = _fitting(tables)
                else:
                    floor = floors.pop(id(tables), -np.inf)
                    if floor < incumbent_s:  # the refined floor unless refine was cut short; tail caps
                        # per vocab choice only (for all at once they pruned nothing on the cases)
                        floor = max(floor, dp.any_vocab_floor(incumbent_s if len(tables.vocab) > 1 else None,
                                                              tails=False))
                    if floor >= incumbent_s:  # no vocab choice of the group can beat the incumbent
                        state.bound(tables.combo.global_batch, floor)
                        state.pruned += len(tables.vocab)
                        return found
                    choices = _by_bound(dp, incumbent_s, lambda: passed(deadline))
            except DeadlinePassed:
                return stopped()
            for v in choices:
                if passed(deadline):
                    return stopped()
                try:
                    cut = [f.objective_s * (1.0 - tolerance) for f in found if sound]
                    sol = dp.solve(v, min([incumbent_s] + cut), bound=sound)
                except DeadlinePassed:
                    return stopped()
                if sound and provable and not dp.proven:  # settled after the search, by prove()
                    pending.append((tables, v, dp.bounds[v]))
                elif sound:
                    state.bound(tables.combo.global_batch, dp.bounds[v])
                if sol is not None:
                    found.append(sol)
            state.states += dp.points
            state.pruned += dp.skipped
            return found

        def floor_of_layers(tables, incumbent_s):  # where it costs less than completing the group's tables
            if tables.combo.pp > LAYERS_FLOOR_MAX_PP:
                return 0.0
            return layers_floor(tables, stage_windows(len(tables.layer_type), tables.combo.pp, even), incumbent_s)

        meta = {"model": model.name, "cluster": cluster.name}
        state, tables = run_outer(self.name, model, cost_model, budget.memory_bytes, space,
                                  budget.global_batches(), solve, int(opts["top_k"]), meta, state, deadline,
                                  refine=refine, layers_floor=floor_of_layers if sound else None)
        start = time.perf_counter()  # the proofs are group DPs: their time counts as such
        prove(pending, state, lambda t: GroupDP(t, exact=True, even=even, deadline=deadline),
              int(opts["prove_candidates"]), tolerance,
              lambda t, sol: state.keep_solution(cost_model, model, t, sol, budget.memory_bytes, meta))
        state.proof_s = time.perf_counter() - start
        state.groups_s += state.proof_s
        bound_s, gap = state.gap() if sound else (None, None)
        status = "time_limit" if state.timed_out else "optimal" if gap == 0.0 else "heuristic"
        result = finish(self.name, model, cost_model, state, tables, budget.memory_bytes, int(opts["top_k"]),
                        status, gap)
        return replace(result, stats=replace(result.stats, bound_s=bound_s))

    def _per_choice(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                    given: dict[str, Any], spaces: list[tuple[str, SearchSpace]], opts: dict[str, Any]
                    ) -> PlanResult:
        """One search per (label, space) of SearchSpace.one_choice_spaces (each precision of
        precision_per=plan, each TP-overlap value), the best kept; a time limit covers them all (a
        search that has no time left is not started)."""
        limit = opts["time_limit_s"]
        deadline = None if limit is None else time.monotonic() + time_limit(limit)
        results, skipped = search_each(spaces, deadline, lambda space: self._search(
            model, cluster, budget, cost_model,
            {**given, "space": space, "precision_per": "layer", "tp_comm_overlap": None, "ep_dispatcher": None},
            deadline))
        return union(self.name, results, int(opts["top_k"]), skipped, limit)


def search_each(spaces: list[tuple[str, SearchSpace]], deadline: float | None,
                search: Callable[[SearchSpace], PlanResult]) -> tuple[list[PlanResult], list[str]]:
    """``search`` over each (label, space) in turn, and the labels of those not started because
    ``deadline`` (time.monotonic) had passed (the first always runs): what ``union`` takes."""
    results, skipped = [], []
    for label, space in spaces:
        if results and passed(deadline):
            skipped.append(label)
            continue
        results.append(search(space))
    return results, skipped


def union(name: str, results: list[PlanResult], top_k: int, skipped: list[str], limit_s: float | None
          ) -> PlanResult:
    """The best of searches over several spaces: its plan, the union's top plans (each once: the
    TP-overlap spaces share their tp 1 plans), the work of all,
    and the gap against the highest throughput bound of any (an infeasible search bounds its
    space at 0; one without a bound, or a precision ``skipped`` by the time limit, leaves the union
    without one); stopped by the limit, the message says where, in one line."""
    best = max(results, key=lambda r: (r.feasible, r.throughput_samples_per_s))
    uppers: list[float | None] = [None] * len(skipped)
    for r in results:
        if r.feasible and r.stats.gap is not None:
            uppers.append(r.throughput_samples_per_s / (1.0 - r.stats.gap) if r.stats.gap < 1 else np.inf)
        elif not r.feasible and r.stats.solver_status == "infeasible":
            uppers.append(0.0)
        else:
            uppers.append(None)
    work = {k: sum(getattr(r.stats, k) for r in results)
            for k in ("wall_time_s", "states_explored", "candidates", "pruned", "tables_s", "groups_s", "proof_s")}
    stopped = next((r.message.split(": ")[0] for r in results if r.stats.solver_status == "time_limit"), "")
    if skipped:
        stopped = f"time limit of {limit_s:g} s reached before the {', '.join(skipped)} search"
    if not best.feasible:
        floors = [r.min_memory_gib for r in results if r.min_memory_gib is not None]
        return replace(best, planner=name, min_memory_gib=None if stopped else min(floors) if floors else None,
                       message=f"{stopped}: no plan found before it" if stopped else best.message,
                       stats=replace(best.stats, solver_status="time_limit" if stopped else "infeasible", **work))
    gap = bound_s = None
    if None not in uppers:
        upper = max(max(uppers), best.throughput_samples_per_s)
        gap = 1.0 - best.throughput_samples_per_s / upper
        gap, bound_s = (0.0 if gap <= GAP_RTOL else gap), best.plan.global_batch / upper
    status = "time_limit" if stopped else "optimal" if gap == 0.0 and all(
        r.stats.solver_status in ("optimal", "infeasible") for r in results) else "heuristic"
    message = best.message
    if stopped:
        message = f"{stopped}: the best plan so far, " + ("no bound" if gap is None else f"gap {gap:.2%}")
    ranked: dict = {}
    for k in sorted((k for r in results for k in r.top_k), key=lambda k: -k.throughput_samples_per_s):
        ranked.setdefault(k.plan, k)
    top = tuple(ranked.values())[:top_k]
    return replace(best, planner=name, top_k=top, message=message,
                   stats=replace(best.stats, solver_status=status, gap=gap, bound_s=bound_s, **work))


def prove(pending: list[tuple[ComboTables, Any, float]], state: OuterState,
          exact_dp: Callable[[ComboTables], GroupDP], candidates: int, tolerance: float,
          keep: Callable[[ComboTables, GroupSolution], None]) -> None:
    """Settle fast mode's unproven (group, vocab choice, bound) entries, lowest bound first: an
    entry whose bound reaches the best plan (less ``tolerance``) is closed as it is; the others
    are solved by the group's ``exact_dp`` (one per group: its vocab choices share the passes of
    the stages after the first) with the best plan as cut, which proves the entry (its bound
    becomes its optimum, or the cut where nothing beats it) unless the pruning ``candidates``
    left run out or the deadline passes (then the entry keeps its bound; a deadline stops the rest)."""
    dps: dict[int, GroupDP] = {}
    for t, v, bound_s in sorted(pending, key=lambda e: e[2] / e[0].combo.global_batch):
        gb = t.combo.global_batch
        best = state.throughputs(1)[0]
        incumbent_s = gb / best * (1.0 - tolerance) if best > 0 else np.inf  # no plan yet: no cut
        if bound_s >= incumbent_s or candidates <= 0 or state.timed_out:
            state.bound(gb, bound_s)
            continue
        if id(t) not in dps:
            dps[id(t)] = exact_dp(t)
        dp = dps[id(t)]
        before, points = dp.candidates, dp.points
        dp.max_candidates = before + candidates
        try:
            sol = dp.solve(v, incumbent_s, bound=False)
        except DeadlinePassed:
            if passed(dp.deadline):
                state.stop("proving the open groups")
            sol = None
        candidates -= dp.candidates - before
        state.states += dp.points - points
        state.bound(gb, max(bound_s, dp.bounds.get(v, bound_s)))
        if sol is not None:
            keep(t, sol)


def _fitting(t: ComboTables) -> list:
    """The group's vocab choices whose embedding/head leave room for some plan."""
    return [v for v in t.vocab if vocab_min_memory_bytes(t, v) <= t.budget_bytes]


def _by_bound(dp: GroupDP, incumbent_s: float, stop: Callable[[], bool]) -> list:
    """The group's vocab choices that can fit, lowest bound first (GroupDP.lower_bound without
    the tail caps), so that the best is likely searched first and its plan rules the others out;
    in table order where the search is exact and proven (its optimum is its bound)."""
    choices = _fitting(dp.t)
    if dp.exact and dp.proven:
        return choices
    keys = {}
    for v in choices:
        if stop():
            raise DeadlinePassed
        keys[v] = dp.order_key(v)
    return sorted(choices, key=keys.get)


def _variant(class_name: str, name: str, doc: str, **overrides) -> type[GalvatronPlanner]:
    """A registered GalvatronPlanner that differs from ``galvatron`` only in its default options
    (bound to ``class_name`` in this module, so it pickles like a written-out class)."""
    cls = type(class_name, (GalvatronPlanner,), {"name": name, "__doc__": doc, "__module__": __name__,
                                                 "defaults": {**DEFAULTS, **overrides}})
    return register(cls)


GalvatronClassic = _variant(
    "GalvatronClassic", "galvatron_classic",
    "The 2022 dimensions per layer (DDP/ZeRO-1/2/3, tp, pp, full checkpointing; 1F1B, no sequence "
    "parallelism): the classic space, fast; Galvatron in the paper comparison (DEFAULT_PLANNERS).",
    space="classic")
Galvatron2 = _variant(
    "Galvatron2", "galvatron2",
    "Galvatron-2's space (ZeRO-1/2/3, full checkpointing, Megatron-SP and Ulysses per layer, "
    "Ulysses and ZeRO-3 for the vocabulary) searched by our DP.", space="galvatron2")
GalvatronMoE = _variant(
    "GalvatronMoE", "galvatron_moe",
    "Megatron-Core's MoE dimensions per layer (ZeRO-1/2, Megatron-SP, every recompute, interleaving, "
    "ep with expert tp = tp or 1), pp up to the layer count, micro-batches uncapped.", space="moe")
GalvatronDpTp = _variant(
    "GalvatronDpTp", "galvatron_dp_tp",
    "The paper's ablation: data and tensor parallelism only (no pipeline).", space="dp+tp")
GalvatronDpPp = _variant(
    "GalvatronDpPp", "galvatron_dp_pp",
    "The paper's ablation: data and pipeline parallelism only (no tensor parallelism).",
    space="dp+pp")
GalvatronPaper = _variant(
    "GalvatronPaper", "galvatron_paper",
    "The paper's space (DDP/ZeRO-3, no checkpointing) searched exactly.", space="galvatron")
GalvatronBins = _variant(
    "GalvatronBins", "galvatron_bins",
    "As the public code searches: the paper's space, memory in whole-MiB bins, even partitions.",
    space="galvatron", memory_granularity_mib=1.0, partition="even")
