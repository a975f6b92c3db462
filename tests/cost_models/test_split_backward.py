"""The split backward's W (weight-gradient) time in the cost models, and the zero-bubble and
V-shaped schedules in plan_cost, on cases worked out by hand."""
import pytest

import cost_models
from cost_models.ops import backward_ops, forward_ops, is_weight_gradient
from cost_models.profiled import WEIGHT_GRAD_SHARE, ProfiledModel
from specs import LayerStrategy, load_cluster, load_model, uniform_plan
from tests.cost_models.test_profiled import _profile_for


def test_analytical_w_is_the_weight_gradient_gemms():
    """Each GEMM's backward is an input-gradient and a weight-gradient GEMM of its own FLOPs and
    bytes, so W is the forward's GEMMs again; B (the rest of backward_s) holds the other half
    and the attention and element-wise backwards. gpt3-175b layer at tp 8, 1 sample, no
    recompute: large kernels, not launch-bound."""
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    layer, s = load_model("gpt3-175b").layers[0], LayerStrategy(tp=8)
    lt = cm.layer_time(layer, s, 1, 1)
    gemms = [op for op in forward_ops(layer, 8, 1) if op.flops and op.backward_flops_factor == 2.0]
    assert lt.weight_grad_s == pytest.approx(sum(map(cm.op_time, gemms)))
    assert [op.name for op in backward_ops(gemms) if is_weight_gradient(op)] == [op.name + "_wgrad" for op in gemms]
    assert lt.weight_grad_s < lt.backward_s - lt.weight_grad_s  # B also has attention and element-wise work
    # full recompute adds the forward to B, not to W
    ckpt = cm.layer_time(layer, LayerStrategy(tp=8, recompute="full"), 1, 1)
    assert ckpt.weight_grad_s == pytest.approx(lt.weight_grad_s)


def test_profiled_w_is_the_stated_share_of_the_backward():
    """The profile times the backward whole: W = 0.5 of it (recompute excluded)."""
    layer = load_model("tiny-gpt").layers[0]
    cm = ProfiledModel(load_cluster("cpu-2"), profile=_profile_for(layer))
    lt = cm.layer_time(layer, LayerStrategy(), 2, 1)
    assert WEIGHT_GRAD_SHARE == 0.5
    assert lt.weight_grad_s == pytest.approx(0.5 * lt.backward_s)
    ckpt = cm.layer_time(layer, LayerStrategy(recompute="full"), 2, 1)
    assert ckpt.weight_grad_s == pytest.approx(lt.weight_grad_s)


def test_zero_bubble_shrinks_the_bubble_and_keeps_1f1b_memory_of_stage_0():
    """gpt3-175b on 8 near-even stages, m 16: ZB-H1 leaves (pp - 1)(F + B - W) of 1F1B's
    (pp - 1)(F + B + W) idle, so it saves 2 (pp - 1) W (the paper's count; W from the analytical
    model's weight-gradient GEMMs, a middle stage's); every stage holds pp = 8 micro-batches
    (stage 0 under 1F1B does too; its head's logits aside, stage 7 would hold 1)."""
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g:8"))
    model = load_model("gpt3-175b")
    kw = dict(tp=8, pp=8, global_batch=16, micro_batches=16, recompute="full")
    one, zb = uniform_plan(96, **kw), uniform_plan(96, schedule="zb_h1", **kw)
    c1, cz = cm.plan_cost(model, one), cm.plan_cost(model, zb)
    assert c1.stage_time_s == cz.stage_time_s
    middle = zb.stage_ranges()[3]
    weight_s = sum(cm.layer_time(model.layers[i], zb.layers[i], 1, 16).weight_grad_s for i in middle)
    assert 0.1 < weight_s / c1.stage_time_s[3] < 1 / 3  # recompute puts a forward into B
    assert c1.iteration_time_s - cz.iteration_time_s == pytest.approx(2 * 7 * weight_s, rel=0.015)
    # stage 0 (F0-F7, B0: 8 held, 1 past B) holds 1F1B's 8 and nothing for W: the pipeline's
    # first chunk runs its whole backward at W (its input, the tokens, needs no gradient)
    assert cz.stage_memory[0].activations_bytes == pytest.approx(c1.stage_memory[0].activations_bytes)
    # stage 4: 1F1B holds pp - 4 = 4 micro-batches; ZB-H1 8, 5 of them past B (F0-F3, F4 B0 ... F7 B4)
    kept = sum(cm.weight_wait_bytes(model.layers[i], zb.layers[i], 1) for i in zb.stage_ranges()[4])
    assert cz.stage_memory[4].activations_bytes == pytest.approx(2 * c1.stage_memory[4].activations_bytes
                                                                 + 5 * kept)


def test_split_backward_charges_what_b_keeps_for_w():
    """tiny-gpt (h 128, s 64, q = kv = h, f = 4 h, 4 layers) on 4 stages of one layer, ZB-H1, m 8,
    1 sample a micro-batch, tp 1. What B keeps for W, per micro-batch of a layer: the gradients
    of the norms' outputs (2 h), QKV's (3 h), the projection's (h), FC1's (4 h) and FC2's (h),
    11 h a token, 16-bit: 2 x 64 x 11 x 128 = 180,224 bytes. Stage 2 runs F0 F1 B0 F2 B1 F3 B2
    W0 ...: after B2 it holds 4 micro-batches' activations, 3 of them past B; no later point
    holds more of either, so it charges 4 A + 3 x 180,224 (before: 4 A). 1F1B charges none."""
    cm = cost_models.get("analytical", load_cluster("cpu-4"))
    model = load_model("tiny-gpt")
    layer = model.layers[2]
    assert cm.weight_wait_bytes(layer, LayerStrategy(), 1) == 180_224
    kw = dict(pp=4, global_batch=8, micro_batches=8)
    zb, one = uniform_plan(4, schedule="zb_h1", **kw), uniform_plan(4, **kw)
    activations = cm.layer_memory(layer, zb.layers[2], 1, 1).activations_bytes
    assert cm.plan_cost(model, zb).stage_memory[2].activations_bytes == pytest.approx(4 * activations + 3 * 180_224)
    assert cm.plan_cost(model, one).stage_memory[2].activations_bytes == pytest.approx(2 * activations)
