"""Fit the analytical model's free constants to measurements and write a cluster calibration file.

One recipe per GPU (``python -m cost_models.calibrate --cluster NAME``, RECIPES):
- dgx-a100-80g: collectives (base latency, per-step latency factor, bus efficiency) from
  nccl-tests all-reduce tables (data/nccl_a100), then the GEMM efficiency curve, memory
  efficiency and fixed overheads from the vTrain single-node runs;
- dgx-h100: the FP8 GEMM efficiency from NeMo 24.07's FP8 DGX-H100 table
  (data/h100_fp8_calibration), every other constant at its public default.
Compute fits minimise squared log error (scipy.optimize.least_squares, soft-L1 loss so a few
odd runs cannot dominate); a K-fold (or leave-one-out) cross-validation gives the error band.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy.optimize import least_squares

from cost_models.analytical import AnalyticalModel
from cost_models.base import pipeline_time
from cost_models.constants import AnalyticalConstants, save_calibration
from cost_models.measured_runs import MEGATRON_SOFTWARE, Run, megatron_runs, nemo_h100_runs
from specs import ClusterSpec, SpecError, load_cluster
from specs.cli import ArgumentParser, count, output_file
from specs.datasets import Dataset, data_path
from specs.errors import one_line_errors

COMPUTE_PARAMS: dict[str, tuple[float, float]] = {
    "gemm_half_efficiency_flops": (1e6, 1e11),
    "memory_efficiency": (0.2, 1.0),
    "kernel_overhead_s": (1e-7, 1e-3),
    "host_time_per_kernel_s": (1e-7, 1e-3),
    "micro_batch_overhead_s": (1e-7, 0.05),
    "iteration_overhead_s": (1e-6, 0.5),
}
"""Fitted on the A100 iteration times: name -> (lower, upper) bound; fitted in log space.
gemm_efficiency_max stays at its public figure: single-node runs (GEMMs up to ~0.3 TFLOP)
cannot tell it apart from the curve's knee, and fitting it (to 0.95) made large-model
predictions 15% too fast."""
FP8_PARAMS: dict[str, tuple[float, float]] = {"fp8_gemm_efficiency_max": (0.3, 1.0)}
"""Fitted on the H100 FP8 iteration times. The NeMo table cannot identify the rest: fitted
beside it with F_half, the per-micro-batch overhead runs to its lower bound and the
leave-one-out error grows (9.4% -> 10.6%); memory efficiency trades against the FP8 ceiling
(0.35 with 0.997); BF16's gemm_efficiency_max is seen only through attention in FP8 runs."""
BOUNDS = {**COMPUTE_PARAMS, **FP8_PARAMS}
LAUNCH_BOUND_STARTS = ()
"""Extra starting points of the compute fit: a framework whose small layers are launch-bound."""
COLLECTIVE_PARAMS: dict[str, tuple[float, float]] = {
    "collective_base_latency_s": (1e-6, 2e-4),
    "step_latency_factor": (0.05, 20.0),
    "bus_efficiency": (0.2, 1.0),
}
"""Fitted on nccl-tests tables."""


# -- fitting machinery -------------------------------------------------------------------------
def _fit(names: Sequence[str], bounds: dict[str, tuple[float, float]], start: AnalyticalConstants,
         residuals: Callable[[AnalyticalConstants], np.ndarray], max_evals: int
         ) -> tuple[AnalyticalConstants, float]:
    """least_squares over log(constant) within bounds, from ``start``: (constants, cost)."""
    lo = np.log([bounds[n][0] for n in names])
    hi = np.log([bounds[n][1] for n in names])
    x0 = np.clip(np.log([getattr(start, n) for n in names]), lo + 1e-9, hi - 1e-9)

    def fun(x: np.ndarray) -> np.ndarray:
        return residuals(start.with_values(dict(zip(names, np.exp(x)))))

    result = least_squares(fun, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, max_nfev=max_evals,
                           diff_step=1e-3)
    return start.with_values(dict(zip(names, np.exp(result.x)))), float(result.cost)


def _structure_key(run: Run) -> tuple:
    """Runs that differ only in the number of micro-batches share their stage times."""
    plan = run.plan
    mbs = plan.global_batch // plan.micro_batches
    schedule = "gpipe" if plan.virtual_stages == 1 else plan.schedule  # interleaving keeps its own
    rep = replace(plan, micro_batches=plan.pp, global_batch=mbs * plan.pp, schedule=schedule)
    return run.model, run.cluster, rep


def predict(constants: AnalyticalConstants, runs: Sequence[Run],
            model_class: Callable[..., AnalyticalModel] = AnalyticalModel) -> np.ndarray:
    """Iteration time of each run: plan_cost once per distinct structure, then the pipeline
    formula for each run's micro-batch count (exactly what plan_cost would give).
    ``model_class(cluster, constants=...)`` makes the cost model (an AnalyticalModel)."""
    stages: dict[tuple, tuple] = {}
    models: dict[ClusterSpec, AnalyticalModel] = {}
    out = np.empty(len(runs))
    for i, run in enumerate(runs):
        key = _structure_key(run)
        if key not in stages:
            model = models.setdefault(run.cluster, model_class(run.cluster, constants=constants))
            cost = model.plan_cost(key[0], key[2])
            stages[key] = (cost.stage_time_s, cost.stage_tail_s)
        times, tails = stages[key]
        out[i] = pipeline_time(times, tails, run.plan.micro_batches, run.plan.schedule, run.plan.virtual_stages)
    return out


def fit_compute(runs: Sequence[Run], start: AnalyticalConstants | None = None,
                names: Sequence[str] = tuple(COMPUTE_PARAMS), max_evals: int = 80) -> AnalyticalConstants:
    """Compute constants that best explain the measured iteration times of ``runs``."""
    start = start or AnalyticalConstants()
    measured = np.array([r.measured_s for r in runs])

    def residuals(c: AnalyticalConstants) -> np.ndarray:
        return np.log(predict(c, runs) / measured)

    # max(GPU, host) makes two basins (launch-bound or not): start in each, keep the better.
    starts = [start] + [start.with_values(values) for values in LAUNCH_BOUND_STARTS
                        if set(values) <= set(names)]
    fits = [_fit(list(names), BOUNDS, s, residuals, max_evals) for s in starts]
    return min(fits, key=lambda fit: fit[1])[0]


def _fit_fold(train: Sequence[Run], start: AnalyticalConstants | None, max_evals: int,
              names: Sequence[str]) -> AnalyticalConstants:
    return fit_compute(train, start=start, names=names, max_evals=max_evals)


def fold_indices(count: int, folds: int, seed: int = 0) -> np.ndarray:
    """The fold (0 .. folds-1) of each of ``count`` runs: a seeded random permutation dealt out
    in turn, so fold sizes differ by at most one."""
    order = np.random.default_rng(seed).permutation(count)
    fold_of = np.empty(count, dtype=int)
    fold_of[order] = np.arange(count) % folds
    return fold_of


def cross_validate(runs: Sequence[Run], folds: int = 5, seed: int = 0, start: AnalyticalConstants | None = None,
                   max_evals: int = 80, progress: Callable[[int], None] | None = None, jobs: int = 1,
                   names: Sequence[str] = tuple(COMPUTE_PARAMS)) -> tuple[np.ndarray, list[AnalyticalConstants]]:
    """Held-out predictions: each run predicted by constants ``names`` fitted on the other folds
    (folds = len(runs): leave-one-out; ``jobs`` folds fitted at once in separate processes; same
    result as one at a time)."""
    from concurrent.futures import ProcessPoolExecutor
    fold_of = fold_indices(len(runs), folds, seed)
    trains = [[r for r, f in zip(runs, fold_of) if f != k] for k in range(folds)]
    predicted = np.empty(len(runs))
    with ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else _Inline() as pool:
        futures = [pool.submit(_fit_fold, train, start, max_evals, tuple(names)) for train in trains]
        fitted = []
        for k, future in enumerate(futures):
            fitted.append(future.result())
            test_idx = [i for i, f in enumerate(fold_of) if f == k]
            predicted[test_idx] = predict(fitted[-1], [runs[i] for i in test_idx])
            if progress:
                progress(k)
    return predicted, fitted


class _Inline:
    """ProcessPoolExecutor's submit/result, run in this process when jobs == 1."""

    def __enter__(self) -> "_Inline":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def submit(self, fn, *args):
        from concurrent.futures import Future
        future: Future = Future()
        future.set_result(fn(*args))
        return future


# -- collectives from nccl-tests ----------------------------------------------------------------
def read_nccl_tables(folder: Path) -> list[tuple[int, float, float]]:
    """(gpus, bytes, seconds) rows of a100_allreduce_<p>gpu.csv files (out-of-place column)."""
    import pandas as pd
    rows = []
    for path in sorted(folder.glob("*allreduce_*gpu.csv")):
        gpus = int(path.stem.split("_")[-1].removesuffix("gpu"))
        frame = pd.read_csv(path)
        for size, time_ns in zip(frame.iloc[:, 0], frame.iloc[:, 3]):
            rows.append((gpus, float(size), float(time_ns) * 1e-9))
    if not rows:
        raise SpecError("nccl tables", f"no *allreduce_*gpu.csv files in {folder}")
    return rows


def fit_collectives(cluster: ClusterSpec, rows: Sequence[tuple[int, float, float]],
                    start: AnalyticalConstants | None = None) -> AnalyticalConstants:
    """Collective constants that best explain all-reduce times on groups of the first p ranks."""
    start = start or AnalyticalConstants()
    measured = np.array([t for _, _, t in rows])

    def residuals(c: AnalyticalConstants) -> np.ndarray:
        model = AnalyticalModel(cluster, constants=c)
        pred = [model.collective_time("all_reduce", n, [list(range(p))]) for p, n, _ in rows]
        return np.log(np.array(pred) / measured)

    return _fit(list(COLLECTIVE_PARAMS), COLLECTIVE_PARAMS, start, residuals, max_evals=300)[0]


def errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """MAPE, median and worst absolute percentage error."""
    ape = np.abs(predicted - measured) / measured * 100
    return {"mape": float(ape.mean()), "median": float(np.median(ape)), "worst": float(ape.max())}


# -- recipes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """What one GPU's calibration fits, on which runs, and where it is written."""

    out: str
    """Calibration file it writes, relative to the repository root."""
    data: str
    """Short name of the measurements (the file's ``data``, shown in the calibration status)."""
    runs_label: str
    """The runs fitted, in words."""
    names: tuple[str, ...]
    """Compute constants fitted (bounds in BOUNDS)."""
    runs: Callable[[], list[Run]]
    """The measured runs fitted."""
    fits_collectives: bool
    """Whether collectives are fitted first (on nccl-tests tables) or left at the public defaults."""
    folds: int | None
    """Default cross-validation folds; None: leave-one-out (one fold per run)."""
    transfers_to: dict[str, str] = field(default_factory=dict)
    """GPU families the fit is stated to hold for without being fitted there, with the reason."""


H200_TRANSFER = ("same GH100 compute die, clocks and 700 W as the H100 SXM (more and faster HBM only): "
                 "the one fitted constant, the FP8 GEMM efficiency, is a compute-bound figure")
RECIPES = {
    "dgx-a100-80g": Recipe(out="specs/zoo/calibration/a100.json", data="vtrain", runs_label="vTrain single-node",
                           names=tuple(COMPUTE_PARAMS), runs=lambda: megatron_runs("single"),
                           fits_collectives=True, folds=5),
    "dgx-h100": Recipe(out="specs/zoo/calibration/h100.json", data="nemo-24.07",
                       runs_label="NeMo 24.07 FP8 DGX-H100", names=tuple(FP8_PARAMS), runs=nemo_h100_runs,
                       fits_collectives=False, folds=None,
                       transfers_to={"h200": H200_TRANSFER}),
}
"""Cluster -> its calibration (docs/cost_models.md, Calibration)."""


def _start(recipe: Recipe, cluster: ClusterSpec, nccl: str | None) -> tuple[AnalyticalConstants, dict, dict]:
    """(start constants of the compute fit, values fitted before it, notes): the A100 recipe fits
    collectives first; the H100 one starts from the public defaults (no H100 collective table)."""
    if not recipe.fits_collectives:
        if nccl:
            raise SpecError("--nccl", f"the {cluster.name} recipe fits no collectives")
        return AnalyticalConstants(), {}, {"collectives": "not fitted: public defaults (no H100 nccl-tests table "
                                           "in data/)"}
    rows = read_nccl_tables(Path(nccl) if nccl else data_path(Dataset.NCCL_A100))
    collective = fit_collectives(cluster, rows, AnalyticalConstants())
    values = {n: getattr(collective, n) for n in COLLECTIVE_PARAMS}
    print("collectives:", ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
    notes = {"collectives": f"nccl-tests all-reduce, {len(rows)} rows"}
    return collective.with_values(MEGATRON_SOFTWARE), values, notes


# -- command line ----------------------------------------------------------------------------------
def _parse(argv: Iterable[str] | None) -> argparse.Namespace:
    repo = Path(__file__).resolve().parents[1]
    parser = ArgumentParser(prog="python -m cost_models.calibrate", description=__doc__)
    parser.add_argument("--cluster", default="dgx-a100-80g", choices=sorted(RECIPES),
                        help="zoo cluster whose calibration is fitted (each has its recipe)")
    parser.add_argument("--out", default=None, help="calibration file to write (default: the recipe's, "
                        + ", ".join(f"{k}: {r.out}" for k, r in RECIPES.items()) + ")")
    parser.add_argument("--nccl", default=None, help="folder of nccl-tests *allreduce_*gpu.csv tables "
                        "(A100 recipe; default: data/nccl_a100)")
    parser.add_argument("--max-evals", type=count(10_000), default=80, help="cost evaluations per fit")
    parser.add_argument("--folds", type=count(2000, minimum=0), default=None,
                        help="cross-validation folds for the error band (cv_error_p10/p90); 0 skips it "
                        "(default: the recipe's, 5 for A100, leave-one-out for H100)")
    parser.add_argument("--jobs", type=count(64), default=1, help="folds fitted at once (processes)")
    args = parser.parse_args(argv)
    args.out = args.out or str(repo / RECIPES[args.cluster].out)
    return args


def error_band(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """10th and 90th percentile of (predicted - measured) / measured."""
    rel = predicted / measured - 1
    return {"cv_error_p10": float(np.percentile(rel, 10)), "cv_error_p90": float(np.percentile(rel, 90))}


def _folds(recipe: Recipe, asked: int | None, runs: int) -> int:
    """Folds to cross-validate with: asked, else the recipe's (None there: one per run)."""
    if asked is not None:
        return asked
    return runs if recipe.folds is None else recipe.folds


@one_line_errors()
def main(argv: Iterable[str] | None = None) -> int:
    args = _parse(argv)
    output_file(args.out, "--out")  # before the fits, not after them
    recipe = RECIPES[args.cluster]
    cluster = load_cluster(args.cluster)
    start, values, fitted_on = _start(recipe, cluster, args.nccl)
    runs = recipe.runs()
    measured = np.array([r.measured_s for r in runs])
    fitted = fit_compute(runs, start=start, names=recipe.names, max_evals=args.max_evals)
    values |= {n: getattr(fitted, n) for n in recipe.names}
    print("compute:", ", ".join(f"{k}={getattr(fitted, k):.4g}" for k in recipe.names))
    stats = errors(predict(fitted, runs), measured)
    print(f"in-sample on {len(runs)} {recipe.runs_label} runs: MAPE {stats['mape']:.2f}% "
          f"median {stats['median']:.2f}% worst {stats['worst']:.1f}%")
    fitted_on["compute"] = f"{recipe.runs_label}, {len(runs)} runs, in-sample MAPE {stats['mape']:.2f}%"
    folds = _folds(recipe, args.folds, len(runs))
    if folds:
        cv_pred, _ = cross_validate(runs, folds=folds, start=start, max_evals=args.max_evals, jobs=args.jobs,
                                    names=recipe.names)
        band = error_band(cv_pred, measured)
        values |= band
        cv = errors(cv_pred, measured)
        kind = "leave-one-out" if folds == len(runs) else f"{folds}-fold"
        print(f"{kind} CV: MAPE {cv['mape']:.2f}% worst {cv['worst']:.1f}%; error band p10 "
              f"{band['cv_error_p10']:+.3f}, p90 {band['cv_error_p90']:+.3f}")
        fitted_on["error_band"] = (f"{kind} CV residuals on the {recipe.runs_label} set "
                                   f"(max {args.max_evals} cost evaluations per fold)")
    meta = {"transfers_to": recipe.transfers_to} if recipe.transfers_to else {}
    save_calibration(args.out, values, cluster=args.cluster, gpu=cluster.gpu.name, data=recipe.data,
                     fitted_on=fitted_on, procedure=f"python -m cost_models.calibrate --cluster {args.cluster} "
                     "(docs/cost_models.md)", **meta)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
