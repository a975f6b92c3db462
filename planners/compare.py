"""``python -m planners.compare``: planners x memory budgets on one model and cluster, as a table,
JSON records (--json) or files (--out DIR: one Plan JSON per cell plus results.csv/.json)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from cost_models import GIB
from planners.base import Budget, PlanResult
from planners.registry import available, get
from specs import SpecError, load_cluster, load_model
from specs.cli import ArgumentParser, count, dumps, finite, number, output_dir
from specs.errors import one_line_errors
from specs.limits import MAX_GLOBAL_BATCH

DEFAULT_PLANNERS = ("ddp", "zero2", "zero3", "megatron_tp", "gpipe", "megatron_3d", "deepspeed_3d",
                    "galvatron_dp_tp", "galvatron_dp_pp", "galvatron")
DEFAULT_BUDGETS = (8.0, 12.0, 16.0, 20.0)
DEFAULT_BATCH_RANGE = (8, 512)
"""Without --global-batch, search the global batch like Galvatron does (grow it while a plan
fits and throughput improves): powers of two in this range, best throughput wins."""
COLUMNS = ("planner", "model", "cluster", "budget_gib", "global_batch", "feasible", "throughput_samples_per_s",
           "iteration_time_s", "peak_memory_gib", "min_memory_gib", "search_time_s", "solver_status",
           "gap", "states_explored", "plan_summary", "plan_file", "sim_iteration_time_s",
           "sim_throughput_samples_per_s", "sim_peak_memory_gib", "sim_oom")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m planners.compare", description=__doc__)
    p.add_argument("--model", default="bert-huge-32", help="zoo name or config.json path")
    p.add_argument("--cluster", default="titan-8", help="zoo name (name:nodes) or cluster file")
    p.add_argument("--budget-gib", type=number(0.0, 1e6), nargs="+", default=list(DEFAULT_BUDGETS))
    p.add_argument("--planners", nargs="+", default=list(DEFAULT_PLANNERS),
                   help=f"any of: {', '.join(available())} (comma or space separated)")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=count(MAX_GLOBAL_BATCH), help="fix the global batch (default: search "
                   f"powers of two in {DEFAULT_BATCH_RANGE[0]}..{DEFAULT_BATCH_RANGE[1]})")
    batch.add_argument("--global-batch-range", type=count(MAX_GLOBAL_BATCH), nargs=2, metavar=("LO", "HI"),
                   help="search the global batch too (powers of two in [LO, HI])")
    p.add_argument("--cost-model", default="analytical", help="analytical or profiled")
    p.add_argument("--profile", help="profiled: a hybridpar profile file (python -m executor.profile)")
    p.add_argument("--galvatron-dir", help="profiled: a folder of Galvatron's own profile files; the "
                   "model is then the zoo model at the files' sequence length")
    p.add_argument("--out", type=Path, help="folder for plan JSONs and results.csv/results.json")
    p.add_argument("--json", action="store_true", help="print a JSON list of records instead of a table")
    p.add_argument("--evaluate", choices=("cost", "sim"), default="cost",
                   help="sim: also re-score each plan with simulator.simulate")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def _planner_names(raw: list[str]) -> list[str]:
    names = [n for item in raw for n in item.split(",") if n]
    if not names:
        raise SpecError("planners", f"no planner named in {' '.join(raw)!r}; choose from {', '.join(available())}")
    for n in names:
        if n not in available():
            raise SpecError("planners", f"unknown {n!r}; choose from {', '.join(available())}")
    return names


def record(result: PlanResult, model: str, cluster: str, budget: Budget) -> dict[str, Any]:
    """One row of the results table."""
    plan = result.plan
    return {
        "planner": result.planner, "model": model, "cluster": cluster, "budget_gib": budget.memory_gib,
        "global_batch": plan.global_batch if plan else None, "feasible": result.feasible,
        "throughput_samples_per_s": result.throughput_samples_per_s if result.feasible else 0.0,
        "iteration_time_s": result.iteration_time_s if result.feasible else None,
        "peak_memory_gib": result.peak_memory_gib if result.feasible else None,
        "min_memory_gib": result.min_memory_gib, "search_time_s": result.stats.wall_time_s,
        "solver_status": result.stats.solver_status, "gap": result.stats.gap,
        "states_explored": result.stats.states_explored,
        "plan_summary": plan_summary(plan) if plan else _oom_text(result),
        "plan_file": None, "sim_iteration_time_s": None, "sim_throughput_samples_per_s": None,
        "sim_peak_memory_gib": None, "sim_oom": None,
    }


def plan_summary(plan) -> str:
    """Plan.summary() with the stage sizes after the pipeline degree when pp > 1."""
    text = plan.summary()
    if plan.pp > 1:
        head = f"pp{plan.pp} m{plan.micro_batches}"
        text = text.replace(head, f"{head} [{'/'.join(map(str, plan.stage_layers))}]", 1)
    return text


def _oom_text(result: PlanResult) -> str:
    if result.min_memory_gib is None:
        return "OOM (no plan in this space)"
    return f"OOM (needs {result.min_memory_gib:.1f} GiB)"


def _simulate(rec: dict, model, cluster, plan) -> None:
    """Re-score with the simulator (imported here only: planners never depend on it)."""
    try:
        from simulator import simulate
    except ImportError as err:  # the simulator package may not be there yet
        raise SpecError("evaluate", f"the simulator is not available ({err})") from None
    sim = simulate(model, cluster, plan)
    ran = sim.oom is None  # an OOM iteration never finished: no time, no throughput
    rec["sim_iteration_time_s"] = sim.iteration_time_s if ran else None
    rec["sim_throughput_samples_per_s"] = sim.throughput_samples_per_s if ran else None
    rec["sim_peak_memory_gib"] = max(sim.peak_memory_bytes) / GIB
    rec["sim_oom"] = sim.oom is not None


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import cost_models
    names = _planner_names(args.planners)
    lo, hi = args.global_batch_range or DEFAULT_BATCH_RANGE
    if lo > hi:
        raise SpecError("global-batch-range", f"LO({lo}) > HI({hi})")
    output_dir(args.out, "--out")  # before the work, so a bad folder never costs a search
    model, cluster = load_model(args.model), load_cluster(args.cluster)
    cm = cost_models.get(args.cost_model, cluster, **_cost_model_options(args))
    model = getattr(cm, "model_spec", None) or model
    budgets = [_budget(b, args) for b in args.budget_gib]
    cells = [(b, n) for b in budgets for n in names]
    records = []
    bar = _progress(len(cells), args.no_progress)
    for budget, name in cells:
        if bar is not None:
            bar.set_description(f"{name} @ {budget.memory_gib:g} GiB")
        result = get(name).plan(model, cluster, budget, cm)
        rec = record(result, args.model, args.cluster, budget)
        if args.evaluate == "sim" and result.feasible:
            _simulate(rec, model, cluster, result.plan)
        if args.out and result.feasible:
            rec["plan_file"] = _save_plan(args.out, name, budget, result)
        records.append(rec)
        if args.out:  # each record as it completes: a run killed midway keeps what it finished
            _write_tables(args.out, records)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return records


def _cost_model_options(args: argparse.Namespace) -> dict[str, Any]:
    """Where the profiled model reads its numbers from (the analytical model takes none)."""
    if args.cost_model != "profiled":
        if args.profile or args.galvatron_dir:
            raise SpecError("--profile", "--profile/--galvatron-dir need --cost-model profiled")
        return {}
    if args.galvatron_dir:
        return {"galvatron_dir": args.galvatron_dir, "model": args.model}
    return {"profile_path": args.profile} if args.profile else {}


def _budget(gib: float, args: argparse.Namespace) -> Budget:
    if args.global_batch is not None:
        return Budget(memory_gib=gib, global_batch=args.global_batch)
    return default_budget(gib, tuple(args.global_batch_range or DEFAULT_BATCH_RANGE))


def default_budget(gib: float, batch_range: tuple[int, int] = DEFAULT_BATCH_RANGE) -> Budget:
    """The budget of one cell of the default compare."""
    return Budget(memory_gib=gib, global_batch_range=batch_range)


def _progress(total: int, disabled: bool):
    if disabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, file=sys.stderr, leave=False)


def _save_plan(out: Path, name: str, budget: Budget, result: PlanResult) -> str:
    folder = out / "plans"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}_{budget.memory_gib:g}gib.json"
    result.plan.save(path)
    return str(path)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _write_tables(out: Path, records: list[dict]) -> None:
    import csv
    import io
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS))
    writer.writeheader()
    writer.writerows(finite(records))
    _atomic_write(out / "results.csv", buf.getvalue())
    _atomic_write(out / "results.json", dumps(records, indent=1))


def table(records: list[dict]) -> str:
    """One row per cell; the plan summary last (it is long), the simulator's figure beside
    the cost model's when --evaluate sim ran."""
    from tabulate import tabulate
    with_sim = any(x["sim_iteration_time_s"] for x in records)
    head = ["GiB", "planner", "batch", "samples/s"] + (["sim samples/s"] if with_sim else []) + \
        ["iter ms", "peak GiB", "search s", "plan"]
    return tabulate([_row(r, with_sim) for r in records], headers=head, tablefmt="simple")


def _row(r: dict, with_sim: bool) -> list:
    ok = r["feasible"]
    sim = [f"{r['sim_throughput_samples_per_s']:.2f}" if r["sim_throughput_samples_per_s"] else ""]
    return ([f"{r['budget_gib']:g}", r["planner"], r["global_batch"] or "",
             f"{r['throughput_samples_per_s']:.2f}" if ok else "OOM"] + (sim if with_sim else [])
            + [f"{r['iteration_time_s'] * 1e3:.1f}" if ok else "", f"{r['peak_memory_gib']:.2f}" if ok else "",
               f"{r['search_time_s']:.2f}", r["plan_summary"]])


@one_line_errors()
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    records = run(args)
    if args.json:
        print(dumps(records, indent=1))
    else:
        print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
