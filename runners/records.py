"""One row of the compare results per (budget, planner) cell: the planner's prediction, and the
evaluator's re-score when ``--evaluate`` names one."""
from __future__ import annotations

from typing import Any

from planners.base import Budget, PlanResult
from specs import ClusterSpec, ModelSpec
from specs.flops import throughput
from specs.units import GIB

COLUMNS = ("planner", "model", "cluster", "budget_gib", "seq_length", "global_batch", "feasible",
           "throughput_samples_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
           "iteration_time_s", "peak_memory_gib", "min_memory_gib", "search_time_s", "solver_status",
           "gap", "bound_s", "states_explored", "tie", "plan_summary", "plan_file", "calibration",
           "stack", "regret_max", "robust_time_s", "worst_scenario", "robust_reason",
           "nominal_throughput_samples_per_s",
           "nominal_iteration_time_s", "nominal_regret_max", "nominal_plan_summary")
"""The columns every record has, in table order. The regret columns are None but under a robust
objective (planners/robust.py): the plan's worst regret over the scenarios, its worst iteration
time and that scenario, why objective=auto chose robustly (None where robust was asked for); the
nominal_* ones only where the nominal objective's plan differs. ``stack``: the software stack the
plan's times assume (specs.stack; None where the cost model assumes none)."""
EVALUATION_FIELDS = ("iteration_time_s", "throughput_samples_per_s", "peak_memory_gib", "oom")
MEMORY_NOTE = ("peak GiB (cost model): states + the activations of the micro-batches in flight + the largest "
               "temporary + runtime overhead, all counted at once; {e} peak GiB: the highest total the {e}'s "
               "timeline of allocations and frees reaches (temporaries and activations freed as backward runs), "
               "usually the lower of the two")
"""Under a table with an evaluator's memory beside the cost model's: what each counts."""
"""Added as ``<evaluator>_<field>`` (e.g. sim_iteration_time_s) by ``add_evaluation``."""


def evaluation_columns(evaluator: str) -> tuple[str, ...]:
    return tuple(f"{evaluator}_{f}" for f in EVALUATION_FIELDS)


def record(result: PlanResult, model: str, cluster: str, budget: Budget, model_spec: ModelSpec,
           cluster_spec: ClusterSpec, calibration: str = "") -> dict[str, Any]:
    """One row of the results table (``model``/``cluster`` as named; the specs give the sequence
    length and the per-GPU figures of specs.flops); ``calibration`` is the cost model's
    calibration status (CostModel.calibration_status: whether its constants were fitted on this
    cluster's GPU)."""
    plan, ok = result.plan, result.feasible
    fig = throughput(model_spec, cluster_spec, plan.global_batch, result.iteration_time_s) if ok else None
    return {
        "planner": result.planner, "model": model, "cluster": cluster, "budget_gib": budget.memory_gib,
        "seq_length": model_spec.seq_len, "global_batch": plan.global_batch if plan else None, "feasible": ok,
        "throughput_samples_per_s": result.throughput_samples_per_s if ok else 0.0,
        "tokens_per_s_per_gpu": fig.tokens_per_s_per_gpu if fig else None,
        "tflops_per_gpu": fig.tflops_per_gpu if fig else None, "mfu": fig.mfu if fig else None,
        "iteration_time_s": result.iteration_time_s if ok else None,
        "peak_memory_gib": result.peak_memory_gib if ok else None,
        "min_memory_gib": result.min_memory_gib, "search_time_s": result.stats.wall_time_s,
        "solver_status": result.stats.solver_status, "gap": result.stats.gap, "bound_s": result.stats.bound_s,
        "states_explored": result.stats.states_explored,
        "tie": None, "plan_summary": plan.summary() if plan else _oom_text(result), "plan_file": None,
        "calibration": calibration, "stack": str(plan.stack) if plan and plan.stack else None,
        **robust_fields(result),
    }


def robust_fields(result: PlanResult) -> dict[str, Any]:
    """The regret columns of a record (None without a robust choice; nominal_* None when the
    robust plan is the nominal one)."""
    choice = result.robust
    if choice is None:
        return dict.fromkeys(COLUMNS[COLUMNS.index("regret_max"):])
    chosen, nominal = choice.chosen, choice.nominal
    worst = max(range(len(choice.scenarios)), key=lambda s: chosen.regret[s])
    out = {"regret_max": chosen.regret_max, "robust_time_s": chosen.worst_time_s,
           "worst_scenario": choice.scenarios[worst] if chosen.regret_max > 0 else None,
           "robust_reason": choice.reason or None}
    differs = choice.differs
    out["nominal_throughput_samples_per_s"] = (nominal.plan.global_batch / nominal.iteration_time_s[0]
                                               if differs else None)
    out["nominal_iteration_time_s"] = nominal.iteration_time_s[0] if differs else None
    out["nominal_regret_max"] = nominal.regret_max if differs else None
    out["nominal_plan_summary"] = nominal.plan.summary() if differs else None
    return out


def mark_ties(records: list[dict], band: tuple[float, float]) -> None:
    """Set ``tie`` on each feasible record whose throughput is below the best of its budget by
    less than the cost model's 10th-90th percentile error width: the ranking is not resolved.
    Without a known band (0, 0: an uncalibrated cluster) ``tie`` is None: not known."""
    width = band[1] - band[0]
    for rec in records:
        if width <= 0:
            rec["tie"] = None
            continue
        best = max((r["throughput_samples_per_s"] for r in records
                    if r["feasible"] and r["budget_gib"] == rec["budget_gib"]), default=0.0)
        gap = (best - rec["throughput_samples_per_s"]) / best if best > 0 else 0.0
        rec["tie"] = bool(rec["feasible"] and 0 < gap <= width)


def add_evaluation(rec: dict[str, Any], evaluator: str, evaluation: Any | None) -> None:
    """The evaluator's figures (None for a cell without a plan) under its prefixed columns."""
    ran = evaluation is not None and evaluation.oom is None  # an OOM iteration has no time or throughput
    values = (None,) * len(EVALUATION_FIELDS) if evaluation is None else (
        evaluation.iteration_time_s if ran else None, evaluation.throughput_samples_per_s if ran else None,
        max(evaluation.peak_memory_bytes) / GIB, evaluation.oom is not None)
    rec.update(zip(evaluation_columns(evaluator), values))


def _oom_text(result: PlanResult) -> str:
    if result.stats.solver_status == "time_limit":  # stopped before any plan: not out of memory
        return f"no plan: {result.message}"
    if result.min_memory_gib is None:
        return "OOM (no plan in this space)"
    return f"OOM (needs {result.min_memory_gib:.1f} GiB)"
