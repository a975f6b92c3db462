"""Hand-computable cases of the collective, pipeline, activation and model-state formulas."""

import pytest

from cost_models import MemoryBreakdown, in_flight, pipeline_time
from cost_models.base import CostModel, LayerTime
from cost_models.collectives import (concurrent_time_s, hierarchical_allreduce_time_s, p2p_time_s, ring_terms_s,
                                    ring_time_s, tree_allreduce_time_s)
from cost_models.memory import activation_bytes, model_state_bytes
from cost_models.ops import forward_ops
from specs import LayerSpec, LayerStrategy, load_cluster, load_model, uniform_plan

GPT = LayerSpec(kind="gpt", hidden_size=1024, num_heads=16, ffn_hidden_size=4096, seq_len=1024)


def test_ring_allreduce_on_4_gpus():
    # 2(p-1) alpha + 2(p-1)/p n/B = 6 * 10us + 1.5 * 1e9 / 100e9
    assert ring_time_s("all_reduce", 4, 1e9, 10e-6, 100e9) == pytest.approx(60e-6 + 0.015)
    assert ring_time_s("all_gather", 4, 1e9, 10e-6, 100e9) == pytest.approx(30e-6 + 0.0075)
    assert ring_time_s("all_reduce", 1, 1e9, 10e-6, 100e9) == 0.0


def test_concurrent_collectives_overlap_latencies_and_share_the_link():
    # latency-bound: each alone (10 + 5 ms, 2 + 4 ms) outlasts 2 ms + both transfers (11 ms)
    assert concurrent_time_s([(10e-3, 5e-3), (2e-3, 4e-3)]) == pytest.approx(15e-3)
    # bandwidth-bound: 1 ms + 10 ms + 10 ms of bytes on the one link, not max(11, 12) ms
    assert concurrent_time_s([(1e-3, 10e-3), (2e-3, 10e-3)]) == pytest.approx(21e-3)
    assert concurrent_time_s([(3e-3, 2e-3)]) == pytest.approx(5e-3)
    assert concurrent_time_s([(3e-3, 2e-3), (0.0, 0.0)]) == pytest.approx(5e-3)  # an empty one is none
    assert concurrent_time_s([]) == 0.0


def test_a_gather_and_a_reduce_scatter_over_1024_ranks_at_once():
    # 1 MB over 1024 ranks, 6 us a step, 50 GB/s: 1023 * 6 us = 6.138 ms of latency and
    # 1023/1024 * 1 MB / 50 GB/s = 19.98 us of transfer each; together 6.138 + 2 * 0.01998 ms,
    # about half of the 12.316 ms one after the other
    gather = ring_terms_s("all_gather", 1024, 1e6, 6e-6, 50e9)
    assert gather == pytest.approx((6.138e-3, 1023 / 1024 * 2e-5))
    assert ring_time_s("all_gather", 1024, 1e6, 6e-6, 50e9) == pytest.approx(sum(gather))
    both = concurrent_time_s([gather, ring_terms_s("reduce_scatter", 1024, 1e6, 6e-6, 50e9)])
    assert both == pytest.approx(6.138e-3 + 2 * 1023 / 1024 * 2e-5)
    assert ring_terms_s("all_gather", 1, 1e6, 6e-6, 50e9) == (0.0, 0.0)


def test_tree_hierarchical_and_p2p():
    assert tree_allreduce_time_s(8, 1e9, 1e-5, 1e11) == pytest.approx(6e-5 + 2 * 7 / 8 * 0.01)
    # 2 nodes x 4 GPUs: RS + AG inside (2 * (3 alpha + 3/4 n/Bi)), AR of n/4 across (2 alpha + n/4/Be)
    t = hierarchical_allreduce_time_s(4, 2, 4e9, 1e-6, 2e-6, 200e9, 20e9)
    assert t == pytest.approx(2 * (3e-6 + 0.75 * 4e9 / 200e9) + (2 * 2e-6 + 1e9 / 20e9))
    assert p2p_time_s(1e6, 5e-6, 1e9) == pytest.approx(5e-6 + 1e-3)


def test_activation_bytes_of_one_gpt_layer():
    s, b, h, a = 1024, 2, 1024, 16
    assert activation_bytes(GPT, LayerStrategy(), b) == s * b * h * (34 + 5 * a * s / h)
    assert activation_bytes(GPT, LayerStrategy(tp=4), b) == s * b * h * (10 + 24 / 4 + 5 * a * s / (h * 4))
    assert activation_bytes(GPT, LayerStrategy(tp=4, sp="megatron"), b) == pytest.approx(s * b * h / 4 * (34 + 5 * a * s / h))
    assert activation_bytes(GPT, LayerStrategy(recompute="full"), b) == 2 * s * b * h


@pytest.mark.parametrize("dp_type, gbytes", [("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9), ("ddp", 120.0)])
def test_model_states_of_7_5b_at_dp_64(dp_type, gbytes):
    states = model_state_bytes(7.5e9, dp_type, 64).states_bytes
    assert round(states / 1e9, 1) == gbytes


def test_gpt_7_5b_zoo_model_has_7_5b_parameters():
    assert load_model("gpt-7.5b").param_count() / 1e9 == pytest.approx(7.5, abs=0.1)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_kernel_flops_add_up_to_the_layer_flops(tp):
    llama = load_model("tiny-llama").layers[0]
    for layer in (GPT, llama):
        flops = sum(op.flops for op in forward_ops(layer, tp, 3))
        assert flops * tp == pytest.approx(layer.forward_flops(3))


class _Constant(CostModel):
    """Every layer: forward 1 s, backward 2 s, 10 bytes of activations; no communication."""

    name = "constant-test"

    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0):
        return LayerTime(forward_s=1.0, backward_s=2.0, update_s=0.5)

    def layer_memory(self, layer, strategy, micro_batch_size, in_flight):
        return MemoryBreakdown(parameters_bytes=100.0, activations_bytes=10.0 * in_flight)

    def transition_time(self, *args, **kwargs):
        return 0.0

    def collective_time(self, kind, nbytes, groups):
        return 0.0

    def p2p_time(self, nbytes, src, dst, senders=1):
        return 0.0

    def vocab_cost(self, model, plan, stage, world_size):
        return LayerTime(0.0, 0.0), MemoryBreakdown()


@pytest.mark.parametrize("schedule, held", [("gpipe", (2, 2)), ("1f1b", (2, 1))])
def test_two_stage_pipeline_with_two_micro_batches(schedule, held):
    model = load_model("tiny-gpt").scaled(num_layers=2)
    cluster = load_cluster("cpu-2")
    plan = uniform_plan(2, pp=2, global_batch=4, micro_batches=2, schedule=schedule)
    cost = _Constant(cluster).plan_cost(model, plan)
    # T = 3 s per stage: 3 + 3 + (2 - 1) * 3, plus the 0.5 s optimizer tail
    assert cost.iteration_time_s == pytest.approx(9.5)
    assert cost.stage_time_s == (3.0, 3.0)
    assert tuple(m.activations_bytes for m in cost.stage_memory) == tuple(10.0 * h for h in held)
    assert cost.bubble_fraction == pytest.approx(1 - 6.0 / 9.5)
    assert in_flight(schedule, 2, 0, 2) == held[0]
    assert pipeline_time([1.0, 2.0], [0.1, 0.3], 4, schedule) == pytest.approx(1 + 2 + 3 * 2 + 0.3)
