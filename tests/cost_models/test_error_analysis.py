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
