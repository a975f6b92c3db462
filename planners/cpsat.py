"""The exact planner on OR-Tools CP-SAT: the same formulation in integers.

Scaling: times in units of ``time_unit_s`` (0.1 us), rounded to nearest, so objectives agree with
plan_cost to about (layers x 0.05 us); memory in KiB, every memory coefficient rounded UP and the
budget rounded DOWN, so a CP-SAT plan always fits (it may miss a plan within 1 KiB per layer of
the budget that the float solvers find).
"""
from __future__ import annotations

import math

from ortools.sat.python import cp_model

from planners.exact import ExactPlanner, SolveLog
from planners.formulation import Formulation, read_plan, warm_values
from planners.outer import OuterState
from planners.registry import register
from planners.segments import GroupSolution

TIME_UNIT_S = 1e-7
MEM_UNIT_BYTES = 1024.0
BIG = 2**50


def _scaled(coef: float, var_unit: str, row_unit: str, sense: str) -> int:
    """Integer coefficient of a count variable in a row of ``row_unit``; unit variables keep theirs."""
    if var_unit != "count":
        return int(round(coef))
    if row_unit == "time":
        return int(round(coef / TIME_UNIT_S))
    if row_unit == "mem":  # conservative: memory counted up
        return math.ceil(coef / MEM_UNIT_BYTES) if sense == "<=" else math.floor(coef / MEM_UNIT_BYTES)
    return int(round(coef))


def _rhs(rhs: float, row_unit: str, sense: str) -> int:
    if row_unit == "time":
        return int(math.ceil(rhs / TIME_UNIT_S)) if sense == "<=" else int(round(rhs / TIME_UNIT_S))
    if row_unit == "mem":
        return math.floor(rhs / MEM_UNIT_BYTES) if sense == "<=" else math.ceil(rhs / MEM_UNIT_BYTES)
    return int(round(rhs))


def to_cpsat(f: Formulation) -> tuple[cp_model.CpModel, dict]:
    model = cp_model.CpModel()
    xs = {}
    for name, (lo, hi, _) in f.variables.items():
        unit = f.var_unit[name]
        scale = {"time": TIME_UNIT_S, "mem": MEM_UNIT_BYTES}.get(unit)
        if scale is None:
            xs[name] = model.NewIntVar(int(lo), int(hi), name)
            continue
        ilo = -BIG if math.isinf(lo) else math.ceil(lo / scale)
        ihi = BIG if math.isinf(hi) else math.floor(hi / scale)
        xs[name] = model.NewIntVar(ilo, ihi, name)
    for (coefs, sense, rhs), unit in zip(f.rows, f.row_unit):
        expr = sum(_scaled(c, f.var_unit[n], unit, sense) * xs[n] for n, c in coefs.items())
        r = _rhs(rhs, unit, sense)
        model.Add(expr <= r) if sense == "<=" else model.Add(expr >= r) if sense == ">=" else model.Add(expr == r)
    model.Minimize(sum(int(round(c)) * xs[n] for n, c in f.objective.items()))
    return model, xs


@register
class CpSatPlanner(ExactPlanner):
    """Exact CP-SAT per outer-loop group."""

    name = "cpsat"
    defaults = {"space": "full", "time_limit_s": 60.0, "partition": "search", "top_k": 1,
                "formulation": "auto", "warm_start": True, "workers": 1, "seed": 0}

    def solve_formulation(self, tables, v: int, f: Formulation, warm: GroupSolution | None, opts: dict,
                          log: SolveLog, state: OuterState) -> GroupSolution | None:
        # data -> model (integers)
        model, xs = to_cpsat(f)
        # warm start from the DP plan
        for name, val in (warm_values(f, tables, warm.choice, warm.stage_layers) if warm else {}).items():
            model.AddHint(xs[name], int(val))
        # solve with a time limit
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = float(opts["time_limit_s"])
        solver.parameters.num_workers = int(opts["workers"])
        solver.parameters.random_seed = int(opts["seed"])
        code = solver.Solve(model)
        state.states += int(solver.NumBranches())
        # check status, then read the solution
        status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                  cp_model.INFEASIBLE: "pruned"}.get(code, "unknown")
        if status not in ("optimal", "feasible"):
            timed_out = code == cp_model.UNKNOWN and solver.WallTime() >= 0.99 * solver.parameters.max_time_in_seconds
            log.solved("time_limit" if timed_out else status)
            return None
        # objective and bound as the solver reports them (integer time units)
        log.solved(status, solver.ObjectiveValue() * TIME_UNIT_S, solver.BestObjectiveBound() * TIME_UNIT_S)
        values = {n: float(solver.Value(x)) for n, x in xs.items() if f.var_unit[n] == "count"}
        choice, sizes = read_plan(values, f, len(tables.layer_type), tables.combo.pp)
        return GroupSolution(v, choice, sizes, solver.ObjectiveValue() * TIME_UNIT_S)
