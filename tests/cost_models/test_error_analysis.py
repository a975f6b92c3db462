"""The benchmarks' error analysis: grouping by a plan feature, and a breakdown that adds up."""
import numpy as np
import pytest

from benchmarks import error_analysis as ea
from cost_models.analytical import AnalyticalModel
from cost_models.calibrate import Run
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
