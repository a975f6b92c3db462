"""What compare adds around its grid: the default budget (the GPU's memory), --same-batch (every
planner at the best plan's global batch), --report (the HTML page) and the --list details."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from planners.base import Budget
from runners.cells import Grid, grid_specs, run
from planners.html import report_page
from specs import Plan, SpecError, load_cluster, load_model, model_names
from specs.precision import PRECISIONS
from specs.files import atomic_write_text
from specs.units import GIB

PRECISION_CHOICES = ("search", "fp8", *PRECISIONS)
"""--precision: one precision for every layer of every plan (fp8: the GPU's recipe, MXFP8 on
Blackwell, current scaling elsewhere), or search (the planners try bf16 and that recipe: galvatron
per plan by default, ``precision_per``); none: each planner's own space, bf16."""


def check_precision(precision: str | None) -> str | None:
    if precision is not None and precision not in PRECISION_CHOICES:
        raise SpecError("--precision", f"{precision!r} is not a choice; choose from {', '.join(PRECISION_CHOICES)}")
    return precision


def option_for_all(options: dict[str, dict[str, Any]], planners: Sequence[str], name: str,
                   value: Any) -> dict[str, dict[str, Any]]:
    """Every planner's options with ``name`` = ``value`` (a command-line flag such as --precision
    or --robust), when one is given; a planner's own --option of that name wins."""
    if value is None:
        return options
    return {**options, **{p: {name: value, **options.get(p, {})} for p in planners}}


def gpu_budget_gib(cluster: str) -> float:
    """The default budget: all of one GPU's memory (the planners keep the allocator reserve out)."""
    return load_cluster(cluster).gpu.memory_gib


def reserve_gib(grid: Grid, budget_gib: float) -> float:
    """The allocator reserve the cost model keeps out of a ``budget_gib`` budget."""
    return grid_specs(grid)[2].allocator_reserve_bytes(budget_gib * GIB) / GIB


def budget_line(grid: Grid) -> str:
    """One line saying each budget, the reserve kept out of it and the reserve's rule."""
    parts = [f"{b.memory_gib:g} GiB ({reserve_gib(grid, b.memory_gib):g} GiB allocator reserve)" for b in grid.budgets]
    rule = grid_specs(grid)[2].reserve.describe()
    return f"budget per GPU: {', '.join(parts)}; reserve: {rule} (--reserve-gib, --reserve-fraction)"


def same_batch(grid: Grid, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every planner of a budget re-planned at the global batch of that budget's best plan (cells
    already at that batch kept): like-for-like rows, Megatron-style (one batch, many layouts)."""
    out = list(records)
    for budget in grid.budgets:
        rows = [i for i, r in enumerate(records) if r["budget_gib"] == budget.memory_gib]
        best = max((records[i] for i in rows if records[i]["feasible"]),
                   key=lambda r: r["throughput_samples_per_s"], default=None)
        if best is None:
            continue
        fixed = Budget(memory_gib=budget.memory_gib, global_batch=best["global_batch"])
        redo = [i for i in rows if records[i]["global_batch"] != best["global_batch"]]
        if not redo:
            continue
        again = run(replace(grid, budgets=(fixed,), planners=tuple(records[i]["planner"] for i in redo)))
        for i, rec in zip(redo, again):
            out[i] = rec
    return out


def write_report(path: Path, grid: Grid, records: list[dict[str, Any]]) -> str:
    """The HTML page for the best feasible cell of the largest budget; what it shows, one line."""
    feasible = [r for r in records if r["feasible"] and "plan" in r]
    if not feasible:
        raise SpecError("--report", "no cell has a plan to draw (every planner is OOM at every budget)")
    top = max(r["budget_gib"] for r in feasible)
    chosen = max((r for r in feasible if r["budget_gib"] == top), key=lambda r: r["throughput_samples_per_s"])
    model, cluster, cm = grid_specs(grid)
    plan = Plan.from_dict(chosen["plan"])
    page = report_page(model=model, cluster=cluster, records=records, chosen=chosen, plan=plan,
                       cost=cm.plan_cost(model, plan), reserve_gib=reserve_gib(grid, top))
    atomic_write_text(path, page)
    return f"report: {path} ({chosen['planner']} at {top:g} GiB)"


def model_lines() -> list[str]:
    """--list models with what tells them apart: parameters, layers, sequence length."""
    rows = []
    for name in model_names():
        m = load_model(name)
        rows.append(f"{name:16} {m.param_count() / 1e9:8.2f} B params  {m.num_layers:3} layers  seq {m.seq_len}")
    return rows


def imported_vs_best(target: str, path: Path, model_name: str, cluster_name: str, budget_gib: float | None,
                     out: Path | None = None) -> list[str]:
    """A framework's config (``--from TARGET FILE``) predicted, beside the best plan that framework
    can launch at the same global batch and memory (its files written under ``out`` when given)."""
    import cost_models
    import frameworks
    from frameworks.export import import_files
    from planners.targets import plan_for_target
    plan, model, cluster = import_files(target, [path], model_name, cluster_name)
    cm = cost_models.get("analytical", cluster)
    cost = cm.plan_cost(model, plan)
    budget = Budget(memory_gib=budget_gib or cluster.gpu.memory_gib, global_batch=plan.global_batch)
    best = plan_for_target(target, model, cluster, budget, cm)
    rows = [["imported", f"{cost.throughput_samples_per_s:.3f}", f"{cost.iteration_time_s:.2f}",
             f"{cost.peak_memory_bytes / GIB:.1f}", plan.summary()]]
    lines = [f"{path} as {target} on {cluster.name} ({cluster.world_size} GPUs), global batch {plan.global_batch}, "
             f"{budget.memory_gib:g} GiB"]
    if best.feasible:
        rows.append([f"best {target}", f"{best.throughput_samples_per_s:.3f}", f"{best.iteration_time_s:.2f}",
                     f"{best.peak_memory_gib:.1f}", best.plan.summary()])
        if out:
            frameworks.get(target).export(best.plan, model, cluster).write(out / "imported_better" / target)
    from tabulate import tabulate
    lines.append(tabulate(rows, headers=["plan", "samples/s", "iter s", "peak GiB", "summary"], tablefmt="simple"))
    if best.feasible:
        lines.append(f"speed-up {best.throughput_samples_per_s / cost.throughput_samples_per_s:.3f}x")
    else:
        lines.append(f"best {target}: {best.message}")
    return lines
