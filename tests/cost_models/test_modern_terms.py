"""Hand-computable cases of the issue-15 terms: sequence-parallel activations (Korthikanti et al.
2022, Table 2), selective vs full recomputation, SP and Ulysses traffic, the interleaved pipeline,
the padded vocabulary-parallel head, and Galvatron-2's sp_time table."""
import json
from dataclasses import replace

import pytest

import cost_models
from cost_models import in_flight, pipeline_time
from cost_models import sequence as seq
from cost_models.base import CostModel, LayerTime, MemoryBreakdown
from cost_models.memory import activation_bytes, attention_core_bytes
from cost_models.ops import forward_ops
from cost_models.profiled import from_galvatron_dir
from cost_models.sp_time import read_sp_time
from specs import LayerSpec, LayerStrategy, load_cluster, model_from_dict, uniform_plan
from specs.datasets import data_path

S, H, A, B, T = 1024, 1024, 16, 2, 4
GPT = LayerSpec(kind="gpt", hidden_size=H, num_heads=A, ffn_hidden_size=4 * H, seq_len=S)
SBH = S * B * H
SP_TIME = data_path("galvatron_llama2_7b") / "sp_time_1nodes_8gpus_per_node.json"


@pytest.mark.parametrize("strategy, expected", [
    (LayerStrategy(tp=1), SBH * (34 + 5 * A * S / H)),
    (LayerStrategy(tp=T), SBH * (10 + 24 / T + 5 * A * S / (H * T))),
    (LayerStrategy(tp=T, sp="megatron"), SBH * (34 + 5 * A * S / H) / T),
    (LayerStrategy(ulysses=T, sp="ulysses"), SBH * (34 + 5 * A * S / H) / T),
    (LayerStrategy(tp=T, sp="megatron", recompute="selective"), SBH * 34 / T),
    (LayerStrategy(tp=T, recompute="selective"), SBH * (10 + 24 / T)),
    (LayerStrategy(tp=T, sp="megatron", recompute="full"), 2 * SBH / T),
])
def test_korthikanti_table_2(strategy, expected):
    assert activation_bytes(GPT, strategy, B) == pytest.approx(expected)


def test_selective_recompute_rebuilds_only_the_attention_core():
    # 5 a s^2 b / t: softmax output, its dropout mask and output, per head shard
    core = attention_core_bytes(GPT, LayerStrategy(tp=T, recompute="selective"), B)
    assert core == pytest.approx(5 * A * S * S * B / T)
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    mem = cm.layer_memory(GPT, LayerStrategy(tp=T, dp=2, sp="megatron", recompute="selective"), B, 1)
    assert mem.temporary_bytes == pytest.approx(core)


def test_recompute_time_selective_vs_full():
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    base = cm.layer_time(GPT, LayerStrategy(tp=T, dp=2), B, 1).backward_s
    full_time = cm.layer_time(GPT, LayerStrategy(tp=T, dp=2, recompute="full"), B, 1)
    full = full_time.backward_s
    sel = cm.layer_time(GPT, LayerStrategy(tp=T, dp=2, recompute="selective"), B, 1).backward_s
    ops = forward_ops(GPT, T, B)
    core = [op for op in ops if op.name in ("scores", "softmax", "attn_dropout", "context")]
    # the recomputed forward re-runs its TP collectives, which hide host launches (1 of 3 passes)
    assert full - base == pytest.approx(cm.ops_time(ops, full_time.tp_comm_s / 3))
    assert sel - base == pytest.approx(cm.ops_time(core))
    assert 0 < sel - base < full - base


def _fake(kind, nbytes, groups):
    """Seconds per byte by collective kind: all-reduce 2, reduce-scatter 0.5, all-gather 0.5, a2a 3."""
    return {"all_reduce": 2.0, "reduce_scatter": 0.5, "all_gather": 0.5, "all_to_all": 3.0}[kind] * nbytes


def test_sequence_parallel_replaces_each_all_reduce_by_reduce_scatter_and_all_gather():
    n = S * B * H * 2  # one activation, 16-bit
    groups = [[0, 1, 2, 3]]
    assert seq.tp_comm_time(_fake, GPT, LayerStrategy(tp=T), B, groups, 2) == pytest.approx(2 * 2 * 2.0 * n)
    assert seq.tp_comm_time(_fake, GPT, LayerStrategy(tp=T, sp="megatron"), B, groups, 2) == pytest.approx(
        2 * 2 * (0.5 + 0.5) * n)
    # full recomputation re-runs the forward's collectives; selective's attention core has none
    assert seq.tp_comm_time(_fake, GPT, LayerStrategy(tp=T, sp="megatron", recompute="full"), B, groups, 2) \
        == pytest.approx(3 * 2 * n)
    assert seq.tp_comm_time(_fake, GPT, LayerStrategy(tp=T, sp="megatron", recompute="selective"), B, groups, 2) \
        == pytest.approx(2 * 2 * n)


def test_same_bytes_on_the_ring_for_sp_and_tp():
    # ring: all-reduce = 2(p-1)/p n/B, RS + AG = 2 (p-1)/p n/B: equal once latency is negligible
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g"), collective_base_latency_s=0.0,
                         step_latency_factor=0.0)
    group = [list(range(8))]
    ar = cm.collective_time("all_reduce", 2**30, group)
    assert cm.collective_time("reduce_scatter", 2**30, group) + cm.collective_time("all_gather", 2**30, group) \
        == pytest.approx(ar, rel=1e-9)


def test_ulysses_all_to_all_volume_and_topology():
    u = 4
    tokens = S * B / u
    qkv, out = seq.ulysses_message_bytes(GPT, LayerStrategy(ulysses=u, sp="ulysses"), B)
    assert (qkv, out) == (tokens * 3 * H * 2, tokens * H * 2)
    assert seq.tp_comm_time(_fake, GPT, LayerStrategy(ulysses=u, sp="ulysses"), B, [[0, 1, 2, 3]], 2) \
        == pytest.approx(2 * 3.0 * (qkv + out))
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g:2"))
    inside = cm.collective_time("all_to_all", qkv, [[0, 1, 2, 3]])
    across = cm.collective_time("all_to_all", qkv, [[0, 8, 1, 9]])
    assert across > inside  # the ring crosses the network between the nodes


def test_ulysses_weights_whole_and_synchronised_over_the_stage():
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    uly = cm.layer_memory(GPT, LayerStrategy(ulysses=4, dp=2, sp="ulysses", dp_type="zero3"), B, 1)
    assert uly.parameters_bytes == pytest.approx(2 * GPT.param_count() / 8)  # 16-bit weights / (tp * dp)
    assert uly.optimizer_bytes == pytest.approx(12 * GPT.param_count() / 8)
    tp = cm.layer_memory(GPT, LayerStrategy(tp=4, dp=2, dp_type="zero3"), B, 1)
    assert tp.parameters_bytes == pytest.approx(2 * GPT.param_count() / 4 / 2)


def test_interleaved_bubble_and_in_flight():
    # uniform T = 1 s on p = 2 stages, m = 4: 1F1B takes m + p - 1 = 5 s; v = 2 chunks: m + (p - 1)/v
    assert pipeline_time([1.0, 1.0], [0.0, 0.0], 4, "1f1b") == pytest.approx(5.0)
    # bubble (p-1)/(v m) = 1/8 of 4
    assert pipeline_time([1.0, 1.0], [0.0, 0.0], 4, "interleaved_1f1b", 2) == pytest.approx(4.5)
    # Megatron's warm-up: stage k holds 2 (p - k - 1) + (v - 1) p + 1 chunk micro-batches
    assert in_flight("interleaved_1f1b", 2, 0, 4, 2) == pytest.approx(5 / 2)  # = p (1 + (p-1)/(p v))
    assert in_flight("interleaved_1f1b", 2, 1, 4, 2) == pytest.approx(3 / 2)
    assert in_flight("interleaved_1f1b", 4, 0, 8, 4) == pytest.approx(4 * (1 + 3 / 16))


class CountingModel(CostModel):
    """Every layer 1 s forward, nothing else; each p2p costs 0.125 s and is logged."""

    name = "counting"

    def __init__(self, cluster):
        super().__init__(cluster)
        self.sends = []

    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0):
        return LayerTime(forward_s=1.0, backward_s=0.0)

    def layer_memory(self, layer, strategy, micro_batch_size, in_flight):
        return MemoryBreakdown(activations_bytes=in_flight)

    def transition_time(self, layer, prev, nxt, micro_batch_size, first_rank=0):
        return 100.0  # would show if a chunk boundary were counted as a re-layout

    def collective_time(self, kind, nbytes, groups):
        return 0.0

    def p2p_time(self, nbytes, src, dst, senders=1):
        self.sends.append((src, dst))
        return 0.125

    def vocab_cost(self, model, plan, stage, world_size):
        return LayerTime(forward_s=0.0, backward_s=0.0), MemoryBreakdown()


def test_interleaving_sends_at_every_chunk_boundary():
    cluster = load_cluster("dgx-a100-80g:1")
    model = model_from_dict({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 8, "n_positions": 64,
                             "vocab_size": 128})
    strategies = [LayerStrategy(tp=1, dp=4), LayerStrategy(tp=2, dp=2)] * 4  # strategies alternate
    plan = replace(uniform_plan(8, dp=4, pp=2, global_batch=8, micro_batches=2,
                                schedule="interleaved_1f1b", virtual_stages=2),
                   layers=tuple(strategies))
    cm = CountingModel(cluster)
    cost = cm.plan_cost(model, plan)
    # stage 0 holds chunks 0 (L0-1) and 2 (L4-5): sends forward after chunks 0 and 2, gradient back from chunk 2;
    # stage 1 holds chunks 1 and 3: forward after chunk 1 (wrapping to stage 0), gradients from chunks 1 and 3.
    assert sorted(cm.sends) == [(0, 4), (0, 4), (0, 4), (4, 0), (4, 0), (4, 0)]
    # 4 layers x 1 s + one re-layout inside each chunk (100 s) x 2 chunks + 3 sends
    assert cost.stage_time_s == pytest.approx((4 + 200 + 0.375, 4 + 200 + 0.375))
    assert cost.iteration_time_s == pytest.approx(2 * 204.375 + 204.375 / 2)
    held = in_flight("interleaved_1f1b", 2, 0, 2, 2)
    assert cost.stage_memory[0].activations_bytes == pytest.approx(8 * held / 2 * 1)


def test_vocab_parallel_head_keeps_logits_over_tp_of_the_padded_vocabulary():
    model = model_from_dict(
        {"model_type": "gpt2", "n_embd": 1024, "n_head": 16, "n_layer": 2, "n_positions": 1024,
         "vocab_size": 50257})
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    kept = {}
    for vtp in (1, 8):
        plan = uniform_plan(2, dp=8, global_batch=8, vocab_tp=vtp)
        kept[vtp] = cm.vocab_cost(model, plan, 0, 8)[1].activations_bytes
    # per token: the embedding's dropout mask (1 B x h), the fp32 softmax of the padded vocabulary
    # (50304 at tp 1, 51200 = 400 * 128 at tp 8) / tp, the head input (2 B x h); micro-batch 8 / dp
    per_token = {1: 1024 + 50304 * 4 + 2048, 8: 1024 + 51200 / 8 * 4 + 2048}
    assert kept[1] == pytest.approx(1 * 1024 * per_token[1])  # dp 8: one sample per replica
    assert kept[8] == pytest.approx(8 * 1024 * per_token[8])  # dp 1: all eight


def test_sp_time_table_interpolates_galvatron_measurements():
    raw = json.loads(SP_TIME.read_text())
    table = read_sp_time(SP_TIME)
    mib = 1024**2
    assert table.time_s("all_to_all", 8, 1 * mib) == pytest.approx(raw["all2all_size_8_1MB_time"] * 1e-3)
    mid = (raw["all2all_size_8_1MB_time"] + raw["all2all_size_8_2MB_time"]) / 2
    assert table.time_s("all_to_all", 8, 1.5 * mib) == pytest.approx(mid * 1e-3)
    assert table.time_s("all_to_all", 3, mib) is None
    model = from_galvatron_dir(data_path("galvatron_llama2_7b"), load_cluster("dgx-a100-80g"), "llama2-7b")
    assert model.collective_time("all_to_all", 4 * mib, [[0, 1, 2, 3]]) == pytest.approx(
        raw["all2all_size_4_4MB_time"] * 1e-3)
