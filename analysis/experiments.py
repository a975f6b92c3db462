"""Named experiments: each is a list of cells (quick or full) and a function that runs one cell.

``run_experiment("paper_eval", "results/", quick=True)`` runs every cell not yet done and
records it (analysis.results); figures read only what these write.
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import planners
from analysis.plan_metrics import cost_model_metrics, plan_and_predict, run_planner, simulator_metrics, spec_dict
from analysis.results import ResultStore, RunRecord, cell_key
from analysis.sweep import SweepReport, run_sweep
from analysis.timeline import memory_csv, spans_csv, stage_memory
from analysis.vtrain_validation import vtrain_cell, vtrain_cells
from specs import load_cluster, load_model

PAPER_MODELS = ("bert-huge-32", "bert-huge-48", "t5-large-48", "vit-huge-32", "swin-huge-32")
PAPER_CLUSTERS = ("titan-8", "titan-16")
PAPER_BUDGETS_GIB = (8, 12, 16, 20)
PAPER_PLANNERS = ("ddp", "zero3", "megatron_tp", "gpipe", "deepspeed_3d", "galvatron_dp_tp", "galvatron_dp_pp",
                  "galvatron_classic", "ilp", "cpsat")
"""Galvatron's baselines (pure DP, SDP, TP, PP, 3D, its DP+TP and DP+PP restrictions), its full
search, and the exact solvers."""
SCALING_PLANNERS = ("galvatron_classic", "ilp", "cpsat")
EXACT_PLANNERS = ("ilp", "cpsat")
"""Planners that solve the cost model's formula exactly (the reference of the optimality gap)."""
MODERN_PROBLEMS = (("llama2-7b", "dgx-a100-80g"), ("llama2-7b", "dgx-h100"),
                   ("llama2-13b", "dgx-a100-80g:2"), ("llama2-13b", "dgx-h100:2"),
                   ("llama2-70b", "dgx-a100-80g:8"), ("llama2-70b", "dgx-h100:8"),
                   ("gpt-1.7b", "dgx-a100-80g"), ("gpt-7.5b", "dgx-a100-80g:2"),
                   ("gpt-18.4b", "dgx-h100:4"), ("gpt-39.1b", "dgx-h100:8"))
QUICK_MODERN = (("llama2-7b", "dgx-a100-80g"), ("llama2-7b", "dgx-h100"), ("gpt-1.7b", "dgx-a100-80g"))
MODERN_GLOBAL_BATCH = 64
PAPER_MAX_BATCH = 256
"""Galvatron grows the batch until nothing fits; we search global batches 8..256 (powers of two)."""
EXACT_TIME_LIMIT_S = 60.0
"""Cap on each solve of ilp/cpsat (their status says whether they proved optimality)."""


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """A named experiment."""

    name: str
    cells: Callable[[bool], list[dict[str, Any]]]
    """quick -> the cells (parameter dicts) of the sweep."""
    run: Callable[..., RunRecord]
    """Runs one cell: run(**params) -> RunRecord."""
    doc: str = ""


_WARNED: set[str] = set()


def available_planners(among: tuple[str, ...] | None = None) -> list[str]:
    """Registered planners (optionally only those in ``among``) whose module imports; any that
    does not is reported on stderr once and left out."""
    names = [p for p in planners.available() if among is None or p in among]
    usable = []
    for name in names:
        try:
            planners.get(name)
            usable.append(name)
        except ImportError as err:
            if name not in _WARNED:
                _WARNED.add(name)
                print(f"warning: planner {name!r} left out: cannot be imported ({err})", file=sys.stderr)
    return usable


def _model(name: str, layers: int = 0):
    model = load_model(name)
    return model.scaled(num_layers=layers, name=f"{name}-L{layers}") if layers else model


# -- one planner on one problem (paper_eval, modern_clusters, optimality_gap) ----------------
def plan_cell(model: str, cluster: str, budget_gib: float, planner: str, layers: int = 0,
              simulate: bool = True, global_batch: int = 0, max_batch: int = 0,
              time_limit_s: float = 0) -> RunRecord:
    """Plan ``model`` (scaled to ``layers`` if > 0) on ``cluster`` under ``budget_gib`` with a
    fixed ``global_batch`` or one searched in 8..``max_batch``, then predict the plan with the
    analytical cost model and (if ``simulate``) the simulator. ``time_limit_s`` caps each
    solve of the exact planners."""
    spec, machine = _model(model, layers), load_cluster(cluster)
    options = {"time_limit_s": float(time_limit_s)} if time_limit_s and planner in EXACT_PLANNERS else {}
    plan, metrics = plan_and_predict(planner, spec, machine, float(budget_gib), simulate=simulate,
                                     global_batch=global_batch, max_batch=max_batch, **options)
    inputs = {"model": spec_dict(spec), "cluster": spec_dict(machine), "cost_model": "analytical",
              "planner_options": options}
    files = {"plan.json": plan.to_json()} if plan else {}
    return RunRecord(metrics=metrics, inputs=inputs, files=files)


def paper_eval_cells(quick: bool) -> list[dict[str, Any]]:
    """Quick: two models on titan-8 at 8 and 16 GiB, without the (slow) exact planners."""
    models = ("bert-huge-32", "vit-huge-32") if quick else PAPER_MODELS
    clusters = ("titan-8",) if quick else PAPER_CLUSTERS
    budgets = (8, 16) if quick else PAPER_BUDGETS_GIB
    names = [p for p in available_planners(PAPER_PLANNERS) if not (quick and p in EXACT_PLANNERS)]
    return [{"model": m, "cluster": c, "budget_gib": b, "planner": p, "max_batch": PAPER_MAX_BATCH,
             **({} if p not in EXACT_PLANNERS else {"time_limit_s": EXACT_TIME_LIMIT_S})}
            for m in models for c in clusters for b in budgets for p in names]


def modern_cells(quick: bool) -> list[dict[str, Any]]:
    problems = QUICK_MODERN if quick else MODERN_PROBLEMS
    budgets = (80,) if quick else (40, 80)
    names = [p for p in available_planners() if not (quick and p in EXACT_PLANNERS)]
    return [{"model": m, "cluster": c, "budget_gib": b, "planner": p, "simulate": False,
             "global_batch": MODERN_GLOBAL_BATCH,
             **({} if p not in EXACT_PLANNERS else {"time_limit_s": EXACT_TIME_LIMIT_S})}
            for m, c in problems for b in budgets for p in names
            if b <= load_cluster(c).gpu.memory_gib]


def gap_cells(quick: bool) -> list[dict[str, Any]]:
    """Problems small enough (8 or 16 layers, batch 32) for the exact planners to prove optimality."""
    layers = 8 if quick else 16
    models = ("bert-huge-32", "t5-large-48") if quick else PAPER_MODELS
    budgets = (8, 16) if quick else PAPER_BUDGETS_GIB
    return [{"model": m, "cluster": "titan-8", "budget_gib": b, "planner": p, "layers": layers,
             "simulate": False, "global_batch": 32}
            for m in models for b in budgets for p in available_planners()]


# -- search time vs problem size -----------------------------------------------------------
def search_cell(planner: str, layers: int, gpus: int, model: str = "bert-huge-32",
                budget_gib: float = 16, global_batch: int = 32, time_limit_s: float = 0,
                repeats: int = 1) -> RunRecord:
    """Search time of ``planner`` on ``model`` scaled to ``layers`` on ``gpus`` titan GPUs: the
    best of ``repeats`` searches (the machine is shared, so the minimum is the least noisy)."""
    spec = _model(model, layers)
    machine = load_cluster(f"titan-8:{gpus // 8}")
    options = {"time_limit_s": float(time_limit_s)} if time_limit_s and planner in EXACT_PLANNERS else {}
    times = []
    for _ in range(max(1, repeats)):
        result, metrics = run_planner(planner, spec, machine, float(budget_gib), global_batch=global_batch,
                                      **options)
        times.append(metrics.get("search_time_s"))
    metrics["search_time_s"] = min((t for t in times if t is not None), default=None)
    if result is not None and result.feasible:
        metrics.update(cost_model_metrics(spec, machine, result.plan))
    return RunRecord(metrics=metrics, inputs={"model": spec_dict(spec), "cluster": spec_dict(machine),
                                              "planner_options": options})


def search_cells(quick: bool) -> list[dict[str, Any]]:
    grid = [(4, 8), (8, 8), (16, 8), (8, 16)] if quick else \
        [(l, 8) for l in (4, 8, 16, 32, 48, 64)] + [(16, g) for g in (16, 32, 64)]
    names = available_planners(SCALING_PLANNERS)
    return [{"planner": p, "layers": l, "gpus": g, "repeats": 2,
             **({} if p not in EXACT_PLANNERS else {"time_limit_s": EXACT_TIME_LIMIT_S})}
            for p in names for l, g in grid]


# -- a picture of one plan and its simulated iteration --------------------------------------
def picture_cell(model: str, cluster: str, budget_gib: float, planner: str) -> RunRecord:
    """Plan, simulate with a trace, and keep the plan, the trace and the memory timeline."""
    spec, machine = load_model(model), load_cluster(cluster)
    result, metrics = run_planner(planner, spec, machine, float(budget_gib), max_batch=PAPER_MAX_BATCH)
    if result is None or not result.feasible:
        raise ValueError(f"plan_picture: {planner} found no plan for {model} on {cluster} "
                         f"under {budget_gib} GiB ({metrics.get('error', '')})")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        sim, sim_metrics = simulator_metrics(spec, machine, result.plan, trace_path=str(trace), keep_spans=True)
        trace_text = trace.read_text()
    metrics.update(sim_metrics)
    metrics.update(cost_model_metrics(spec, machine, result.plan))
    files = {"plan.json": result.plan.to_json(), "trace.json": trace_text,
             "spans.csv": spans_csv(sim.spans),
             "memory.csv": memory_csv(stage_memory(sim.memory_timeline, result.plan, machine.world_size))}
    return RunRecord(metrics=metrics, inputs={"model": spec_dict(spec), "cluster": spec_dict(machine)},
                     files=files)


def picture_cells(quick: bool) -> list[dict[str, Any]]:
    return [{"model": "bert-huge-32", "cluster": "titan-8", "budget_gib": 8, "planner": "galvatron_classic"}]


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment(name="paper_eval", cells=paper_eval_cells, run=plan_cell,
               doc="Galvatron's evaluation: paper models on titan-8/16 at 8-20 GiB, every planner"),
    Experiment(name="search_scaling", cells=search_cells, run=search_cell,
               doc="search time of galvatron, ilp and cpsat vs layers and GPUs"),
    Experiment(name="optimality_gap", cells=gap_cells, run=plan_cell,
               doc="each planner's cost-model throughput vs the exact solvers' optimum"),
    Experiment(name="modern_clusters", cells=modern_cells, run=plan_cell,
               doc="LLaMA-2 and GPT models on DGX A100/H100 clusters, every planner"),
    Experiment(name="vtrain_validation", cells=vtrain_cells, run=vtrain_cell,
               doc="cost models and simulator vs the vTrain measured A100 runs"),
    Experiment(name="plan_picture", cells=picture_cells, run=picture_cell,
               doc="one plan, its simulated timeline and memory over time"),
)}


def get(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment: unknown {name!r}; choose from {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def run_experiment(name: str, results: str | Path, quick: bool = False, progress: bool = True,
                   command: str | None = None, workers: int = 1, ray_address: str | None = None) -> SweepReport:
    """Run every cell of experiment ``name`` that ``results`` does not hold yet (``workers``
    cells at once in a local process pool, or each a Ray task on the cluster at ``ray_address``:
    analysis.sweep.run_sweep)."""
    experiment = get(name)
    return run_sweep(ResultStore(results), name, experiment.cells(quick), experiment.run,
                     command=command, progress=progress, workers=workers, ray_address=ray_address)


def finished(name: str, results: str | Path, quick: bool = False):
    """The table rows of this mode's cells of experiment ``name`` (a DataFrame)."""
    store = ResultStore(results)
    keys = {cell_key(name, c) for c in get(name).cells(quick)}
    table = store.table(name)
    return table[table["key"].isin(keys)].reset_index(drop=True) if len(table) else table
