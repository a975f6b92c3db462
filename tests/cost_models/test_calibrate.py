"""Calibration: the fits recover constants from data made with known ones; the fast predictor
equals plan_cost; the CLI reports bad input in one line."""

import numpy as np
import pytest

from cost_models.analytical import AnalyticalModel
from cost_models.calibrate import cross_validate, errors, fit_collectives, fit_compute, main, predict
from cost_models.constants import AnalyticalConstants, constants_for, save_calibration
from cost_models.measured_runs import megatron_runs
from specs import load_cluster
from tests.cost_models.synthetic import synthetic_runs



def test_collective_fit_recovers_known_constants():
    cluster = load_cluster("dgx-a100-80g")
    truth = AnalyticalConstants(collective_base_latency_s=30e-6, step_latency_factor=2.0, bus_efficiency=0.6)
    model = AnalyticalModel(cluster, constants=truth)
    rows = [(p, n, model.collective_time("all_reduce", n, [list(range(p))]))
            for p in (2, 4, 8) for n in (2**20, 2**24, 2**28)]
    fitted = fit_collectives(cluster, rows)
    assert fitted.bus_efficiency == pytest.approx(0.6, rel=0.02)
    assert fitted.collective_base_latency_s == pytest.approx(30e-6, rel=0.1)


def test_compute_fit_recovers_data_made_by_the_model():
    truth = AnalyticalConstants(gemm_half_efficiency_flops=4e9, memory_efficiency=0.6, host_time_per_kernel_s=2e-5,
                                micro_batch_overhead_s=5e-4, iteration_overhead_s=3e-3)
    runs = synthetic_runs(truth)
    fitted = fit_compute(runs, names=("gemm_half_efficiency_flops", "memory_efficiency", "iteration_overhead_s"),
                         start=truth.with_values({"gemm_half_efficiency_flops": 1e9, "memory_efficiency": 0.9,
                                                  "iteration_overhead_s": 1e-4}), max_evals=60)
    stats = errors(predict(fitted, runs), np.array([r.measured_s for r in runs]))
    assert stats["mape"] < 0.5
    assert fitted.memory_efficiency == pytest.approx(0.6, rel=0.05)


def test_fast_predictor_equals_plan_cost():
    truth = AnalyticalConstants()
    runs = synthetic_runs(truth)
    fast = predict(truth, runs)
    for run, t in zip(runs, fast):
        slow = AnalyticalModel(run.cluster, constants=truth).plan_cost(run.model, run.plan).iteration_time_s
        assert t == pytest.approx(slow, rel=1e-12)


def test_cross_validation_predicts_every_run_once():
    truth = AnalyticalConstants(memory_efficiency=0.5)
    runs = synthetic_runs(truth)
    predicted, fitted = cross_validate(runs, folds=2, max_evals=8)
    assert len(fitted) == 2 and predicted.shape == (len(runs),) and np.all(predicted > 0)


def test_saved_calibration_is_read_back(tmp_path):
    path = tmp_path / "c.json"
    save_calibration(path, {"memory_efficiency": 0.5}, cluster="x")
    assert constants_for(str(path)).memory_efficiency == 0.5


def test_cli_reports_a_missing_table_folder_in_one_line(tmp_path, capsys):
    code = main(["--nccl", str(tmp_path / "nowhere"), "--out", str(tmp_path / "c.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1


def test_measured_runs_run_through_plan_cost():
    runs = megatron_runs("multi")[:5] + megatron_runs("published")  # published: interleaved, SP, selective
    constants = constants_for(load_cluster("dgx-a100-80g").calibration).with_values({"dp_overlap_fraction": 0.0})
    fast = predict(constants, runs)
    for run, t in zip(runs, fast):
        assert AnalyticalModel(run.cluster, constants=constants).plan_cost(run.model, run.plan).iteration_time_s \
            == pytest.approx(t)
