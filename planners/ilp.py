"""The exact planner as a MILP solved by PuLP (HiGHS by default, CBC selectable).

PuLP's ``status`` says "Optimal" for a time-limited feasible solution too, so the result reads
``sol_status``: LpSolutionOptimal is a proven optimum, LpSolutionIntegerFeasible is not.
"""
from __future__ import annotations

import math

import pulp

from planners.exact import ExactPlanner, SolveLog, stdout_to_stderr, to_pulp
from planners.formulation import Formulation, read_plan, warm_values
from planners.outer import OuterState
from planners.registry import register
from planners.segments import GroupSolution
from specs import SpecError

SOLVERS = ("highs", "cbc")


def _solver(name: str, time_limit_s: float, warm: bool, threads: int):
    if name == "highs":
        return pulp.HiGHS(msg=False, timeLimit=time_limit_s, warmStart=warm, threads=threads)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, warmStart=warm, threads=threads)


@register
class IlpPlanner(ExactPlanner):
    """Exact MILP per outer-loop group (PuLP)."""

    name = "ilp"
    defaults = {"space": "full", "solver": "highs", "time_limit_s": 60.0, "partition": "search", "top_k": 1,
                "formulation": "auto", "warm_start": True, "threads": 1}

    def check_options(self, opts: dict) -> None:
        if opts["solver"] not in SOLVERS:
            raise SpecError("solver", f"must be one of {', '.join(SOLVERS)}, got {opts['solver']!r}")

    def solve_formulation(self, tables, v: int, f: Formulation, warm: GroupSolution | None, opts: dict,
                          log: SolveLog, state: OuterState) -> GroupSolution | None:
        # data -> model
        prob, xs = to_pulp(f)
        # warm start from the DP plan
        start = warm_values(f, tables, warm.choice, warm.stage_layers) if warm else {}
        for name, val in start.items():
            xs[name].setInitialValue(val)
        # solve with a time limit
        solver = _solver(opts["solver"], float(opts["time_limit_s"]), bool(start), int(opts["threads"]))
        with stdout_to_stderr():
            prob.solve(solver)
        state.states += len(f.variables)
        # check the solver's own status, then read the solution
        status = {pulp.LpSolutionOptimal: "optimal", pulp.LpSolutionIntegerFeasible: "feasible",
                  pulp.LpSolutionInfeasible: "pruned", pulp.LpSolutionNoSolutionFound: "unknown"}.get(
                      prob.sol_status, "unknown")
        if status in ("pruned", "unknown") or prob.status not in (pulp.LpStatusOptimal,):
            log.solved("time_limit" if status == "unknown" and _hit_time_limit(prob) else status)
            return None
        objective_s = float(pulp.value(prob.objective))
        log.solved(status, objective_s, _dual_bound(prob, objective_s))
        values = {n: x.value() or 0.0 for n, x in xs.items()}
        choice, sizes = read_plan(values, f, len(tables.layer_type), tables.combo.pp)
        return GroupSolution(v, choice, sizes, objective_s)


def _dual_bound(prob: pulp.LpProblem, objective_s: float) -> float | None:
    """HiGHS's proven lower bound (its mip_dual_bound, shifted by any constant PuLP kept out of
    the solver's objective); None from CBC, which PuLP gives no bound for."""
    highs = getattr(prob, "solverModel", None)
    if highs is None or not hasattr(highs, "getInfo"):
        return None
    info = highs.getInfo()
    offset = objective_s - float(info.objective_function_value)
    bound = float(info.mip_dual_bound) + offset
    return bound if math.isfinite(bound) else None


def _hit_time_limit(prob: pulp.LpProblem) -> bool:
    highs = getattr(prob, "solverModel", None)
    return highs is not None and hasattr(highs, "getModelStatus") and \
        highs.modelStatusToString(highs.getModelStatus()).lower().startswith("time limit")
