"""What the two exact planners (ilp, cpsat) share: seed the incumbent with the DP's plan, then per
group bound the MILP by its LP relaxation (HiGHS) and solve only the groups that could still win,
with the incumbent as a cutoff and the DP plan as a warm start."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from abc import abstractmethod
from typing import Any

import pulp

from cost_models import CostModel
from planners import count_formulation
from planners.base import Budget, Planner, PlanResult, pop_options, time_limit
from planners.deadline import passed
from planners.formulation import Formulation, build
from planners.galvatron import GalvatronPlanner, resolve_space, search_each, union
from planners.outer import OuterState, finish, lower_bound_s, run_outer
from planners.segments import GroupDP, GroupSolution
from specs import ClusterSpec, ModelSpec, SpecError

CUTOFF_RTOL = 1e-9
"""A group must beat the incumbent by more than this (relative) to be solved."""
FORMULATIONS = ("auto", "counts", "layers")
"""``formulation`` option: auto = integer counts per strategy and stage where that model stands
(count_formulation.applies) and pays (count_formulation.pays), one binary per layer elsewhere;
counts = wherever it stands; layers = one binary per layer always."""


def to_pulp(f: Formulation, relax: bool = False) -> tuple[pulp.LpProblem, dict[str, pulp.LpVariable]]:
    """The formulation as a PuLP problem (``relax``: every variable continuous)."""
    prob = pulp.LpProblem("plan", pulp.LpMinimize)
    xs = {}
    for name, (lo, hi, integer) in f.variables.items():
        cat = pulp.LpContinuous if relax or not integer else pulp.LpInteger
        xs[name] = prob.add_variable(name, None if math.isinf(lo) else lo, None if math.isinf(hi) else hi,
                                     cat=cat)
    prob += pulp.lpSum(c * xs[n] for n, c in f.objective.items()) + f.objective_constant
    senses = {"<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE, "==": pulp.LpConstraintEQ}
    for i, (coefs, sense, rhs) in enumerate(f.rows):  # built from (variable, coefficient) pairs:
        expr = pulp.LpAffineExpression([(xs[n], c) for n, c in coefs.items()])  # no per-term products
        prob += pulp.LpConstraint(expr, senses[sense], f"r{i}", rhs)
    return prob, xs


@contextlib.contextmanager
def stdout_to_stderr():
    """HiGHS prints its banner on the process's stdout (fd 1) even with msg=False; send it
    to stderr so that ``compare --json`` output stays parseable."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def lp_bound(f: Formulation, time_limit_s: float | None = None) -> float:
    """The LP relaxation's optimum (inf when even the relaxation is infeasible; -inf, no bound,
    when ``time_limit_s`` ends the solve first)."""
    if time_limit_s is not None and time_limit_s <= 0:
        return -math.inf
    prob, _ = to_pulp(f, relax=True)
    with stdout_to_stderr():
        prob.solve(pulp.HiGHS(msg=False, threads=1, timeLimit=time_limit_s))
    if prob.status == pulp.LpStatusInfeasible:
        return math.inf
    if prob.status != pulp.LpStatusOptimal:
        return -math.inf
    return float(pulp.value(prob.objective))


class SolveLog:
    """Statuses of the group solves, folded into one planner status."""

    def __init__(self) -> None:
        self.statuses: list[str] = []
        self.gaps: list[float] = []
        self.bounds: list[tuple[float, float]] = []
        """(objective_s, bound_s) of each group solved, as the solver reported them."""

    def solved(self, status: str, objective_s: float | None = None, bound_s: float | None = None) -> None:
        """One group's outcome; with a bound, its gap read from the solver."""
        self.statuses.append(status)
        if objective_s is not None and bound_s is not None:
            self.bounds.append((objective_s, bound_s))
            if status != "optimal":
                self.gaps.append(abs(objective_s - bound_s) / max(abs(objective_s), 1e-12))

    def overall(self) -> str:
        if "time_limit" in self.statuses:
            return "time_limit"
        if any(s not in ("optimal", "pruned") for s in self.statuses):
            return "feasible"
        return "optimal"

    def bound_for(self, iteration_time_s: float) -> float | None:
        """The bound of the group whose objective is the returned plan's time."""
        if not self.bounds:
            return None
        obj, bound = min(self.bounds, key=lambda ob: abs(ob[0] - iteration_time_s))
        return bound if abs(obj - iteration_time_s) <= 1e-6 * max(iteration_time_s, 1e-12) else None


def _group_bound(log: SolveLog, solved_before: int, sol: GroupSolution | None, incumbent_s: float,
                 tables) -> float:
    """A lower bound on one group's objective after its solve: the solver's own bound when it
    gave one, else its optimum (or, finding nothing below the cutoff, the incumbent), else the
    group's cheap bound (stopped without a bound)."""
    if len(log.bounds) > solved_before:
        return log.bounds[-1][1]
    if log.statuses and log.statuses[-1] == "optimal":
        return sol.objective_s if sol is not None else incumbent_s
    return lower_bound_s(tables)


class ExactPlanner(Planner):
    """Skeleton: subclasses set ``defaults`` and implement ``solve_formulation``."""

    defaults: dict[str, Any] = {}

    @abstractmethod
    def solve_formulation(self, tables, v: int, f: Formulation, warm: GroupSolution | None,
                          opts: dict, log: SolveLog, state: OuterState) -> GroupSolution | None:
        """Solve one group's formulation; log its status; the plan, or None."""

    def _search(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                options: dict[str, Any]) -> PlanResult:
        opts = pop_options(options, self.defaults, self.name)
        limit_s = time_limit(opts["time_limit_s"])
        deadline = time.monotonic() + limit_s  # bounds the whole call: seed, every group, every batch
        if opts["formulation"] not in FORMULATIONS:
            raise SpecError("formulation", f"must be one of {', '.join(FORMULATIONS)}, got {opts['formulation']!r}")
        self.check_options(opts)
        space, even = resolve_space(opts["space"], cost_model), opts["partition"] == "even"
        spaces = space.one_choice_spaces(per_precision=False)
        if len(spaces) > 1:  # TP overlap off and on, each dispatcher: a search each, the limit shared
            return self._per_choice(model, cluster, budget, cost_model, options, spaces, deadline, int(opts["top_k"]))
        log, state = SolveLog(), OuterState(limit_s=limit_s)
        if opts["warm_start"]:
            seed = GalvatronPlanner().plan(model, cluster, budget, cost_model,
                                           {"space": space, "partition": opts["partition"], "top_k": 1,
                                            "time_limit_s": limit_s})
            if seed.feasible:
                state.solutions.append((seed.throughput_samples_per_s, seed.iteration_time_s, seed.plan))

        def solve(tables, incumbent_s):
            dp = GroupDP(tables, exact=False, even=even, stage_imbalance=2.0) if opts["warm_start"] else None
            gb, out = tables.combo.global_batch, []
            counts = opts["formulation"] != "layers" and count_formulation.applies(tables) and \
                (opts["formulation"] == "counts" or count_formulation.pays(tables, even))
            formulate = count_formulation.build if counts else build
            for v in tables.vocab:
                if passed(deadline):  # before the formulation, whose build takes seconds
                    log.solved("time_limit")
                    state.bound(gb, lower_bound_s(tables))
                    continue
                cutoff = incumbent_s * (1 + CUTOFF_RTOL) if math.isfinite(incumbent_s) else None
                f = formulate(tables, v, even, cutoff_s=cutoff)
                if cutoff is not None and lp_bound(f, deadline - time.monotonic()) > cutoff:
                    log.statuses.append("pruned")  # cannot beat the incumbent: adds nothing to the gap
                    continue
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    log.solved("time_limit")
                    state.bound(gb, lower_bound_s(tables))
                    continue
                warm = dp.solve(v) if dp else None
                solved = len(log.bounds)
                sol = self.solve_formulation(tables, v, f, warm, {**opts, "time_limit_s": left_s}, log, state)
                if sol is not None and f.counts is not None and f.counts.takes_a_shortcut(sol.choice, sol.stage_layers):
                    f = build(tables, v, even, cutoff_s=cutoff)  # its objective was only a bound
                    left_s, solved = deadline - time.monotonic(), len(log.bounds)
                    sol = self.solve_formulation(tables, v, f, warm, {**opts, "time_limit_s": left_s}, log, state)
                state.bound(gb, _group_bound(log, solved, sol, incumbent_s, tables))
                if sol is not None:
                    out.append(sol)
            return out

        meta = {"model": model.name, "cluster": cluster.name}
        state, tables = run_outer(self.name, model, cost_model, budget.memory_bytes, space,
                                  budget.global_batches(), solve, int(opts["top_k"]), meta, state, deadline,
                                  seed=False)  # the warm start (galvatron, seeded) stands in for it
        status = "time_limit" if state.timed_out else log.overall()
        if status == "time_limit":  # a solver stopped by it: the step under way was the groups' search
            state.stop("searching the groups")
        bound_s, gap = state.gap()  # over every group: solver bounds, or the cheap bound where stopped
        if status == "optimal":
            gap = 0.0
        if not cost_model.objective_is_plan_cost:  # optimal for the planners' sum, not for plan_cost
            status, bound_s, gap = ("heuristic" if status == "optimal" else status), None, None
        result = finish(self.name, model, cost_model, state, tables, budget.memory_bytes, int(opts["top_k"]),
                        status, gap)
        if status == "optimal" and result.feasible:
            bound_s = log.bound_for(result.iteration_time_s)
        return dataclasses.replace(result, stats=dataclasses.replace(result.stats,
                                                                     bound_s=bound_s if result.feasible else None))

    def _per_choice(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                    options: dict[str, Any], spaces: list[tuple[str, Any]], deadline: float, top_k: int
                    ) -> PlanResult:
        """One search per (label, space) of SearchSpace.one_choice_spaces, each with the time the
        ones before left, the best kept (planners.galvatron.union)."""
        results, skipped = search_each(spaces, deadline, lambda space: self._search(
            model, cluster, budget, cost_model,
            {**options, "space": space, "time_limit_s": max(deadline - time.monotonic(), 1e-3)}))
        return union(self.name, results, top_k, skipped, time_limit(options.get("time_limit_s",
                                                                                 self.defaults["time_limit_s"])))

    def check_options(self, opts: dict) -> None:
        """Subclasses validate their own options."""
