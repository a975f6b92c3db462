"""The profiled model's corrections from issue 14 (docs/cost_models.md, per difference)."""
from __future__ import annotations

import pytest

import cost_models
from cost_models.galvatron_profile import linear_fit
from specs import LayerStrategy, load_cluster, uniform_plan
from specs.datasets import Dataset, data_path


@pytest.fixture(scope="module")
def cm():
    return cost_models.get("profiled", load_cluster("dgx-a100-80g"),
                           galvatron_dir=data_path(Dataset.GALVATRON_LLAMA2_7B), model="llama2-7b")


def test_fit_intercept_is_not_divided_by_tp(cm):
    layer = cm.model_spec.layers[0]
    slope, intercept = linear_fit(cm.profile.layer(layer).forward_ms)
    t = cm.layer_time(layer, LayerStrategy(tp=4, dp=2), 2, 1)
    assert t.forward_s == pytest.approx((slope * 2 / 4 + intercept) * 1e-3)


def test_zero3_traffic_is_charged_every_micro_batch(cm):
    layer = cm.model_spec.layers[0]
    z3, ddp = LayerStrategy(tp=1, dp=8, dp_type="zero3"), LayerStrategy(tp=1, dp=8)
    assert cm.layer_time(layer, z3, 1, 16).exposed_micro_batch_dp_s > 0
    assert cm.layer_time(layer, ddp, 1, 16).exposed_micro_batch_dp_s == 0
    assert cm.layer_time(layer, z3, 1, 16).dp_comm_s > cm.layer_time(layer, z3, 1, 2).dp_comm_s


def test_checkpointed_input_is_split_by_tp_under_sequence_parallel_profiles(cm):
    layer = cm.model_spec.layers[0]
    one = cm.layer_memory(layer, LayerStrategy(tp=1, dp=8, recompute="full"), 1, 1).activations_bytes
    four = cm.layer_memory(layer, LayerStrategy(tp=4, dp=2, recompute="full"), 1, 1).activations_bytes
    assert four == pytest.approx(one / 4)


def test_embedding_and_head_states_follow_the_layers_dp_type(cm):
    model = cm.model_spec
    ddp = uniform_plan(model.num_layers, tp=1, dp=8, pp=1, global_batch=8, micro_batches=1)
    z3 = uniform_plan(model.num_layers, tp=1, dp=8, pp=1, global_batch=8, micro_batches=1, dp_type="zero3")
    states = [cm.vocab_cost(model, p, 0, 8)[1].parameters_bytes for p in (ddp, z3)]
    assert states[1] == pytest.approx(states[0] / 8)
