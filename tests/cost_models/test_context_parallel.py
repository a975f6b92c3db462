"""Context parallelism's costs, each formula on a case worked out by hand (cost_models/context.py)."""
from dataclasses import replace

import pytest

import cost_models
from cost_models import context, memory, sequence
from specs import LayerStrategy, load_cluster, load_model, uniform_plan

LLAMA = load_model("llama3-8b").with_seq_len(131072)  # 32 heads, 8 kv heads of 128, 32 layers
LAYER = LLAMA.layers[0]
MS = 1e-3


def fixed(times_ms: dict[str, float]):
    """A collective of fixed time per kind, so that the ring's arithmetic is checked alone."""
    return lambda kind, nbytes, groups: times_ms[kind] * MS


def test_kv_block_is_the_ranks_tokens_of_its_kv_heads():
    # tp 2, cp 4: 131072 / 4 = 32768 tokens, 8 / 2 = 4 kv heads of 128, K and V, 2 bytes:
    # 2 * 32768 * 4 * 128 * 2 = 67,108,864
    assert context.kv_block_bytes(LAYER, LayerStrategy(tp=2, cp=4), 1) == 67_108_864
    # tp 16 > 8 kv heads: each rank keeps one kv head; cp 8: 16384 tokens; micro-batch 2:
    # 2 * (2 * 16384) * 1 * 128 * 2 = 16,777,216
    assert context.kv_block_bytes(LAYER, LayerStrategy(tp=16, cp=8), 2) == 16_777_216
    # a2a+p2p, ulysses 4, cp 2: the Ulysses group holds 65536 tokens, 8 / 4 = 2 kv heads each:
    # 2 * 65536 * 2 * 128 * 2 = 67,108,864
    s = LayerStrategy(ulysses=4, sp="ulysses", cp=2, cp_comm="a2a+p2p")
    assert context.kv_block_bytes(LAYER, s, 1) == 67_108_864


def test_ring_exposes_what_the_blocks_compute_does_not_hide():
    # cp 4: the all-gather of 4 blocks takes 4.5 ms = 3 ring steps, so one step c = 1.5 ms.
    # core forward 4 ms -> 1 ms a block; backward 8 ms -> 2 ms a block.
    # forward: 3 * max(0, 1.5 - 1) = 1.5; backward: 3 * max(0, 2 * 1.5 - 2) = 3, plus the last
    # dK/dV hop 1.5: 6.0 ms.
    ring = fixed({"all_gather": 4.5})
    t = context.cp_time(ring, LAYER, LayerStrategy(cp=4, dp=2), 1, 0, 4 * MS, 8 * MS)
    assert t.comm_s == pytest.approx(6.0 * MS)
    # full recomputation runs the forward ring again: + 1.5 -> 7.5 ms
    t = context.cp_time(ring, LAYER, LayerStrategy(cp=4, dp=2, recompute="full"), 1, 0, 4 * MS, 8 * MS)
    assert t.comm_s == pytest.approx(7.5 * MS)
    # compute-bound (2 ms and 4 ms a block hide 1.5 and 3): only the last dK/dV hop, 1.5 ms
    t = context.cp_time(ring, LAYER, LayerStrategy(cp=4, dp=2), 1, 0, 8 * MS, 16 * MS)
    assert t.comm_s == pytest.approx(1.5 * MS)


def test_all_gather_is_not_overlapped():
    # forward all-gather 4.5, backward all-gather 4.5 + reduce-scatter of the gradients 2: 11 ms
    t = context.cp_time(fixed({"all_gather": 4.5, "reduce_scatter": 2.0}), LAYER,
                        LayerStrategy(cp=4, dp=2, cp_comm="all_gather"), 1, 0, 4 * MS, 8 * MS)
    assert t.comm_s == pytest.approx(11.0 * MS)


def test_causal_imbalance_of_contiguous_chunks():
    # cp 4, contiguous chunks: the busiest rank waits (2 * 4 - 1) / 4 = 1.75 x the balanced core;
    # extra = (4 + 8) ms * 3 / 4 = 9 ms
    t = context.cp_time(fixed({"all_gather": 0.0}), LAYER, LayerStrategy(cp=4, dp=2), 1, 0, 4 * MS, 8 * MS)
    assert t.unbalanced_s == pytest.approx(9.0 * MS)
    bert = load_model("bert-large").layers[0]  # not causal: nothing to balance
    assert context.cp_time(fixed({"all_gather": 0.0}), bert, LayerStrategy(cp=4, dp=2), 1, 0,
                           4 * MS, 8 * MS).unbalanced_s == 0.0


def test_buffers():
    # p2p: 4 blocks in flight; all-gather: the whole sequence's K/V and gradients, 2 * cp blocks.
    # cp 4, tp 2: one block 67,108,864 B (above): 4 blocks = 268,435,456; 8 blocks = 536,870,912
    assert context.cp_buffer_bytes(LAYER, LayerStrategy(tp=2, cp=4), 1) == 268_435_456
    assert context.cp_buffer_bytes(LAYER, LayerStrategy(tp=2, cp=4, cp_comm="all_gather"), 1) == 536_870_912


def test_activations_divide_by_cp():
    # every activation is per token and cp keeps s / cp tokens: tp 2 with cp 4 is a quarter of tp 2
    for sp in ("none", "megatron"):
        whole = memory.activation_bytes(LAYER, LayerStrategy(tp=2, sp=sp), 1)
        assert memory.activation_bytes(LAYER, LayerStrategy(tp=2, cp=4, sp=sp), 1) == pytest.approx(whole / 4)


def test_tp_traffic_leaves_cp_out():
    # tp 1: no TP collective at all under cp; the Ulysses all-to-all carries s / (u cp) tokens:
    # 131072 / 8 = 16384 tokens of Q (4096) + K, V (2 * 1024) and of the output (4096), 2 bytes
    cm = cost_models.get("analytical", load_cluster("dgx-h100"))
    assert cm.layer_time(LAYER, LayerStrategy(cp=8), 1, 1).tp_comm_s == 0.0
    s = LayerStrategy(ulysses=2, sp="ulysses", cp=4, cp_comm="a2a+p2p")
    assert sequence.ulysses_message_bytes(LAYER, s, 1) == (16384 * 6144 * 2, 16384 * 4096 * 2)
    tp_groups, sync = sequence.sync_groups(0, LayerStrategy(tp=2, cp=4))
    assert tp_groups[0] == (0, 1) and sync[0] == (0, 2, 4, 6)  # gradients sync over cp


def test_a_plan_without_load_balancing_pays_the_imbalance_every_micro_batch():
    cm = cost_models.get("analytical", load_cluster("dgx-h100"))
    plan = uniform_plan(LLAMA.num_layers, tp=2, cp=4, global_batch=4, micro_batches=4)
    lt = cm.layer_time(LAYER, plan.layers[0], 1, 4)
    assert lt.cp_unbalanced_s > 0
    # pp 1: time = m * sum of the layers' T + tail; every layer the same: 4 * 32 * unbalanced more
    gap = cm.plan_cost(LLAMA, replace(plan, cp_load_balance="none")).iteration_time_s \
        - cm.plan_cost(LLAMA, plan).iteration_time_s
    assert gap == pytest.approx(4 * 32 * lt.cp_unbalanced_s)


def test_cp_and_megatron_sp_split_the_same_activations():
    # 8 GPUs, one sample: tp 8 with Megatron-SP splits every activation by 8; tp 2 x cp 4 with
    # Megatron-SP by 2 * 4 = 8 too, but keeps 4x the weight shard (tp 2) and pays the ring.
    cm = cost_models.get("analytical", load_cluster("dgx-h100"))
    tp8 = uniform_plan(LLAMA.num_layers, tp=8, sp="megatron", global_batch=1)
    cp = uniform_plan(LLAMA.num_layers, tp=2, cp=4, sp="megatron", global_batch=1)
    tp8_mem, cp_mem = cm.plan_cost(LLAMA, tp8).stage_memory[0], cm.plan_cost(LLAMA, cp).stage_memory[0]
    assert cp_mem.activations_bytes == pytest.approx(tp8_mem.activations_bytes)
    assert cp_mem.parameters_bytes > 2 * tp8_mem.parameters_bytes
    assert cm.layer_time(LAYER, cp.layers[0], 1, 1).cp_comm_s > 0


def test_profiled_compute_splits_over_cp_and_charges_the_ring():
    # The profile's line through (1, .91) (2, 1.75) (4, 3.4) ms (docs/profile_format.md) is
    # charged slope * b / split + intercept: 4 samples over cp 4 cost what 1 sample costs at
    # split 1 (its tables at tp are Megatron TP's, not cp's).
    from tests.cost_models.test_profiled import _profile_for
    layer = load_model("tiny-gpt").layers[0]  # seq 64: 2 * cp(4) divides it
    cm = cost_models.get("profiled", load_cluster("dgx-a100-80g"), profile=_profile_for(layer))
    with_cp = cm.layer_time(layer, LayerStrategy(cp=4, dp=2), 4, 1)
    assert with_cp.forward_s == pytest.approx(cm.layer_time(layer, LayerStrategy(dp=8), 1, 1).forward_s)
    assert with_cp.cp_comm_s > 0 and with_cp.cp_unbalanced_s > 0
