"""Where a split backward's ZeRO-2/3 reduce-scatter goes: after W, hidden by W's compute alone, on
cases worked out by hand (the simulator plays it so: tests/simulator/test_timelines.py)."""
from dataclasses import replace

import pytest

import cost_models
from cost_models.base import pipeline_time
from cost_models.sequence import sync_groups
from specs import LayerStrategy, load_cluster, load_model, uniform_plan
from specs.schedule_play import StageWork
from tests.simulator.handmade import HandCostModel, hand_cluster, tiny_model


def _hand_model():
    """F 1 s, backward 3 s of which W 1 s; a reduce-scatter of 2.5 s per micro-batch that the
    3 s backward hides (0 exposed) but the 1 s W leaves 1.5 s of."""
    cluster = hand_cluster(2)
    cm = HandCostModel(cluster, forward_s=1.0, backward_s=3.0, weight_grad_s=1.0)
    cm.t = replace(cm.t, reduce_scatter_exposed_s=0.0, reduce_scatter_after_w_s=1.5)
    return cm


def test_split_backward_charges_the_reduce_scatter_behind_w():
    """ZB-V on pp 2, v 2, 8 layers: chunks of 2 layers, 4 layers and 2 chunks a stage. The
    reduce-scatter after a chunk's second layer's W (the first W played) has the first layer's W
    to hide behind: 1.5 s exposed, twice a stage. The chunk's first layer's runs on beside the
    passes that follow (as in a whole backward): nothing. T = 4 x (1 + 3) + 2 x 1.5 = 19 s; W's
    share 4 x 1 + 2 x 1.5 = 7 s; F and B share the rest, 12 s, as forward 4 s and input
    gradient 4 x (3 - 1) = 8 s do: F 4, B 8. Sends and vocabulary cost nothing here."""
    cm, model = _hand_model(), tiny_model(8)
    plan = uniform_plan(8, pp=2, global_batch=4, micro_batches=4, schedule="zbv", virtual_stages=2)
    cost = cm.plan_cost(model, plan)
    assert cost.stage_time_s == pytest.approx((19.0, 19.0))
    want = pipeline_time((19.0, 19.0), (0.0, 0.0), 4, "zbv", 2, [StageWork(4.0, 8.0, 7.0)] * 2)
    assert cost.iteration_time_s == pytest.approx(want)


def test_whole_backward_keeps_the_backward_window():
    """Interleaved 1F1B on the same layers: the 3 s backward hides every reduce-scatter,
    T = 4 x (1 + 3) = 16 s a stage (the per-layer sum the planners add up)."""
    cm, model = _hand_model(), tiny_model(8)
    plan = uniform_plan(8, pp=2, global_batch=4, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=2)
    assert cm.plan_cost(model, plan).stage_time_s == pytest.approx((16.0, 16.0))


def test_analytical_reduce_scatter_windows():
    """DeepSeek-V3's MoE layer at tp 4, dp 32 (ZeRO-2), full recompute, 15 samples on dgx-h100:256
    (the schedules benchmark's pp 16 plans): its gradient reduce-scatter (R, about 58 ms) beside
    a 128 ms backward and a 25 ms W, Galvatron's overlap with gamma g = 1.1256:
    behind the backward (g - 1) R = 7.3 ms; behind W alone (R - W) + (g - 1) W = 36.6 ms."""
    cluster = load_cluster("dgx-h100:256")
    cm = cost_models.get("analytical", cluster)
    layer = load_model("deepseek-v3").layers[3]
    s = LayerStrategy(tp=4, dp=32, dp_type="zero2", recompute="full", sp="megatron")
    lt = cm.layer_time(layer, s, 15, 32)
    g = cm.constants.overlap_coefficient
    rs_s = cm.dp_traffic(*_expert_free_sync(layer, s)).micro_batch_bwd_s
    assert g == pytest.approx(1.1256)
    assert rs_s == pytest.approx(0.0583, abs=5e-4)
    assert lt.backward_s == pytest.approx(0.1275, abs=5e-4) and lt.weight_grad_s == pytest.approx(0.0248, abs=5e-4)
    assert lt.reduce_scatter_exposed_s == pytest.approx((g - 1) * rs_s)
    assert lt.reduce_scatter_after_w_s == pytest.approx(rs_s - lt.weight_grad_s + (g - 1) * lt.weight_grad_s)
    assert lt.reduce_scatter_after_w_s == pytest.approx(0.0366, abs=5e-4)


def _expert_free_sync(layer, s):
    """(local parameters, dp type, dp groups) of a layer whose experts are not split: all of it
    over dp."""
    return layer.param_count() / s.tp, s.dp_type, sync_groups(0, s)[1]
