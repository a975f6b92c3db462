"""Glue to the other packages: plan a problem, then predict the plan with a cost model and the simulator.

Only public entry points are used: planners.plan, cost_models.get(...).plan_cost and
simulator.simulate. Each function returns flat scalar metrics for the results table.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import cost_models
import planners
import simulator
from analysis.results import plan_hash
from specs import ClusterSpec, ModelSpec, Plan, SpecError
from specs.units import GIB



def spec_dict(spec: Any) -> dict[str, Any]:
    """A frozen spec dataclass as JSON-able data (the run's resolved inputs)."""
    return json.loads(json.dumps(dataclasses.asdict(spec), default=str))


def budget(memory_gib: float, global_batch: int = 0, max_batch: int = 0) -> Any:
    """A planners.Budget: a fixed global batch, or a range 8..max_batch searched, or the default."""
    if global_batch:
        return planners.Budget(memory_gib=memory_gib, global_batch=global_batch)
    if max_batch:
        return planners.Budget(memory_gib=memory_gib, global_batch_range=(min(8, max_batch), max_batch))
    return planners.Budget(memory_gib=memory_gib)


def run_planner(planner: str, model: ModelSpec, cluster: ClusterSpec, budget_gib: float, *,
                global_batch: int = 0, max_batch: int = 0, cost_model: str | None = None,
                **options: Any) -> tuple[Any, dict[str, Any]]:
    """Plan with ``planner`` (``options`` go to the planner); returns (PlanResult or None,
    metrics). A planner that rejects the problem (SpecError/ValueError) is recorded as an
    error (retried on the next sweep), not raised."""
    costs = None if cost_model is None else cost_models.get(cost_model, cluster)
    try:
        result = planners.plan(planner, model, cluster, budget(budget_gib, global_batch, max_batch),
                               cost_model=costs, **options)
    except (SpecError, ValueError) as err:
        return None, {"feasible": False, "error": f"{type(err).__name__}: {err}"}
    return result, planner_metrics(result)


def planner_metrics(result: Any) -> dict[str, Any]:
    """What the planner itself reports (its own prediction and its search time)."""
    plan = result.plan if result.feasible else None
    stats = getattr(result, "stats", None)
    return {
        "feasible": bool(result.feasible),
        "error": "",
        "search_time_s": _float(getattr(stats, "wall_time_s", None)),
        "solver_status": str(getattr(stats, "solver_status", "") or ""),
        "solver_gap": _float(getattr(stats, "gap", None)),
        "planner_throughput": _float(result.throughput_samples_per_s) if plan else None,
        "planner_iteration_time_s": _float(result.iteration_time_s) if plan else None,
        "planner_peak_memory_gib": _float(result.peak_memory_gib) if plan else None,
        "min_memory_gib": _float(getattr(result, "min_memory_gib", None)),
        "plan_hash": plan_hash(plan.to_dict()) if plan else "",
        "plan_summary": plan.summary() if plan else "",
        "pp": plan.pp if plan else None,
        "global_batch": plan.global_batch if plan else None,
        "micro_batches": plan.micro_batches if plan else None,
    }


def cost_model_metrics(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
                       name: str = "analytical") -> dict[str, Any]:
    """The cost model's prediction of ``plan``."""
    cost = cost_models.get(name, cluster).plan_cost(model, plan)
    return {"cost_model_throughput": cost.throughput_samples_per_s,
            "cost_model_iteration_time_s": cost.iteration_time_s,
            "cost_model_peak_memory_gib": cost.peak_memory_bytes / GIB}


def simulator_metrics(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
                      **options: Any) -> tuple[Any, dict[str, Any]]:
    """The simulator's prediction of ``plan`` (``options`` go to simulate): (SimResult, metrics)."""
    result = simulator.simulate(model, cluster, plan, **options)
    return result, {"sim_throughput": _float(result.throughput_samples_per_s),
                    "sim_iteration_time_s": _float(result.iteration_time_s),
                    "sim_peak_memory_gib": _float(result.peak_memory_gib),
                    "sim_oom": result.oom is not None,
                    "sim_bubble_fraction": _float(getattr(result, "bubble_fraction", None))}


def plan_and_predict(planner: str, model: ModelSpec, cluster: ClusterSpec, budget_gib: float,
                     simulate: bool = True, **plan_options: Any) -> tuple[Plan | None, dict[str, Any]]:
    """The planner's plan and every prediction of it: (plan or None, metrics)."""
    result, metrics = run_planner(planner, model, cluster, budget_gib, **plan_options)
    if result is None or not result.feasible:
        return None, metrics
    plan = result.plan
    metrics.update(cost_model_metrics(model, cluster, plan))
    if simulate:
        metrics.update(simulator_metrics(model, cluster, plan)[1])
    return plan, metrics


def _float(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None
