"""FP8 plans play in the simulator: layer times from the cost model, FP8 ZeRO-3 gathers, memory."""
from __future__ import annotations

import pytest

from cost_models.analytical import AnalyticalModel
from simulator.evaluator import SimulatorEvaluator
from simulator.work import _layer_work
from specs import load_cluster, load_model, uniform_plan


@pytest.fixture(scope="module")
def case():
    model, cluster = load_model("llama3-8b").with_seq_len(2048), load_cluster("dgx-h100")
    plan = uniform_plan(model.num_layers, tp=2, dp=4, global_batch=8, micro_batches=2, dp_type="zero3")
    return model, cluster, plan


def test_an_fp8_plan_simulates_faster_with_the_cost_models_memory(case):
    model, cluster, plan = case
    fp8 = plan.with_precision("fp8-current", bf16_ends=1)
    bf16_run, fp8_run = (SimulatorEvaluator().evaluate(model, cluster, p) for p in (plan, fp8))
    assert fp8_run.iteration_time_s < bf16_run.iteration_time_s
    predicted = AnalyticalModel(cluster).plan_cost(model, fp8)
    assert max(fp8_run.peak_memory_bytes) == pytest.approx(predicted.peak_memory_bytes, rel=1e-6)


def test_zero3_gathers_half_the_bytes_in_fp8(case):
    model, cluster, plan = case
    cm = AnalyticalModel(cluster)
    bf16 = _layer_work(model, plan, cm, 1, 0, False)
    fp8 = _layer_work(model, plan.with_precision("fp8-delayed"), cm, 1, 0, False)
    # 2 B per parameter gathered in BF16, 1 B in FP8; the FP8 transposed copy stays a temporary
    assert fp8.gathered_bytes == pytest.approx(bf16.gathered_bytes / 2)
    assert fp8.parts[0].grad_bytes == bf16.parts[0].grad_bytes
