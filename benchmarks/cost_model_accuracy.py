"""How close the cost models' iteration times are to measured A100 runs.

``python -m benchmarks.cost_model_accuracy``: the analytical model with public-figure
defaults, and calibrated by 5-fold cross-validation on vTrain's single-node set (each run
predicted by constants fitted on the other folds); vTrain's multi-node set and Megatron-LM's
published runs (sequence parallelism, selective recomputation, interleaving) are never fitted,
only predicted (by constants fitted on all single-node runs). Prints MAPE, median, worst, per
set and model size, Kendall's tau between predicted and measured times, and each published run.
"""
from __future__ import annotations

import argparse
import sys
import time
import numpy as np

from benchmarks import error_analysis
from cost_models.measured_runs import MEGATRON_SOFTWARE, megatron_runs
from specs.datasets import Dataset, data_path
from specs.errors import one_line_errors

TABLE_HEADERS = ["model / set", "size", "runs", "MAPE %", "median %", "worst %", "Kendall tau"]


def _table(name: str, runs: list, predicted: np.ndarray) -> list[list]:
    """One row for the whole set, then one per model size."""
    from scipy.stats import kendalltau

    from cost_models.calibrate import errors
    measured = np.array([r.measured_s for r in runs])
    keys = [f"h{r.model.layers[0].hidden_size}-L{r.model.num_layers}" for r in runs]
    rows = []
    for key in ["all"] + sorted(set(keys), key=lambda k: (int(k[1:].split("-")[0]), k)):
        idx = [i for i, k in enumerate(keys) if key in ("all", k)]
        stats = errors(predicted[idx], measured[idx])
        tau = kendalltau(predicted[idx], measured[idx]).statistic if len(idx) > 2 else float("nan")
        rows.append([name, key, len(idx), stats["mape"], stats["median"], stats["worst"], tau])
    return rows


GALVATRON_MEMORY_DP_TYPE = "zero3"
"""Galvatron profiles layer memory under sharded data parallelism: its per-layer model states
(388 MiB at tp 1, dp 8 for 202M parameters) are 16 bytes / (tp * dp) per parameter."""


def galvatron_memory_rows() -> list[list]:
    """Per-layer model states and activations that Galvatron measured for LLaMA-2 7B
    (memory_profiling_bf16_llama2-7b_all.json: 2-layer minus 1-layer runs, global batch 8,
    sequence parallel) against the analytical formulas of the same strategy."""
    import json

    from cost_models.memory import layer_memory
    from specs import LayerStrategy, load_model
    raw = json.loads((data_path(Dataset.GALVATRON_LLAMA2_7B) / "memory_profiling_bf16_llama2-7b_all.json").read_text())
    layer = load_model("llama2-7b").with_seq_len(2048).with_attention("eager").layers[0]  # as profiled
    rows = []
    for key, table in raw.items():
        parts = key.split("_")
        if not parts[0].isdigit() or parts[0] != "1" or "vtp" in parts:
            continue
        tp, dp = int(parts[1]), int(parts[2])
        mib = 2**20
        states = table["layernum[2]_bsz8_seq2048_rank0_ms"] - table["layernum[1]_bsz8_seq2048_rank0_ms"]
        act = table["layernum[2]_bsz8_seq2048_rank0_act"] - table["layernum[1]_bsz8_seq2048_rank0_act"]
        checkpoint = "c" in parts
        strategy = LayerStrategy(tp=tp, dp=dp, dp_type=GALVATRON_MEMORY_DP_TYPE if dp > 1 else "ddp", sp="megatron",
                                 recompute="full" if checkpoint else "none")
        predicted = layer_memory(layer, strategy, 8 // dp, 1)
        rows.append([f"tp{tp} dp{dp}" + (" ckpt" if checkpoint else ""), states, predicted.states_bytes / mib, act, predicted.activations_bytes / mib])
    return rows


def capacity_rows(sets: dict[str, list], start, max_evals: int) -> list[list]:
    """A diagnostic of the model form, not a calibration: the compute constants fitted in-sample
    on the multi-node set, and on both vTrain sets, each scored on every set (MAPE, worst)."""
    from cost_models.calibrate import errors, fit_compute, predict
    rows = []
    for trained_on in ("multi", "single + multi"):
        fitted = fit_compute([r for name in trained_on.split(" + ") for r in sets[name]], start=start,
                             max_evals=max_evals)
        row = [trained_on]
        for runs in sets.values():
            stats = errors(predict(fitted, runs), np.array([r.measured_s for r in runs]))
            row += [stats["mape"], stats["worst"]]
        rows.append(row + [fitted.iteration_overhead_s, fitted.host_time_per_kernel_s * 1e6])
    return rows


def published_rows(runs: list, predicted: np.ndarray) -> list[list]:
    """One row per run: what it ran, measured and predicted seconds, signed error."""
    rows = []
    for run, pred in zip(runs, predicted):
        s, plan = run.plan.layers[0], run.plan
        rows.append([run.model_key, run.cluster.world_size, f"{s.tp} {plan.pp} {plan.virtual_stages}",
                     f"{s.recompute} / {s.sp}", run.measured_s, pred, (pred / run.measured_s - 1) * 100])
    return rows


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate

    from cost_models.calibrate import cross_validate, predict
    from cost_models.constants import AnalyticalConstants, constants_for
    from specs import load_cluster
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cost_model_accuracy", description=__doc__)
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds on the single-node set")
    parser.add_argument("--max-evals", type=int, default=80, help="cost evaluations per fit")
    parser.add_argument("--jobs", type=int, default=1, help="cross-validation folds fitted at once (processes)")
    parser.add_argument("--capacity", action="store_true",
                        help="also fit the compute constants in-sample on the multi-node set, and on both vTrain "
                             "sets, and print what each fit scores on every set: what any constants of this "
                             "model form can reach (a diagnostic; a100.json is never fitted this way)")
    parser.add_argument("--by", default=None, help="also print the error grouped by these features "
                        f"(comma-separated: {', '.join(error_analysis.FEATURES)}; or all) and the 20 worst runs")
    args = parser.parse_args(argv)
    features = error_analysis.parse_features(args.by)
    start = time.time()
    single, multi, published = megatron_runs("single"), megatron_runs("multi"), megatron_runs("published")
    defaults = AnalyticalConstants().with_values(MEGATRON_SOFTWARE)
    calibration = load_cluster("dgx-a100-80g").calibration
    calibrated = constants_for(calibration).with_values(MEGATRON_SOFTWARE)
    print(f"{len(single)} single-node, {len(multi)} multi-node and {len(published)} published runs; "
          f"calibration file {calibration}")
    cv_pred, fitted = cross_validate(single, folds=args.folds, start=calibrated.with_values(
        {k: getattr(defaults, k) for k in ("gemm_half_efficiency_flops", "memory_efficiency", "kernel_overhead_s",
                                           "host_time_per_kernel_s", "micro_batch_overhead_s",
                                           "iteration_overhead_s")}),
        max_evals=args.max_evals, jobs=args.jobs, progress=lambda k: print(f"  fold {k + 1}/{args.folds} fitted "
                                                           f"({time.time() - start:.0f} s)", flush=True))
    multi_pred, published_pred = predict(calibrated, multi), predict(calibrated, published)
    rows = (_table("analytical, public defaults / single", single, predict(defaults, single))
            + _table(f"analytical, {args.folds}-fold CV / single", single, cv_pred)
            + _table("analytical, public defaults / multi", multi, predict(defaults, multi))
            + _table("analytical, a100.json (fit on single) / multi", multi, multi_pred)
            + _table("analytical, public defaults / published", published, predict(defaults, published))
            + _table("analytical, a100.json (fit on single) / published", published, published_pred))
    print(tabulate(rows, headers=TABLE_HEADERS, floatfmt=".2f"))
    print("\nMegatron-LM's published runs (data/megatron_a100), a100.json")
    print(tabulate(published_rows(published, published_pred),
                   headers=["size", "GPUs", "tp pp v", "recompute / sp", "measured s", "predicted s", "error %"],
                   floatfmt=".2f"))
    print("\nLLaMA-2 7B, one layer, MiB per GPU: Galvatron's measurement vs the analytical formulas")
    print(tabulate(galvatron_memory_rows(), headers=["strategy", "states measured", "states formula",
                                                    "activations measured", "activations formula"],
                   floatfmt=".1f"))
    composed = error_analysis.composition_check(single, fitted)
    print(f"\nThe composition alone ({args.folds}-fold, error_analysis.composition_check): each layer's time and the "
          "rest of a micro-batch as the other folds' pp-1 runs measured them; pipeline, bubble and tails the model's")
    print(tabulate(_table("layers measured at pp 1 / single", single, composed)[:1], headers=TABLE_HEADERS,
                   floatfmt=".2f"))
    print(tabulate(error_analysis.by_feature_rows("pp", single, composed),
                   headers=["pp"] + error_analysis.BY_HEADERS[1:], floatfmt=".2f"))
    band = np.percentile(cv_pred / np.array([r.measured_s for r in single]) - 1, [10, 90])
    print(f"CV error band (p10, p90 of predicted/measured - 1): {band[0]:+.4f}, {band[1]:+.4f}")
    spread = {n: (min(getattr(f, n) for f in fitted), max(getattr(f, n) for f in fitted))
              for n in ("gemm_half_efficiency_flops", "host_time_per_kernel_s", "micro_batch_overhead_s")}
    print("fold constants (min, max):", ", ".join(f"{k} {lo:.3g}..{hi:.3g}" for k, (lo, hi) in spread.items()))
    if args.capacity:
        print("\nCapacity of the model form (in-sample fits on the set named; diagnostic only, never shipped)")
        print(tabulate(capacity_rows({"single": single, "multi": multi, "published": published}, calibrated,
                                     args.max_evals),
                       headers=["fitted on", "single MAPE %", "worst %", "multi MAPE %", "worst %",
                                "published MAPE %", "worst %", "per-iteration overhead s", "host us/kernel"],
                       floatfmt=".2f"))
    if features:
        from cost_models.analytical import AnalyticalModel
        models: dict = {}
        model_for = lambda cluster: models.setdefault(cluster, AnalyticalModel(cluster, constants=calibrated))
        error_analysis.print_analysis(f"single, {args.folds}-fold CV", features, single, cv_pred, model_for)
        error_analysis.print_analysis("multi, a100.json", features, multi, multi_pred, model_for)
    print(f"total {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
