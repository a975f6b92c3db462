"""How close the simulator's iteration times are to measured A100 runs.

``python -m benchmarks.simulator_accuracy``: simulates every run of vtrain_a100_*.csv and of
Megatron-LM's published runs (data/megatron_a100) as Megatron ran them (padded vocabulary,
gradient all-reduce after the last backward) with the analytical model's compute times (its
cluster calibration) and the simulator's own play-out of communication; prints MAPE, median
and worst error and Kendall's tau per model and set.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import error_analysis
from cost_models.measured_runs import MEGATRON_SOFTWARE, as_megatron, load_cases, megatron_runs
from specs import SpecError
from specs.errors import one_line_errors
from specs.files import atomic_write_json

REQUIRED_MAPE = {"single": 10.0, "multi": 15.0, "published": 3.65}
"""The bar per set, percent: issue 5's for the vTrain sets (vTrain's own simulator: 8.37 and
14.73); for Megatron-LM's published runs the mean error Calculon reports on them (3.65%, as
quoted in issue 17)."""


def simulate_case(case, cost_models_cache: dict, coalesce: bool) -> tuple[float, float]:
    """Simulated and analytical (plan_cost) iteration time of one measured run, seconds."""
    import cost_models
    from simulator import simulate
    model, plan = as_megatron(case.model, case.plan)
    key = case.cluster.name
    if key not in cost_models_cache:
        cost_models_cache[key] = cost_models.get("analytical", case.cluster, **MEGATRON_SOFTWARE)
    result = simulate(model, case.cluster, plan, cost_models_cache[key], overlap_dp=False,
                      record_memory=False, coalesce_steps=coalesce)
    return result.iteration_time_s, cost_models_cache[key].plan_cost(model, plan).iteration_time_s


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b between two equally long arrays."""
    from scipy.stats import kendalltau
    return float(kendalltau(a, b).statistic) if len(a) > 2 else float("nan")


def rows_for(set_name: str, keys: list[str], predicted: np.ndarray, measured: np.ndarray,
             formula: np.ndarray) -> list[list]:
    """One row for the whole set, then one per model size (last column: the cost model's MAPE)."""
    rows = []
    order = sorted(set(keys), key=lambda k: (int(k[1:].split("-")[0]), int(k.split("-L")[1])))
    for key in ["all"] + order:
        idx = [i for i, k in enumerate(keys) if key in ("all", k)]
        err = np.abs(predicted[idx] - measured[idx]) / measured[idx] * 100
        formula_err = np.abs(formula[idx] - measured[idx]) / measured[idx] * 100
        rows.append([set_name, key, len(idx), err.mean(), float(np.median(err)), err.max(),
                     kendall_tau(predicted[idx], measured[idx]), formula_err.mean()])
    return rows


def run_set(set_name: str, limit: int | None, coalesce: bool) -> tuple[list[str], np.ndarray, np.ndarray,
                                                                      np.ndarray, float]:
    from tqdm import tqdm
    cases = load_cases(set_name)
    if limit:
        cases = cases[:: max(1, len(cases) // limit)][:limit]
    cache: dict = {}
    start = time.time()
    both = np.array([simulate_case(c, cache, coalesce) for c in tqdm(cases, desc=f"simulating {set_name}", leave=False)])
    measured = np.array([c.measured_s for c in cases])
    return [c.model_key for c in cases], both[:, 0], measured, both[:, 1], time.time() - start


def _print_analysis(set_name: str, features: list[str], limit: int | None, predicted: np.ndarray) -> None:
    """Error by feature and the worst runs of the simulator (breakdown by its cost model)."""
    import cost_models
    runs = megatron_runs(set_name)
    if limit:
        runs = runs[:: max(1, len(runs) // limit)][:limit]
    models: dict = {}
    model_for = lambda cluster: models.setdefault(cluster, cost_models.get("analytical", cluster, **MEGATRON_SOFTWARE))
    error_analysis.print_analysis(f"simulator, {set_name}", features, runs, predicted, model_for)


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulator_accuracy", description=__doc__)
    parser.add_argument("--set", choices=[*REQUIRED_MAPE, "all"], default="all")
    parser.add_argument("--limit", type=int, default=None, help="every k-th run, at most this many per set")
    parser.add_argument("--steps", action="store_true",
                        help="play every ring step as its own flow (slower; default coalesces steps)")
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    parser.add_argument("--by", default=None, help="also print the error grouped by these features "
                        f"(comma-separated: {', '.join(error_analysis.FEATURES)}; or all) and the 20 worst runs")
    args = parser.parse_args(argv)
    features = error_analysis.parse_features(args.by)
    if args.limit is not None and args.limit <= 0:
        raise SpecError("--limit", f"must be positive, got {args.limit}")
    rows, verdicts = [], []
    for set_name in (list(REQUIRED_MAPE) if args.set == "all" else [args.set]):
        keys, predicted, measured, formula, wall = run_set(set_name, args.limit, not args.steps)
        if features:
            _print_analysis(set_name, features, args.limit, predicted)
        rows += rows_for(set_name, keys, predicted, measured, formula)
        mape = rows[-len(set(keys)) - 1][3]
        ok = mape <= REQUIRED_MAPE[set_name]
        verdicts.append(f"{set_name}: MAPE {mape:.2f}% (required <= {REQUIRED_MAPE[set_name]:g}%) "
                        f"{'PASS' if ok else 'FAIL'}; {len(keys)} runs in {wall:.0f} s")
    headers = ["set", "model", "runs", "MAPE %", "median %", "worst %", "Kendall tau", "cost model MAPE %"]
    print(tabulate(rows, headers=headers, floatfmt=".2f"))
    print("\n".join(verdicts))
    if args.out:
        atomic_write_json(args.out, [dict(zip(headers, r)) for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
