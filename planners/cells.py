"""Running the compare grid: every (memory budget, planner) cell on one model and cluster, with
one cost model, optionally re-scored by an evaluator; returns one record per cell."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cost_models
from planners.base import Budget
from planners.evaluate import EVALUATORS
from planners.records import add_evaluation, mark_ties, record
from planners.registry import DEFAULT_PLANNERS, get
from planners.report import save_plan, write_tables
from specs import load_cluster, load_model

DEFAULT_BUDGETS = (8.0, 12.0, 16.0, 20.0)
DEFAULT_BATCH_RANGE = (8, 512)
"""Without a fixed global batch, search it like Galvatron does (grow it while a plan fits and
throughput improves): powers of two in this range, best throughput wins."""


@dataclass(frozen=True, kw_only=True)
class Grid:
    """What one compare run covers."""

    model: str = "bert-huge-32"
    """Zoo name or config.json path."""
    cluster: str = "titan-8"
    """Zoo name (name:nodes) or cluster file."""
    budgets: tuple[Budget, ...]
    """One per memory budget."""
    planners: tuple[str, ...] = DEFAULT_PLANNERS
    """Registered planner names."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Planner name -> options it is run with."""
    cost_model: str = "analytical"
    """Registered cost model name."""
    cost_model_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the cost model (the profiled one's file or folder)."""
    evaluator: str | None = None
    """Registered evaluator that re-scores each feasible plan (None: the cost model's figures only)."""
    out: Path | None = None
    """Folder for plan JSONs and results.csv/.json."""
    progress: bool = True
    """A progress bar on stderr."""


def default_budget(gib: float, batch_range: tuple[int, int] = DEFAULT_BATCH_RANGE) -> Budget:
    """The budget of one cell of the default compare."""
    return Budget(memory_gib=gib, global_batch_range=batch_range)


def run(grid: Grid) -> list[dict[str, Any]]:
    """One record per cell, budgets outermost; files under ``grid.out`` when given."""
    model, cluster = load_model(grid.model), load_cluster(grid.cluster)
    cm = cost_models.get(grid.cost_model, cluster, **grid.cost_model_options)
    model = getattr(cm, "model_spec", None) or model  # a profile can fix the sequence length
    evaluator = EVALUATORS.get(grid.evaluator)() if grid.evaluator else None
    cells = [(b, n) for b in grid.budgets for n in grid.planners]
    records = []
    bar = _progress(len(cells), grid.progress)
    for budget, name in cells:
        if bar is not None:
            bar.set_description(f"{name} @ {budget.memory_gib:g} GiB")
        result = get(name).plan(model, cluster, budget, cm, dict(grid.options.get(name, {})))
        rec = record(result, grid.model, grid.cluster, budget)
        if evaluator is not None:
            add_evaluation(rec, grid.evaluator, evaluator.evaluate(model, cluster, result.plan)
                           if result.feasible else None)
        if grid.out and result.feasible:
            rec["plan_file"] = save_plan(grid.out, name, budget, result)
        records.append(rec)
        if grid.out:  # each record as it completes: a run killed midway keeps what it finished
            write_tables(grid.out, records)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    mark_ties(records, cm.error_band())
    if grid.out:
        write_tables(grid.out, records)
    return records


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, file=sys.stderr, leave=False)
