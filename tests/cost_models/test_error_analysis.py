"""The benchmarks' error analysis: grouping by a plan feature, a breakdown that adds up, the
per-cell slopes and the composition check."""
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from benchmarks import error_analysis as ea
from cost_models.analytical import AnalyticalModel
from cost_models.calibrate import Run, predict
from cost_models.constants import AnalyticalConstants
from specs import load_cluster, load_model, uniform_plan


def _run(tp: int, pp: int, measured_s: float) -> Run:
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-a100-80g:1")
    dp = cluster.world_size // (tp * pp)
    plan = uniform_plan(model.num_layers, tp=tp, dp=dp, pp=pp, global_batch=8 * dp, micro_batches=4)
    return Run(model=model, cluster=cluster, plan=plan, measured_s=measured_s)


def test_error_by_feature_groups_and_signs():
    runs = [_run(2, 1, 1.0), _run(2, 2, 2.0), _run(4, 1, 1.0)]
    rows = ea.by_feature_rows("tp", runs, np.array([1.1, 1.8, 0.5]))
    assert [r[0] for r in rows] == [2, 4]
    value, count, mape, signed, worst = rows[0]
    assert count == 2 and mape == pytest.approx(10.0) and signed == pytest.approx(0.0) and worst == pytest.approx(10.0)
    assert rows[1][3] == pytest.approx(-50.0)


def test_breakdown_adds_up_to_the_prediction():
    run = _run(2, 2, 1.0)
    b = ea.breakdown(AnalyticalModel(run.cluster), run)
    parts = b["compute"] + b["tp"] + b["p2p"] + b["other"] + b["bubble"] + b["tail"]
    assert parts == pytest.approx(b["total"])
    assert b["tp"] > 0 and b["p2p"] > 0 and b["bubble"] > 0


def test_unknown_feature_is_a_one_line_error():
    with pytest.raises(SystemExit, match="unknown feature"):
        ea.parse_features("tp,colour")


def _layered(layers: int, mbs: int, dp: int, measured_s: float) -> Run:
    model = load_model("tiny-gpt").scaled(num_layers=layers)
    plan = uniform_plan(layers, tp=1, dp=dp, pp=1, global_batch=mbs * dp * 2, micro_batches=2)
    return Run(model=model, cluster=load_cluster(f"dgx-a100-80g:{dp}"), plan=plan, measured_s=measured_s)


def test_layer_slope_is_time_per_layer_and_micro_batch_over_runs_differing_only_in_layers():
    # measured 0.1 s + 6 ms per layer (2 micro-batches: 3 ms per layer and micro-batch);
    # predicted 4 ms per layer; a pp 2 run and a 2-layer-count group are left out
    runs, predicted = [], []
    for dp in (1, 2):
        for layers in (2, 4, 6):
            runs.append(_layered(layers, 2, dp, 0.1 + 0.006 * layers + 0.001 * dp))
            predicted.append(0.05 + 0.004 * layers)
    runs += [_layered(2, 4, 1, 1.0), _layered(4, 4, 1, 2.0)]
    predicted += [1.0, 2.0]
    rows = ea.layer_slope_rows(runs, np.array(predicted))
    assert len(rows) == 1
    hidden, tp, mbs, groups, measured_ms, predicted_ms, ratio, lo, hi, rest_measured, rest_predicted = rows[0]
    assert (tp, mbs, groups) == (1, 2, 2)
    assert measured_ms == pytest.approx(3.0) and predicted_ms == pytest.approx(2.0)
    assert ratio == pytest.approx(2 / 3) and lo == pytest.approx(3.0) and hi == pytest.approx(3.0)
    # intercepts 0.101 / 0.102 s (median 0.1015) and 0.05 s, over 2 micro-batches
    assert rest_measured == pytest.approx(50.75) and rest_predicted == pytest.approx(25.0)


def _cell_runs(pp: int, layers_dp: list[tuple[int, int]], m: int = 4) -> list[Run]:
    """tiny-gpt runs at tp 1, micro-batch 2, of the layer counts and dp given, on pp x dp GPUs."""
    runs = []
    for layers, dp in layers_dp:
        model = load_model("tiny-gpt").scaled(num_layers=layers)
        plan = uniform_plan(layers, tp=1, dp=dp, pp=pp, global_batch=2 * dp * m, micro_batches=m)
        cluster = replace(load_cluster("dgx-a100-80g"), gpus_per_node=pp * dp)  # one node of pp x dp GPUs
        runs.append(Run(model=model, cluster=cluster, plan=plan, measured_s=0.0))
    return runs


def _measured(runs: list[Run], cells: dict) -> list[Run]:
    """The runs with the times MeasuredLayers gives them under ``cells``."""
    times = predict(AnalyticalConstants(), runs, partial(ea.MeasuredLayers, cells=cells))
    return [Run(r.model, r.cluster, r.plan, t) for r, t in zip(runs, times)]


def test_measured_layers_shifts_a_pp1_iteration_by_m_times_layers_and_rest():
    # pp 1, 6 layers, 4 micro-batches: + 4 x (6 x 1 ms + 3 ms) = 36 ms; another cell: no change
    run = _cell_runs(1, [(6, 1)])[0]
    h = run.model.layers[0].hidden_size
    shift = ea.MeasuredCell(1e-3, 3e-3)
    shifted, other = (predict(AnalyticalConstants(), [run], partial(ea.MeasuredLayers, cells={cell: shift}))
                      for cell in ((h, 1, 2), (h, 2, 2)))
    plain = predict(AnalyticalConstants(), [run])
    assert shifted[0] - plain[0] == pytest.approx(0.036, rel=1e-9) and other[0] == plain[0]


def test_measured_layers_puts_the_rest_of_a_micro_batch_on_the_last_stage_only():
    run = _cell_runs(2, [(4, 1)])[0]
    h = run.model.layers[0].hidden_size
    model = ea.MeasuredLayers(run.cluster, cells={(h, 1, 2): ea.MeasuredCell(1e-3, 3e-3)})
    plain = AnalyticalModel(run.cluster)
    first, last = (model.vocab_cost(run.model, run.plan, k, 2)[0].forward_s
                   - plain.vocab_cost(run.model, run.plan, k, 2)[0].forward_s for k in (0, 1))
    assert first == 0.0 and last == pytest.approx(3e-3, rel=1e-9)


def test_measured_cells_recover_the_shift_from_runs_differing_in_layers():
    runs = _cell_runs(1, [(n, dp) for n in (2, 4, 6) for dp in (1, 2)]) + _cell_runs(1, [(3, 1)])  # lone count: left out
    h = runs[0].model.layers[0].hidden_size
    measured = _measured(runs, {(h, 1, 2): ea.MeasuredCell(0.7e-3, -0.4e-3)})
    cells = ea.measured_cells(measured, predict(AnalyticalConstants(), runs))
    assert list(cells) == [(h, 1, 2)]
    assert cells[(h, 1, 2)].layer_delta_s == pytest.approx(0.7e-3, rel=1e-6)
    assert cells[(h, 1, 2)].rest_delta_s == pytest.approx(-0.4e-3, rel=1e-6)


def test_composition_check_predicts_held_out_pipelines_from_pp1_cells():
    # measured = the model's composition with shifted layers: held-out pp 2 runs are predicted
    # exactly once the other folds' pp 1 runs have measured the shift; without it they are not
    pp1 = _cell_runs(1, [(n, dp) for n in (2, 4, 6, 8, 10, 12) for dp in (1, 2)])
    pp2 = _cell_runs(2, [(n, 1) for n in (4, 8, 12)])
    h = pp1[0].model.layers[0].hidden_size
    runs = _measured(pp1 + pp2, {(h, 1, 2): ea.MeasuredCell(2e-3, 1e-3)})
    measured = np.array([r.measured_s for r in runs])
    composed = ea.composition_check(runs, [AnalyticalConstants()] * 3)
    assert composed == pytest.approx(measured, rel=1e-6)
    assert not predict(AnalyticalConstants(), runs[-3:]) == pytest.approx(measured[-3:], rel=1e-2)
