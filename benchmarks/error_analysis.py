"""Where a predictor is wrong on the vTrain runs: error grouped by a plan feature, and the worst
runs with the analytical model's breakdown of the predicted iteration (compute, TP comms,
pipeline p2p, bubble, data-parallel tail). Used by ``--by`` of the two accuracy benchmarks.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Mapping, Sequence

import numpy as np

from cost_models.analytical import AnalyticalModel
from cost_models.calibrate import fold_indices, predict

FEATURES: dict[str, Callable] = {
    "tp": lambda r: r.plan.layers[0].tp,
    "pp": lambda r: r.plan.pp,
    "dp": lambda r: r.plan.layers[0].dp,
    "micro-batch": lambda r: r.plan.global_batch // (r.plan.layers[0].dp * r.plan.micro_batches),
    "micro-batches": lambda r: r.plan.micro_batches,
    "size": lambda r: f"h{r.model.layers[0].hidden_size}-L{r.model.num_layers}",
    "tp-crosses-node": lambda r: r.plan.layers[0].tp > r.cluster.gpus_per_node,
}
"""Feature name -> its value for one run (a cost_models.measured_runs.Run)."""


def _sort_key(value) -> tuple:
    return (0, value, "") if isinstance(value, (int, float, bool)) else (1, 0, str(value))


def by_feature_rows(feature: str, runs: Sequence, predicted: np.ndarray) -> list[list]:
    """One row per value of ``feature``: runs, MAPE, mean signed error (+ = predicted too slow), worst."""
    measured = np.array([r.measured_s for r in runs])
    signed = (predicted - measured) / measured * 100
    values = [FEATURES[feature](r) for r in runs]
    rows = []
    for value in sorted(set(values), key=_sort_key):
        idx = [i for i, v in enumerate(values) if v == value]
        err = signed[idx]
        rows.append([value, len(idx), np.abs(err).mean(), err.mean(), np.abs(err).max()])
    return rows


def breakdown(cost_model, run) -> dict[str, float]:
    """The predicted iteration split into parts that add up to it: m x (compute, TP comms, p2p)
    of the slowest stage, the bubble (sum_k T_k - max_k T_k) and the tail max_k D_k."""
    model, plan = run.model, run.plan
    cost = cost_model.plan_cost(model, plan)
    k = int(np.argmax(cost.stage_time_s))
    world = cost_model.cluster.world_size
    layer_ids = list(plan.stage_ranges()[k])
    first = plan.stage_first_rank(k, world)
    vocab, _ = cost_model.vocab_cost(model, plan, k, world)
    compute, tp = vocab.forward_s + vocab.backward_s, vocab.tp_comm_s
    for i in layer_ids:
        lt = cost_model.layer_time(model.layers[i], plan.layers[i], plan.micro_batch_size(i), plan.micro_batches, first)
        compute += lt.forward_s + lt.backward_s
        tp += lt.tp_comm_s
    p2p = cost_model._pipeline_send_s(model, plan, k, layer_ids, world)
    m = plan.micro_batches
    other = cost.stage_time_s[k] - compute - tp - p2p  # relayouts, per-micro-batch DP (none here)
    return {"compute": m * compute, "tp": m * tp, "p2p": m * p2p, "other": m * other,
            "bubble": sum(cost.stage_time_s) - cost.stage_time_s[k], "tail": max(cost.stage_tail_s),
            "total": cost.iteration_time_s}


def worst_rows(runs: Sequence, predicted: np.ndarray, cost_model_for: Callable, count: int = 20) -> list[list]:
    """The ``count`` runs with the largest absolute error, with the breakdown in ms."""
    measured = np.array([r.measured_s for r in runs])
    signed = (predicted - measured) / measured * 100
    rows = []
    for i in np.argsort(-np.abs(signed))[:count]:
        r = runs[i]
        s = r.plan.layers[0]
        b = breakdown(cost_model_for(r.cluster), r)
        mbs = r.plan.global_batch // (s.dp * r.plan.micro_batches)
        rows.append([FEATURES["size"](r), f"tp{s.tp} pp{r.plan.pp} dp{s.dp}", mbs, r.plan.micro_batches,
                     measured[i] * 1e3, predicted[i] * 1e3, signed[i],
                     *(b[n] * 1e3 for n in ("compute", "tp", "p2p", "bubble", "tail"))])
    return rows


def _pp1_lines(runs: Sequence, predicted: np.ndarray, min_layer_counts: int
               ) -> dict[tuple[int, int, int], list[tuple[float, float, float, float]]]:
    """(hidden size, tp, micro-batch size) -> one entry per group of pp-1 runs that differ only
    in their layer count (``min_layer_counts`` counts or more): the least-squares lines of
    measured and of predicted iteration time over layers, divided by the micro-batches, in
    seconds: (measured slope, predicted slope, measured intercept, predicted intercept)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(runs):
        if r.plan.pp == 1:
            s, h = r.plan.layers[0], r.model.layers[0].hidden_size
            key = (h, s.tp, FEATURES["micro-batch"](r), s.dp, r.plan.micro_batches)
            groups.setdefault(key, []).append(i)
    measured = np.array([r.measured_s for r in runs])
    lines: dict[tuple, list[tuple[float, float, float, float]]] = {}
    for key, idx in groups.items():
        layers = np.array([runs[i].model.num_layers for i in idx])
        if len(set(layers)) < min_layer_counts:
            continue
        (ms, mi), (ps, pi) = (np.polyfit(layers, t[idx], 1) / key[4] for t in (measured, predicted))
        lines.setdefault(key[:3], []).append((ms, ps, mi, pi))
    return lines


def layer_slope_rows(runs: Sequence, predicted: np.ndarray) -> list[list]:
    """Time per layer and micro-batch at pp 1, measured against predicted, per (hidden size, tp,
    micro-batch size): within each group of runs that differ only in their layer count (3 or
    more counts), the least-squares line of iteration time over layers, divided by the
    micro-batches. Its slope is a layer's time, its intercept what a micro-batch costs outside
    the layers (embedding, LM head and loss, per-micro-batch overhead; per-iteration costs
    shared out). One row per (hidden, tp, micro-batch) with the groups' median slopes, their
    ratio (predicted / measured), the range of the measured slopes (small: not noise) and the
    median intercepts, in ms."""
    rows = []
    for (h, tp, mbs), fits in sorted(_pp1_lines(runs, predicted, 3).items()):
        ms = np.array(fits) * 1e3
        m, p, mi, pi = np.median(ms, axis=0)
        rows.append([h, tp, mbs, len(fits), m, p, p / m, ms[:, 0].min(), ms[:, 0].max(), mi, pi])
    return rows


@dataclass(frozen=True)
class MeasuredCell:
    """What the pp-1 runs of one (hidden size, tp, micro-batch size) measured, against the model."""

    layer_delta_s: float
    """Measured - predicted time of a Transformer layer and micro-batch: the slopes' difference
    (median over the cell's groups)."""
    rest_delta_s: float
    """Measured - predicted rest of a micro-batch: the intercepts' difference (median over groups)."""


def measured_cells(runs: Sequence, predicted: np.ndarray, min_layer_counts: int = 2
                   ) -> dict[tuple[int, int, int], MeasuredCell]:
    """(hidden size, tp, micro-batch size) -> the cell the pp-1 runs measured (see _pp1_lines)."""
    return {key: MeasuredCell(float(np.median([ms - ps for ms, ps, _, _ in fits])),
                              float(np.median([mi - pi for _, _, mi, pi in fits])))
            for key, fits in _pp1_lines(runs, predicted, min_layer_counts).items()}


class MeasuredLayers(AnalyticalModel):
    """The analytical model with each Transformer layer's forward and the last stage's rest of a
    micro-batch shifted by what the pp-1 runs measured for their (hidden size, tp, micro-batch
    size) (MeasuredCell); cells not measured keep the model's own. Everything else (pipeline
    schedule, bubble, p2p, data-parallel tail) is the model's, so its error on held-out runs is
    the error of the composition alone."""

    def __init__(self, cluster, constants=None, *, cells: Mapping[tuple[int, int, int], MeasuredCell]):
        super().__init__(cluster, constants=constants)
        self.cells = dict(cells)

    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0):
        lt = super().layer_time(layer, strategy, micro_batch_size, micro_batches, first_rank)
        cell = self.cells.get((layer.hidden_size, strategy.tp, micro_batch_size))
        if cell is None:
            return lt
        return replace(lt, forward_s=lt.forward_s + cell.layer_delta_s)

    def vocab_cost(self, model, plan, stage, world_size):
        time, memory = super().vocab_cost(model, plan, stage, world_size)
        if stage != plan.pp - 1:
            return time, memory
        last = len(plan.layers) - 1
        cell = self.cells.get((model.layers[last].hidden_size, plan.layers[last].tp, plan.micro_batch_size(last)))
        if cell is None:
            return time, memory
        return replace(time, forward_s=time.forward_s + cell.rest_delta_s), memory


def composition_check(runs: Sequence, fitted: Sequence, seed: int = 0, min_layer_counts: int = 2) -> np.ndarray:
    """Held-out predictions of the composition alone: per fold of cost_models.calibrate's
    cross-validation (same split, one fold per entry of ``fitted``, that fold's fitted
    constants), the cells measured on the other folds' pp-1 runs, and each held-out run
    predicted by MeasuredLayers with them."""
    fold_of = fold_indices(len(runs), len(fitted), seed)
    out = np.empty(len(runs))
    for k, constants in enumerate(fitted):
        train = [r for r, f in zip(runs, fold_of) if f != k]
        cells = measured_cells(train, predict(constants, train), min_layer_counts)
        test = np.flatnonzero(fold_of == k)
        out[test] = predict(constants, [runs[i] for i in test], partial(MeasuredLayers, cells=cells))
    return out


SLOPE_HEADERS = ["hidden", "tp", "mbs", "groups", "measured ms", "predicted ms", "ratio", "measured min",
                 "measured max", "rest measured ms", "rest predicted ms"]
WORST_HEADERS = ["size", "plan", "mbs", "m", "measured ms", "predicted ms", "error %", "compute ms", "TP ms",
                 "p2p ms", "bubble ms", "tail ms"]
BY_HEADERS = ["value", "runs", "MAPE %", "signed %", "worst %"]


def print_analysis(title: str, features: Sequence[str], runs: Sequence, predicted: np.ndarray,
                   cost_model_for: Callable, worst: int = 20) -> None:
    """Error-by-feature tables, then the worst runs with their breakdown."""
    from tabulate import tabulate
    for feature in features:
        print(f"\n{title}: error by {feature}")
        print(tabulate(by_feature_rows(feature, runs, predicted), headers=[feature] + BY_HEADERS[1:],
                       floatfmt=".2f"))
    slopes = layer_slope_rows(runs, predicted)
    if slopes:
        print(f"\n{title}: ms per layer and micro-batch at pp 1 (slope over the layer counts; median over dp, m),"
              " and the rest of a micro-batch (the intercept)")
        print(tabulate(slopes, headers=SLOPE_HEADERS, floatfmt=".2f"))
    print(f"\n{title}: {worst} worst runs (breakdown by the cost model, ms)")
    print(tabulate(worst_rows(runs, predicted, cost_model_for, worst), headers=WORST_HEADERS, floatfmt=".1f"))


def parse_features(text: str | None) -> list[str]:
    """``--by`` value: comma-separated names of FEATURES, or 'all'."""
    if not text:
        return []
    names = list(FEATURES) if text == "all" else [t.strip() for t in text.split(",")]
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise SystemExit(f"error: --by {','.join(unknown)}: unknown feature; choose from {', '.join(FEATURES)} or all")
    return names
