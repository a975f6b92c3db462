"""TP communication overlap in the analytical model: each Megatron-SP collective beside its GEMM
exposes max(0, C - G (tp - 1) / tp), and a plan without the overlap costs what it did."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
from cost_models import fp8
from cost_models.ops import backward_ops, forward_ops
from cost_models.tp_overlap import OverlapPair, overlap_pairs
from cost_models.sequence import tp_message_bytes
from specs import SpecError, load_cluster, load_model, uniform_plan


def test_a_pair_hides_what_all_but_one_chunk_of_its_gemm_covers():
    # tp 4: three of the four GEMM chunks run beside the transfer
    pairs = overlap_pairs([(4.0, 8.0), (0.0, 0.0), (2.0, 2.0), (1.0, 1.0)], {"all_gather": 2.0, "reduce_scatter": 1.0},
                          tp=4, recomputes_forward=False)
    assert pairs == (OverlapPair("F", "all_gather", 2.0, 3.0, 4.0, True), OverlapPair("F", "all_gather", 2.0, 1.5, 2.0, True),
                     OverlapPair("F", "reduce_scatter", 1.0, 0.75, 1.0, True),
                     OverlapPair("B", "reduce_scatter", 1.0, 6.0, 8.0, False),
                     OverlapPair("B", "reduce_scatter", 1.0, 1.5, 2.0, False),
                     OverlapPair("B", "all_gather", 2.0, 0.75, 1.0, False))
    # exposed: max(0, C - G (n - 1) / n): 0, 0.5, 0.25 in forward
    assert [p.comm_s - p.hidden_s for p in pairs[:3]] == [0.0, 0.5, 0.25]
    # a full recompute plays the forward's pairs again in backward
    again = overlap_pairs([(4.0, 8.0)] * 4, {"all_gather": 2.0, "reduce_scatter": 1.0}, tp=4, recomputes_forward=True)
    assert [p.phase for p in again].count("B") == 8


@pytest.fixture(scope="module")
def setup():
    cluster = load_cluster("dgx-h100")
    model = load_model("llama3-70b").scaled(num_layers=4)
    cm = cost_models.get("analytical", cluster)
    plan = uniform_plan(4, tp=8, global_batch=8, micro_batches=8, sp="megatron", stack="megatron-te",
                        precision="fp8-current")
    return cluster, model, cm, plan


def test_the_pairs_are_the_layers_gemms_and_collectives_worked_out_by_hand(setup):
    cluster, model, cm, plan = setup
    layer, s = model.layers[0], plan.layers[0]
    lt = cm.layer_time(layer, s, 1, plan.micro_batches)
    comm = {k: cm.collective_time(k, tp_message_bytes(layer, 1), [tuple(range(8))])
            for k in ("all_gather", "reduce_scatter")}
    # the forward's all-gathers move the FP8 copy of the block's input: 1 B an element of 2
    fwd_comm = comm | {"all_gather": cm.collective_time("all_gather", tp_message_bytes(layer, 1) / 2,
                                                        [tuple(range(8))])}
    bf16 = forward_ops(layer, 8, 1)
    fwd = {op.name: cm.op_time(op) for op in fp8.forward_ops(bf16, s.precision)}
    bwd = {op.name: cm.op_time(op) for op in fp8.backward_ops(backward_ops(bf16), s.precision)}
    # forward: all-gather beside QKV, reduce-scatter beside the projection, the same around the MLP;
    # backward: each turned into the other beside the same GEMMs' dgrad
    expected = [("F", "all_gather", fwd["qkv"]), ("F", "reduce_scatter", fwd["proj"]),
                ("F", "all_gather", fwd["fc1"]), ("F", "reduce_scatter", fwd["fc2"]),
                ("B", "reduce_scatter", bwd["qkv_dgrad"]), ("B", "all_gather", bwd["proj_dgrad"]),
                ("B", "reduce_scatter", bwd["fc1_dgrad"]), ("B", "all_gather", bwd["fc2_dgrad"])]
    assert [(p.phase, p.kind) for p in lt.tp_overlap] == [e[:2] for e in expected]
    times = [(fwd_comm if phase == "F" else comm)[kind] for phase, kind, _ in expected]
    for pair, (_, _, gemm_s), comm_s in zip(lt.tp_overlap, expected, times):
        assert (pair.comm_s, pair.gemm_s, pair.beside_s) == pytest.approx((comm_s, gemm_s, gemm_s * 7 / 8))
    assert lt.tp_hidden_s == pytest.approx(sum(min(c, g * 7 / 8) for (_, _, g), c in zip(expected, times)))
    assert 0 < lt.tp_hidden_s < lt.tp_comm_s


def test_plan_cost_takes_the_hidden_time_off_each_micro_batch(setup):
    cluster, model, cm, plan = setup
    on = replace(plan, tp_comm_overlap=True)
    hidden = sum(cm.layer_time(model.layers[i], s, 1, plan.micro_batches).tp_hidden_s for i, s in enumerate(plan.layers))
    off_cost, on_cost = cm.plan_cost(model, plan), cm.plan_cost(model, on)
    assert on_cost.stage_time_s[0] == pytest.approx(off_cost.stage_time_s[0] - hidden)
    assert on_cost.iteration_time_s == pytest.approx(off_cost.iteration_time_s - plan.micro_batches * hidden)
    assert on_cost.peak_memory_bytes == off_cost.peak_memory_bytes


def test_layers_without_megatron_sp_pair_nothing_and_the_eager_model_refuses_the_plan(setup):
    cluster, model, cm, plan = setup
    plain = replace(plan.layers[0], sp="none")
    assert cm.layer_time(model.layers[0], plain, 1, 8).tp_overlap == ()
    eager = cost_models.get("analytical", cluster, stack="eager")
    with pytest.raises(SpecError, match="stack megatron-te"):
        eager.plan_cost(model, replace(plan, tp_comm_overlap=True))
