"""Planning under several cost models at once: time from the chosen one, memory must fit every one."""
from __future__ import annotations

import pytest

import cost_models
import planners
from cost_models.fits_all import FitsAll
from planners import Budget
from specs import LayerStrategy, Plan, SpecError, load_cluster
from specs.datasets import Dataset, data_path

FOLDER = data_path(Dataset.GALVATRON_LLAMA2_7B)
SPACE = planners.SearchSpace(dp_types=("zero2", "zero3"), pp_degrees=(1,), max_micro_batches=8)


@pytest.fixture(scope="module")
def setup():
    cluster = load_cluster("dgx-a100-80g")
    profiled = cost_models.get("profiled", cluster, galvatron_dir=FOLDER, model="llama2-7b")
    galvatron = cost_models.get("galvatron", cluster)
    return cluster, profiled, galvatron


def _plan(setup, gib, **opts):
    cluster, profiled, _ = setup
    return planners.get("galvatron").plan(profiled.model_spec, cluster, Budget(memory_gib=gib, global_batch=64),
                                          profiled, {"space": SPACE, **opts})


def test_plan_fits_every_memory_model_and_keeps_primary_time(setup):
    _, profiled, galvatron = setup
    gib = 24
    both = _plan(setup, gib, memory_models=[galvatron])
    assert both.feasible
    budget = gib * 2**30
    assert max(galvatron.score(both.plan, budget).stage_memory_mb) <= gib * 1024
    cost = profiled.plan_cost(profiled.model_spec, both.plan)
    assert cost.peak_memory_bytes + profiled.allocator_reserve_bytes(budget) <= budget
    assert both.iteration_time_s == pytest.approx(cost.iteration_time_s)  # time is the primary's


def test_a_second_memory_model_can_only_cost_speed(setup):
    alone, both = _plan(setup, 24), _plan(setup, 24, memory_models=[setup[2]])
    assert both.throughput_samples_per_s <= alone.throughput_samples_per_s * (1 + 1e-9)


def test_plans_one_model_cannot_express_do_not_fit(setup):
    _, profiled, galvatron = setup
    fits = FitsAll(profiled, [galvatron], 24 * 2**30)
    ddp = Plan(pp=1, stage_layers=(32,), layers=(LayerStrategy(tp=4, dp=2, dp_type="ddp"),) * 32,
               global_batch=64, micro_batches=4)  # DDP beside ZeRO-2 is not in Galvatron's files
    assert profiled.plan_cost(profiled.model_spec, ddp).peak_memory_bytes < float("inf")
    assert fits.plan_cost(profiled.model_spec, ddp).peak_memory_bytes == float("inf")


def test_memory_models_needs_another_model(setup):
    with pytest.raises(SpecError, match="memory_models"):
        FitsAll(setup[1], [], 2**30)


def test_pipeline_sends_are_the_primarys(setup):
    """Time is the primary's, pipeline sends included (the analytical model's Megatron
    scatter-gather: a 1/tp slice and the receivers' all-gather, not the whole activation)."""
    cluster, profiled, _ = setup
    analytical = cost_models.get("analytical", cluster)
    both = FitsAll(analytical, [profiled], 24 * 2**30)
    layer, strategy = profiled.model_spec.layers[0], LayerStrategy(tp=2, dp=2)
    assert analytical.pipeline_message(layer, strategy, 2).gather_tp == 2
    assert both.pipeline_message(layer, strategy, 2) == analytical.pipeline_message(layer, strategy, 2)
    assert both.pipeline_send_time(layer, strategy, 2, 0, 4, 4) == analytical.pipeline_send_time(layer, strategy, 2, 0, 4, 4)
