"""Running the compare grid: every (memory budget, planner) cell on one model and cluster, with
one cost model, optionally re-scored by an evaluator; returns one record per cell."""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import cost_models
from planners.base import Budget
from runners.evaluators import EVALUATORS
from runners.records import add_evaluation, mark_ties, record
from planners.registry import DEFAULT_PLANNERS, get
from runners.report import save_plan, write_tables
from specs import SpecError, load_cluster, load_model
from specs.files import remove_stale_temporaries
from specs.processes import completed, worker_pool
from specs.embedded import with_specs

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
    workers: int = 1
    """Processes running cells at once (1: in this process); the records are the same either way."""
    seq_length: int | None = None
    """Train at this sequence length instead of the model's (None: the model's)."""
    attention: str | None = None
    """Compute attention this way (eager, flash) instead of as the config says (None)."""
    keep_plans: bool = False
    """Each feasible record also carries its plan as a dict under ``plan`` (for reports)."""
    ray_address: str | None = None
    """Run every cell as a Ray task on this cluster ('auto', 'ray://host:10001', ...; 'local'
    starts a Ray instance here with ``workers`` CPUs); None: no Ray. Needs the optional extra
    ``.[ray]`` and hybridpar importable on every node."""

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise SpecError("workers", f"must be a positive integer, got {self.workers!r}")
        check_ray(self.ray_address)


def check_ray(address: str | None) -> None:
    """A one-line SpecError naming ``ray`` when a Ray ``address`` is given but Ray is not installed."""
    if address is not None and importlib.util.find_spec("ray") is None:
        raise SpecError("ray", f"--ray {address}: Ray is not installed (pip install -e '.[ray]')")


def default_budget(gib: float, batch_range: tuple[int, int] = DEFAULT_BATCH_RANGE) -> Budget:
    """The budget of one cell of the default compare."""
    return Budget(memory_gib=gib, global_batch_range=batch_range)


def run(grid: Grid) -> list[dict[str, Any]]:
    """One record per cell, budgets outermost; files under ``grid.out`` when given. With
    ``grid.workers`` > 1 the cells run in a local process pool (each worker keeps its own cost
    model, so its tables are shared by the cells it runs), with ``grid.ray_address`` as Ray tasks
    (``ray_map``); records keep the serial order."""
    cm = _context(grid)[2]
    if grid.out:  # what a killed run of this folder left half-written
        for folder in (Path(grid.out), Path(grid.out) / "plans"):
            remove_stale_temporaries(folder)
    cells = [(b, n) for b in grid.budgets for n in grid.planners]
    done: dict[int, dict[str, Any]] = {}
    bar = _progress(len(cells), grid.progress)

    def finished(i: int, rec: dict[str, Any]) -> None:
        done[i] = rec
        if grid.out:  # each record as it completes: a run killed midway keeps what it finished
            write_tables(grid.out, [done[j] for j in sorted(done)])
        if bar is not None:
            bar.set_description(f"{cells[i][1]} @ {cells[i][0].memory_gib:g} GiB")
            bar.update(1)

    if grid.ray_address is not None:
        ray_map(run_cell, [{"grid": grid, "budget": b, "name": n} for b, n in cells], grid.ray_address,
                grid.workers, finished)
    elif grid.workers == 1:
        for i, (budget, name) in enumerate(cells):
            finished(i, run_cell(grid, budget, name))
    else:
        with worker_pool(grid.workers) as pool:
            futures = {pool.submit(run_cell, grid, b, n): i for i, (b, n) in enumerate(cells)}
            for i, rec in completed(futures):
                finished(i, rec)
    if bar is not None:
        bar.close()
    records = [done[i] for i in range(len(cells))]
    mark_ties(records, cm.error_band())
    if grid.out:
        write_tables(grid.out, records)
    return records


_CONTEXTS: dict[tuple, tuple] = {}
"""Per process: (model, cluster, cost model, evaluator) of a grid, so cells share the tables."""


def forget_contexts() -> None:
    """Drop this process's cost models (and their tables), so that the next run builds its own:
    for timing repeated runs in one process."""
    _CONTEXTS.clear()


def _context(grid: Grid) -> tuple:
    key = (grid.model, grid.cluster, grid.cost_model, repr(sorted(grid.cost_model_options.items())), grid.evaluator,
           grid.seq_length, grid.attention)
    if key not in _CONTEXTS:
        model, cluster = load_model(grid.model), load_cluster(grid.cluster)
        model = model.with_seq_len(grid.seq_length) if grid.seq_length else model
        model = model.with_attention(grid.attention) if grid.attention else model
        cm = cost_models.get(grid.cost_model, cluster, **grid.cost_model_options)
        model = getattr(cm, "model_spec", None) or model  # a profile can fix the sequence length
        evaluator = EVALUATORS.get(grid.evaluator)() if grid.evaluator else None
        _CONTEXTS[key] = (model, cluster, cm, evaluator)
    return _CONTEXTS[key]


def grid_specs(grid: Grid) -> tuple:
    """(model, cluster, cost model) a grid's cells are planned with, in this process."""
    return _context(grid)[:3]


def run_cell(grid: Grid, budget: Budget, name: str) -> dict[str, Any]:
    """The record of one (budget, planner) cell (its plan file written when ``grid.out``)."""
    model, cluster, cm, evaluator = _context(grid)
    result = get(name).plan(model, cluster, budget, cm, dict(grid.options.get(name, {})))
    rec = record(result, grid.model, grid.cluster, budget, model, cluster, cm.calibration_status())
    if evaluator is not None:
        add_evaluation(rec, grid.evaluator, evaluator.evaluate(model, cluster, result.plan)
                       if result.feasible else None)
    if grid.out and result.feasible:
        embedded = replace(result, plan=with_specs(result.plan, model, cluster))  # loads in any folder
        rec["plan_file"] = save_plan(grid.out, name, budget, embedded)
    if grid.keep_plans and result.feasible:
        rec["plan"] = result.plan.to_dict()
    return rec


def ray_map(fn: Callable[..., Any], kwargs_list: Sequence[Mapping[str, Any]], address: str, cpus: int,
            finished: Callable[[int, Any], None]) -> None:
    """``fn(**kwargs)`` for every entry of ``kwargs_list`` as a Ray task on the cluster at
    ``address`` ('local' starts a Ray instance here with ``cpus`` CPUs; an initialized Ray is
    used as it is). ``finished(i, result)`` gets each result in this process as its task ends
    (the order of completion, like a process pool); a task or ``finished`` that raises cancels
    the tasks not yet done and the error propagates."""
    import ray
    if not ray.is_initialized():
        local = address == "local"
        ray.init(address=None if local else address, num_cpus=cpus if local else None,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
    task = ray.remote(fn)
    index = {task.remote(**kwargs): i for i, kwargs in enumerate(kwargs_list)}
    pending = list(index)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            finished(index[ready[0]], ray.get(ready[0]))
    except BaseException:
        for ref in pending:
            ray.cancel(ref)
        raise


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, file=sys.stderr, leave=False)
