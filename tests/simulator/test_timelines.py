"""Timelines of cases small enough to work out by hand (hand-set compute times, no vocab)."""
from dataclasses import replace

import pytest

import cost_models
from cost_models import LayerTime
from cost_models.base import PipelineMessage
from cost_models.tp_overlap import OverlapPair
from cost_models.memory import activation_bytes, attention_core_bytes
from simulator import simulate
from specs import LayerStrategy, uniform_plan
from specs.schedules import REGISTRY
from tests.simulator.handmade import GIB, HandCostModel, hand_cluster, timeline, tiny_model


def test_gpipe_two_stages_two_micro_batches():
    # F = 1 s, B = 2 s, update 0.25 s; each pipeline message is 1024 B at 2048 B/s = 0.5 s,
    # and the sender waits for it (Megatron's blocking p2p).
    cluster = hand_cluster(2, bytes_per_s=2048.0)
    model = tiny_model(2)
    plan = uniform_plan(2, pp=2, global_batch=2, micro_batches=2, schedule="gpipe")
    result = simulate(model, cluster, plan, HandCostModel(cluster, update_s=0.25), keep_spans=True)
    assert timeline(result, 0) == [("F0 L0", 0.0, 1.0), ("F1 L0", 1.5, 2.5), ("B0 L0", 6.5, 8.5),
                                   ("B1 L0", 9.0, 11.0), ("optimizer", 11.0, 11.25)]
    assert timeline(result, 1) == [("F0 L1", 1.5, 2.5), ("F1 L1", 3.0, 4.0), ("B0 L1", 4.0, 6.0),
                                   ("B1 L1", 6.5, 8.5), ("optimizer", 9.0, 9.25)]
    assert timeline(result, 0, "p2p") == [("F0 send", 1.0, 1.5), ("F1 send", 2.5, 3.0)]
    assert timeline(result, 1, "p2p") == [("B0 send", 6.0, 6.5), ("B1 send", 8.5, 9.0)]
    assert result.iteration_time_s == pytest.approx(11.25)
    assert result.throughput_samples_per_s == pytest.approx(2 / 11.25)


def test_one_f_one_b_four_stages():
    # F = 1, B = 2, links fast enough to ignore; worked out on paper: (m + p - 1)(F + B) = 21.
    cluster = hand_cluster(4, bytes_per_s=1e15)
    plan = uniform_plan(4, pp=4, global_batch=4, micro_batches=4, schedule="1f1b")
    result = simulate(tiny_model(4), cluster, plan, HandCostModel(cluster), keep_spans=True)
    assert timeline(result, 0) == [("F0 L0", 0, 1), ("F1 L0", 1, 2), ("F2 L0", 2, 3), ("F3 L0", 3, 4),
                                   ("B0 L0", 10, 12), ("B1 L0", 13, 15), ("B2 L0", 16, 18), ("B3 L0", 19, 21)]
    assert timeline(result, 2) == [("F0 L2", 2, 3), ("F1 L2", 3, 4), ("B0 L2", 6, 8), ("F2 L2", 8, 9),
                                   ("B1 L2", 9, 11), ("F3 L2", 11, 12), ("B2 L2", 12, 14), ("B3 L2", 15, 17)]
    assert timeline(result, 3) == [("F0 L3", 3, 4), ("B0 L3", 4, 6), ("F1 L3", 6, 7), ("B1 L3", 7, 9),
                                   ("F2 L3", 9, 10), ("B2 L3", 10, 12), ("F3 L3", 12, 13), ("B3 L3", 13, 15)]
    assert result.iteration_time_s == pytest.approx(21.0)
    # busy 4 x 3 s per stage of 21 s: bubble (p - 1) / (m + p - 1) = 3/7
    assert result.bubble_fraction == pytest.approx(3 / 7, abs=1e-6)
    assert result.compute_busy_fraction == pytest.approx(12 / 21, abs=1e-6)


def test_one_f_one_b_holds_fewer_activations_than_gpipe():
    cluster = hand_cluster(4, bytes_per_s=1e15)
    model, cm = tiny_model(4), HandCostModel(cluster, activation_bytes=GIB)
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        plan = uniform_plan(4, pp=4, global_batch=8, micro_batches=8, schedule=schedule)
        peaks[schedule] = simulate(model, cluster, plan, cm).peak_memory_bytes
    assert peaks["gpipe"] == (8 * GIB,) * 4
    assert peaks["1f1b"] == (4 * GIB, 3 * GIB, 2 * GIB, 1 * GIB)  # stage k holds pp - k


def test_allocation_that_overflows_memory_at_a_known_time():
    # states 0.5 GiB, 0.2 GiB stashed per forward (at t = 1, 2, 3): the third does not fit in 1 GiB.
    cluster = hand_cluster(1, memory_gib=1.0)
    plan = uniform_plan(1, global_batch=4, micro_batches=4, schedule="gpipe")
    cm = HandCostModel(cluster, states_bytes=0.5 * GIB, activation_bytes=0.2 * GIB)
    result = simulate(tiny_model(1), cluster, plan, cm)
    oom = result.oom
    assert oom is not None
    assert (oom.time_s, oom.gpu, oom.what) == (3.0, 0, "act L0 mb2")
    assert oom.requested_bytes == pytest.approx(0.2 * GIB)
    assert oom.live_bytes == pytest.approx(0.9 * GIB)
    assert oom.capacity_bytes == GIB
    assert "out of memory on GPU 0 at t=3.000000s" in str(oom)
    assert result.peak_memory_bytes[0] == pytest.approx(1.3 * GIB)  # played on to show how far over


def test_memory_timeline_goes_up_in_forward_and_down_in_backward():
    cluster = hand_cluster(1)
    plan = uniform_plan(1, global_batch=2, micro_batches=2, schedule="gpipe")
    cm = HandCostModel(cluster, states_bytes=10.0, activation_bytes=5.0)
    result = simulate(tiny_model(1), cluster, plan, cm)
    assert result.memory_timeline[0] == ((0.0, 10.0), (1.0, 15.0), (2.0, 20.0), (4.0, 15.0), (6.0, 10.0))
    assert result.oom is None


def test_no_memory_timeline_when_not_recorded():
    cluster = hand_cluster(1)
    plan = uniform_plan(1, global_batch=1, micro_batches=1)
    result = simulate(tiny_model(1), cluster, plan, HandCostModel(cluster, activation_bytes=5.0),
                      record_memory=False)
    assert result.memory_timeline == ((),)
    assert result.peak_memory_bytes == (5.0,)


def test_zero3_prefetch_holds_two_gathered_layers_at_once():
    # Hand model: every layer's parameters take 100 B (as if unsharded); ZeRO-3 gathers them
    # before each use. Prefetching the next layer keeps two gathered copies live.
    cluster = hand_cluster(2, bytes_per_s=1e9)
    plan = uniform_plan(3, dp=2, global_batch=2, micro_batches=1, dp_type="zero3")
    cm = HandCostModel(cluster, states_bytes=100.0)
    with_prefetch = simulate(tiny_model(3), cluster, plan, cm, keep_spans=True)
    without = simulate(tiny_model(3), cluster, plan, cm, prefetch=False)
    assert with_prefetch.peak_memory_bytes == (500.0, 500.0)
    assert without.peak_memory_bytes == (400.0, 400.0)
    gathers = [n for n, a, b in timeline(with_prefetch, 0, "gather")]
    assert gathers == ["F0 L0 gather", "F0 L1 gather", "F0 L2 gather", "B0 L2 gather", "B0 L1 gather",
                       "B0 L0 gather"]


def test_zero2_reduces_every_micro_batch_and_frees_its_gradient_buffer():
    # 1000 B of gradients, 500 B kept per rank; each backward (2 s) fills the full 1000 B
    # buffer, whose reduce-scatter over 2 ranks (one ring step of 500 B at 1000 B/s) frees it.
    # Nothing waits for it at the backward's end (the executor's ZeRO-2 leaves it running):
    # B1 starts at 4 beside it. After the optimizer step the updated parameters are
    # all-gathered (another 0.5 s): 6.5-7.
    cluster = hand_cluster(2, bytes_per_s=1000.0)
    plan = uniform_plan(1, dp=2, global_batch=4, micro_batches=2, dp_type="zero2", schedule="gpipe")
    result = simulate(tiny_model(1), cluster, plan, HandCostModel(cluster, gradient_bytes=1000.0), keep_spans=True)
    assert timeline(result, 0) == [("F0 L0", 0, 1), ("F1 L0", 1, 2), ("B0 L0", 2, 4), ("B1 L0", 4, 6)]
    assert timeline(result, 0, "dp") == [("grad sync L0-L0 mb0 #1", 4.0, 4.5), ("grad sync L0-L0 mb1 #2", 6.0, 6.5),
                                         ("L0 param all-gather", 6.5, 7.0)]
    assert result.memory_timeline[0] == ((0.0, 500.0), (4.0, 1500.0), (4.5, 500.0), (6.0, 1500.0), (6.5, 500.0))
    assert result.iteration_time_s == pytest.approx(7.0)


def test_zero2_reduce_scatters_queue_beside_the_next_micro_batch():
    # Two layers, 6000 B of gradients each, 3000 B kept per rank: a reduce-scatter is one ring
    # step of 3000 B at 1000 B/s, 3 s, longer than a backward (2 s); they run one after another
    # on the data-parallel stream. Forwards 0-4; B0 L1 4-6, its reduce-scatter 6-9; B0 L0 6-8,
    # its 9-12; B1 starts at 8 without waiting for them (it waited until 12 when a ZeRO-2
    # backward ended by waiting): B1 L1 8-10, its reduce-scatter 12-15; B1 L0 10-12, its 15-18;
    # then each layer's parameter all-gather (3 s each) 18-21 and 21-24. Memory: 6000 of
    # states, + 6000 for each full gradient from its backward's end until its reduce-scatter
    # ends (at 12 one comes as another goes). Buckets of 6000 B: each layer's gradient fills one.
    cluster = hand_cluster(2, bytes_per_s=1000.0)
    plan = uniform_plan(2, dp=2, global_batch=4, micro_batches=2, dp_type="zero2", schedule="gpipe")
    result = simulate(tiny_model(2), cluster, plan, HandCostModel(cluster, gradient_bytes=6000.0), keep_spans=True,
                      bucket_bytes=6000.0)
    assert timeline(result, 0) == [("F0 L0", 0, 1), ("F0 L1", 1, 2), ("F1 L0", 2, 3), ("F1 L1", 3, 4),
                                   ("B0 L1", 4, 6), ("B0 L0", 6, 8), ("B1 L1", 8, 10), ("B1 L0", 10, 12)]
    assert [(a, b) for _, a, b in timeline(result, 0, "dp")] == [(6, 9), (9, 12), (12, 15), (15, 18), (18, 21),
                                                                 (21, 24)]
    assert result.memory_timeline[0] == ((0.0, 6000.0), (6.0, 12000.0), (8.0, 18000.0), (9.0, 12000.0),
                                         (10.0, 18000.0), (12.0, 18000.0), (15.0, 12000.0), (18.0, 6000.0))
    assert result.iteration_time_s == pytest.approx(24.0)


def test_ddp_all_reduces_once_after_the_last_micro_batch():
    cluster = hand_cluster(2, bytes_per_s=1000.0)
    plan = uniform_plan(1, dp=2, global_batch=4, micro_batches=2, schedule="gpipe")
    result = simulate(tiny_model(1), cluster, plan, HandCostModel(cluster, gradient_bytes=1000.0), keep_spans=True)
    # ring all-reduce on 2 ranks: 2 steps of 500 B at 1000 B/s
    assert timeline(result, 0, "dp") == [("grad sync L0-L0 mb1 #1", 6.0, 7.0)]
    assert result.peak_memory_bytes == (1000.0, 1000.0)


class _ScatterGather(HandCostModel):
    def pipeline_message(self, layer, strategy, micro_batch_size):
        return PipelineMessage(send_bytes=512.0 * micro_batch_size, gather_tp=2, gather_bytes=1024.0 * micro_batch_size)


def test_scatter_gather_sends_a_slice_and_the_receiver_all_gathers_it():
    # pp 2, tp 2, one micro-batch of one sample, links 2048 B/s: each rank sends its 512 B slice
    # (0.25 s), then the receiving tp pair all-gathers the 1024 B (one ring step of 512 B,
    # 0.25 s) on its TP stream before computing; the gradient comes back the same way.
    cluster = hand_cluster(4, bytes_per_s=2048.0)
    plan = uniform_plan(2, pp=2, tp=2, global_batch=1, micro_batches=1, schedule="gpipe")
    result = simulate(tiny_model(2, heads=2), cluster, plan, _ScatterGather(cluster), keep_spans=True)
    assert timeline(result, 0, "p2p") == [("F0 send", 2.0, 2.25)]
    assert ("F0 recv gather", 2.25, 2.5) in timeline(result, 2, "tp")
    assert timeline(result, 2)[0] == ("F0 L1", 2.5, 3.5)
    assert timeline(result, 2, "p2p") == [("B0 send", 7.5, 7.75)]
    assert ("B0 recv gather", 7.75, 8.0) in timeline(result, 0, "tp")
    assert timeline(result, 0)[1] == ("B0 L0", 8.0, 10.0)


class _LazyGradients(HandCostModel):
    lazy_gradients = True


def test_lazy_gradients_take_memory_at_their_first_backward():
    # 2 layers, GPipe over 2 micro-batches, F = 1, B = 2; each layer keeps 500 B per micro-batch
    # and has 1000 B of gradients. Held all iteration (Megatron's buffer) the peak is 2000 B of
    # gradients + 4 x 500 B stashed at the start of backward; made by the first backward (the
    # executor's .grad), each layer's gradients replace its freed activations: after B0 L1
    # 2000 - 500 + 1000, after B0 L0 2500 - 500 + 1000 = 3000, then only frees.
    cluster = hand_cluster(1, bytes_per_s=1e9)
    plan = uniform_plan(2, global_batch=2, micro_batches=2, schedule="gpipe")
    eager = simulate(tiny_model(2), cluster, plan, HandCostModel(cluster, gradient_bytes=1000.0, activation_bytes=500.0))
    lazy = simulate(tiny_model(2), cluster, plan, _LazyGradients(cluster, gradient_bytes=1000.0, activation_bytes=500.0))
    assert eager.peak_memory_bytes == (4000.0,)
    assert lazy.memory_timeline[0] == ((0, 0), (1, 500), (2, 1000), (3, 1500), (4, 2000), (6, 2500), (8, 3000),
                                       (10, 2500), (12, 2000))
    assert lazy.peak_memory_bytes == (3000.0,)


class _Contended(HandCostModel):
    def link_calibration(self):
        return {"overlap_coefficient": 1.5}


def test_compute_and_gradient_sync_slow_each_other_by_the_overlap_coefficient():
    # 2 layers, dp 2, a bucket per layer: L1's all-reduce (2 ring steps of 500 B at 1000 B/s,
    # 1 s alone) runs beside L0's backward (2 s alone). With gamma 1.5 both go at 1/1.5 while
    # together: the all-reduce ends at 4 + 1.5 = 5.5, when B0 L0 has done 1 s of its 2; the
    # rest at full speed ends it at 6.5: max(2, 1) + (1.5 - 1) x 1 = 2.5 s, the cost models'
    # overlap formula. L0's own all-reduce then runs alone (6.5 to 7.5). Without: 7.0.
    cluster = hand_cluster(2, bytes_per_s=1000.0)
    plan = uniform_plan(2, dp=2, global_batch=2, micro_batches=1)
    plain = simulate(tiny_model(2), cluster, plan, HandCostModel(cluster, gradient_bytes=1000.0), bucket_bytes=1000.0)
    result = simulate(tiny_model(2), cluster, plan, _Contended(cluster, gradient_bytes=1000.0), keep_spans=True,
                      bucket_bytes=1000.0)
    assert timeline(result, 0) == [("F0 L0", 0, 1), ("F0 L1", 1, 2), ("B0 L1", 2, 4), ("B0 L0", 4, 6.5)]
    assert timeline(result, 0, "dp") == [("grad sync L1-L1 mb0 #1", 4, 5.5), ("grad sync L0-L0 mb0 #2", 6.5, 7.5)]
    assert result.iteration_time_s == pytest.approx(7.5)
    assert plain.iteration_time_s == pytest.approx(7.0)
    # utilisation against the port's built capacity, not the slowed one: 2 x 2 x 500 B in 7.5 s
    assert max(result.link_utilisation.values()) == pytest.approx(2000 / (1000 * 7.5))


def test_interleaved_1f1b_two_stages_two_chunks_four_micro_batches():
    # 4 layers, pp 2, v 2: chunk j holds layer j; stage 0 runs L0 and L2, stage 1 runs L1 and L3.
    # F = 1, B = 2 per layer, instant links. Megatron's order (k-th forward: chunk (k // 2) % 2 of
    # micro-batch (k // 4) * 2 + k % 2; backwards through the chunks in reverse):
    #   stage 0 warm-up 2 (p - 1) + (v - 1) p = 4 forwards: F0L0 F1L0 F0L2 F1L2, then F2L0 B0L2
    #   F3L0 B1L2 F2L2 B0L0 F3L2 B1L0, then B2L2 B3L2 B2L0 B3L0;
    #   stage 1 warm-up 2: F0L1 F1L1, then F0L3 B0L3 F1L3 B1L3 F2L1 B0L1 F3L1 B1L1 F2L3 B2L3
    #   F3L3 B3L3, then B2L1 B3L1.
    # By hand: stage 0 F0L0 0-1, F1L0 1-2; stage 1 F0L1 1-2 (input at 1), F1L1 2-3; stage 0 F0L2
    # 2-3, F1L2 3-4, F2L0 4-5 (chunk 0 needs no input); stage 1 F0L3 3-4, B0L3 4-6, F1L3 6-7,
    # B1L3 7-9; stage 0 B0L2 waits for its gradient (6) 6-8, F3L0 8-9, B1L2 (grad at 9) 9-11;
    # stage 1 F2L1 9-10, B0L1 (grad from B0L2 at 8) 10-12, F3L1 12-13, B1L1 (grad at 11) 13-15;
    # stage 0 F2L2 (input at 10) 11-12, B0L0 (grad at 12) 12-14, F3L2 (input at 13) 14-15,
    # B1L0 (grad at 15) 15-17; stage 1 F2L3 (input at 12) 15-16, B2L3 16-18, F3L3 18-19,
    # B3L3 19-21; stage 0 B2L2 (grad at 18) 18-20, B3L2 (21) 21-23; stage 1 B2L1 (grad at 20)
    # 21-23, B3L1 (23) 23-25; stage 0 B2L0 (23) 23-25, B3L0 (25) 25-27.
    # 27 s = m T + (p - 1) T / v with T = 6 s per stage: the cost model's formula; 1F1B would
    # take (m + p - 1) T = 30 s.
    cluster = hand_cluster(2, bytes_per_s=1e15)
    plan = uniform_plan(4, pp=2, global_batch=4, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=2)
    cm = HandCostModel(cluster, activation_bytes=GIB)
    result = simulate(tiny_model(4), cluster, plan, cm, keep_spans=True)
    assert timeline(result, 0) == [
        ("F0 L0", 0, 1), ("F1 L0", 1, 2), ("F0 L2", 2, 3), ("F1 L2", 3, 4), ("F2 L0", 4, 5), ("B0 L2", 6, 8),
        ("F3 L0", 8, 9), ("B1 L2", 9, 11), ("F2 L2", 11, 12), ("B0 L0", 12, 14), ("F3 L2", 14, 15),
        ("B1 L0", 15, 17), ("B2 L2", 18, 20), ("B3 L2", 21, 23), ("B2 L0", 23, 25), ("B3 L0", 25, 27)]
    assert timeline(result, 1) == [
        ("F0 L1", 1, 2), ("F1 L1", 2, 3), ("F0 L3", 3, 4), ("B0 L3", 4, 6), ("F1 L3", 6, 7), ("B1 L3", 7, 9),
        ("F2 L1", 9, 10), ("B0 L1", 10, 12), ("F3 L1", 12, 13), ("B1 L1", 13, 15), ("F2 L3", 15, 16),
        ("B2 L3", 16, 18), ("F3 L3", 18, 19), ("B3 L3", 19, 21), ("B2 L1", 21, 23), ("B3 L1", 23, 25)]
    assert result.iteration_time_s == pytest.approx(27.0)
    assert cm.plan_cost(tiny_model(4), plan).iteration_time_s == pytest.approx(27.0)
    # in flight at the peak: stage 0 holds 2 (p - 1) + (v - 1) p + 1 = 5 chunk activations, stage 1 holds 3
    assert result.peak_memory_bytes == (5 * GIB, 3 * GIB)


def test_sequence_parallel_and_ulysses_collectives_on_the_tp_channel():
    # 2 GPUs, one layer at tp 2: plain TP plays all-reduces; Megatron-SP a reduce-scatter and an
    # all-gather in their place; Ulysses two all-to-alls; full recomputation repeats the forward's.
    cluster = hand_cluster(2, bytes_per_s=1e9)
    cm = cost_models.get("analytical", cluster)
    names = {}
    for sp, recompute in (("none", "none"), ("megatron", "none"), ("ulysses", "none"), ("megatron", "full")):
        group = {"ulysses": 2} if sp == "ulysses" else {"tp": 2}  # a pair splits the layer either way
        plan = uniform_plan(1, global_batch=2, sp=sp, recompute=recompute, **group)
        result = simulate(tiny_model(1, hidden=64, seq=8, heads=2), cluster, plan, cm, keep_spans=True)
        # (the embedding and head, data parallel over the pair, relayout to the tp 2 layer: "vocab tp")
        names[sp, recompute] = [n for n, _, _ in timeline(result, 0, "tp") if "vocab" not in n]
    assert names["none", "none"] == ["F0 L0 tp x2", "B0 L0 tp x2"]
    assert names["megatron", "none"] == ["F0 L0 sp rs x2", "F0 L0 sp ag x2", "B0 L0 sp rs x2", "B0 L0 sp ag x2"]
    assert names["ulysses", "none"] == ["F0 L0 a2a x1", "F0 L0 a2a x1", "B0 L0 a2a x1", "B0 L0 a2a x1"]
    assert names["megatron", "full"] == ["F0 L0 sp rs x2", "F0 L0 sp ag x2", "B0 L0 sp rs x4", "B0 L0 sp ag x4"]


def test_selective_recompute_rebuilds_the_attention_core_during_backward():
    # one GPU, one GPT layer: between the start and the end of the layer's backward the memory
    # drops by what it kept plus what the backward rebuilt (the attention core under selective,
    # nothing without recomputation)
    cluster = hand_cluster(1)
    cm = cost_models.get("analytical", cluster)
    model = tiny_model(1, hidden=64, seq=8, heads=2)
    drops = {}
    for recompute in ("none", "selective"):
        result = simulate(model, cluster, uniform_plan(1, global_batch=1, recompute=recompute), cm, keep_spans=True)
        (_, start, end), = [x for x in timeline(result, 0, digits=12) if x[0] == "B0 L0"]
        level = lambda t: [b for at, b in result.memory_timeline[0] if at <= t + 1e-15][-1]  # noqa: E731
        drops[recompute] = level(start) - level(end)
    layer, sel = model.layers[0], LayerStrategy(recompute="selective")
    assert drops["selective"] == pytest.approx(activation_bytes(layer, sel, 1) + attention_core_bytes(layer, sel, 1))
    assert drops["none"] == pytest.approx(activation_bytes(layer, LayerStrategy(), 1))
    assert drops["selective"] == pytest.approx(drops["none"])  # the same bytes, kept or rebuilt


def test_zero_bubble_h1_two_stages_four_micro_batches():
    # 2 layers, pp 2, F = B = W = 1 (backward_s 2 of which W 1), instant links. Programs:
    #   stage 0: F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3; stage 1: F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3.
    # By hand: s0 F0 0-1, F1 1-2; s1 F0 1-2, B0 2-3 (gradient to s0 at 3), F1 3-4, B1 4-5, W0 5-6;
    # s0 B0 3-4, W0 4-5, F2 5-6, B1 (gradient at 5) 6-7, W1 7-8, F3 8-9; s1 F2 (input at 6) 6-7,
    # B2 7-8, W1 8-9, F3 (input at 9) 9-10, B3 10-11, W2 11-12, W3 12-13; s0 B2 (at 8) 9-10,
    # W2 10-11, B3 (at 11) 11-12, W3 12-13.
    # 13 s = m T + (p - 1)(F + B - W) with T = 3: 1F1B's (m + p - 1) T would be 15 s. The cost
    # model's bubble 1 - 2 W / T = 1/3 of (sum T - max T) = 3 gives 12 + 1 = 13 s as well.
    cluster = hand_cluster(2, bytes_per_s=1e15)
    plan = uniform_plan(2, pp=2, global_batch=4, micro_batches=4, schedule="zb_h1")
    cm = HandCostModel(cluster, activation_bytes=GIB, weight_grad_s=1.0)
    result = simulate(tiny_model(2), cluster, plan, cm, keep_spans=True)
    assert timeline(result, 0) == [
        ("F0 L0", 0, 1), ("F1 L0", 1, 2), ("B0 L0", 3, 4), ("W0 L0", 4, 5), ("F2 L0", 5, 6), ("B1 L0", 6, 7),
        ("W1 L0", 7, 8), ("F3 L0", 8, 9), ("B2 L0", 9, 10), ("W2 L0", 10, 11), ("B3 L0", 11, 12), ("W3 L0", 12, 13)]
    assert timeline(result, 1) == [
        ("F0 L1", 1, 2), ("B0 L1", 2, 3), ("F1 L1", 3, 4), ("B1 L1", 4, 5), ("W0 L1", 5, 6), ("F2 L1", 6, 7),
        ("B2 L1", 7, 8), ("W1 L1", 8, 9), ("F3 L1", 9, 10), ("B3 L1", 10, 11), ("W2 L1", 11, 12), ("W3 L1", 12, 13)]
    assert result.iteration_time_s == pytest.approx(13.0)
    assert cm.plan_cost(tiny_model(2), plan).iteration_time_s == pytest.approx(13.0)
    # a micro-batch holds its activations until its W: 2 at the peak on both stages
    assert result.peak_memory_bytes == (2 * GIB, 2 * GIB)
    assert [m.activations_bytes for m in cm.plan_cost(tiny_model(2), plan).stage_memory] == [2 * GIB, 2 * GIB]
    # B keeping K = GIB / 4 until W: stage 1's peak after B1 (both held and past B), 2 GIB + 2 K;
    # stage 0's B keeps nothing (the pipeline's first chunk: its whole backward runs at W), 2 GIB;
    # the cost model's too
    cm = HandCostModel(cluster, activation_bytes=GIB, weight_grad_s=1.0, kept_for_w_bytes=GIB / 4)
    expected = (2 * GIB, 2.5 * GIB)
    assert simulate(tiny_model(2), cluster, plan, cm).peak_memory_bytes == pytest.approx(expected)
    assert [m.activations_bytes for m in cm.plan_cost(tiny_model(2), plan).stage_memory] == pytest.approx(expected)


def test_zero_bubble_v_two_stages_four_micro_batches():
    # 4 layers, chunk j = layer j, placed as a V: stage 0 runs L0 and L3, stage 1 runs L1 and L2
    # (L1 -> L2 stays on stage 1; L3 ends the model on stage 0). F = B = W = 1, instant links.
    # Programs (chunk c local: stage 0 c0 = L0, c1 = L3; stage 1 c0 = L1, c1 = L2):
    #   s0: F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F3.0 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 W1.0
    #       F3.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0
    #   s1: F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 F3.0 B1.0 W1.0 F3.1 B2.1
    #       W2.1 B2.0 B3.1 B3.0 W2.0 W3.1 W3.0
    # By hand: s0 F0 L0 0-1, F1 L0 1-2, F2 L0 2-3; s1 F0 L1 1-2, F0 L2 2-3 (to L3 at 3), F1 L1
    # 3-4, F1 L2 4-5; s0 F0 L3 3-4, B0 L3 4-5 (to L2 at 5), W0 L3 5-6, F1 L3 (input at 5) 6-7,
    # B1 L3 7-8, W1 L3 8-9, F3 L0 9-10; s1 B0 L2 5-6, W0 L2 6-7, F2 L1 7-8, B0 L1 8-9 (to L0 at
    # 9), W0 L1 9-10, F2 L2 10-11, B1 L2 (gradient at 8) 11-12, W1 L2 12-13, F3 L1 (input at 10)
    # 13-14, B1 L1 14-15, W1 L1 15-16, F3 L2 16-17; s0 B0 L0 10-11, W0 L0 11-12, F2 L3 (input at
    # 11) 12-13, B2 L3 13-14, W2 L3 14-15, B1 L0 (at 15) 15-16, W1 L0 16-17, F3 L3 (at 17)
    # 17-18, B3 L3 18-19, W3 L3 19-20; s1 B2 L2 (at 14) 17-18, W2 L2 18-19, B2 L1 19-20, B3 L2
    # (at 19) 20-21, B3 L1 21-22, W2 L1 22-23, W3 L2 23-24, W3 L1 24-25; s0 B2 L0 (at 20) 20-21,
    # W2 L0 21-22, B3 L0 (at 22) 22-23, W3 L0 23-24.
    # 25 s = m T + (p - 1)(f + b - w) with T = 6 per stage, chunk f = b = w = 1 (1F1B-like
    # timing would add (p - 1) T = 6). The cost model's bubble (1 - 2 W / T) / 2 = 1/6 of
    # (sum T - max T) = 6 gives 24 + 1 = 25 s as well.
    cluster = hand_cluster(2, bytes_per_s=1e15)
    plan = uniform_plan(4, pp=2, global_batch=4, micro_batches=4, schedule="zbv", virtual_stages=2)
    assert plan.stage_ranges() == [[0, 3], [1, 2]]
    cm = HandCostModel(cluster, activation_bytes=GIB, weight_grad_s=1.0)
    result = simulate(tiny_model(4), cluster, plan, cm, keep_spans=True)
    assert timeline(result, 0) == [
        ("F0 L0", 0, 1), ("F1 L0", 1, 2), ("F2 L0", 2, 3), ("F0 L3", 3, 4), ("B0 L3", 4, 5), ("W0 L3", 5, 6),
        ("F1 L3", 6, 7), ("B1 L3", 7, 8), ("W1 L3", 8, 9), ("F3 L0", 9, 10), ("B0 L0", 10, 11), ("W0 L0", 11, 12),
        ("F2 L3", 12, 13), ("B2 L3", 13, 14), ("W2 L3", 14, 15), ("B1 L0", 15, 16), ("W1 L0", 16, 17),
        ("F3 L3", 17, 18), ("B3 L3", 18, 19), ("W3 L3", 19, 20), ("B2 L0", 20, 21), ("W2 L0", 21, 22),
        ("B3 L0", 22, 23), ("W3 L0", 23, 24)]
    assert timeline(result, 1) == [
        ("F0 L1", 1, 2), ("F0 L2", 2, 3), ("F1 L1", 3, 4), ("F1 L2", 4, 5), ("B0 L2", 5, 6), ("W0 L2", 6, 7),
        ("F2 L1", 7, 8), ("B0 L1", 8, 9), ("W0 L1", 9, 10), ("F2 L2", 10, 11), ("B1 L2", 11, 12), ("W1 L2", 12, 13),
        ("F3 L1", 13, 14), ("B1 L1", 14, 15), ("W1 L1", 15, 16), ("F3 L2", 16, 17), ("B2 L2", 17, 18),
        ("W2 L2", 18, 19), ("B2 L1", 19, 20), ("B3 L2", 20, 21), ("B3 L1", 21, 22), ("W2 L1", 22, 23),
        ("W3 L2", 23, 24), ("W3 L1", 24, 25)]
    assert result.iteration_time_s == pytest.approx(25.0)
    assert cm.plan_cost(tiny_model(4), plan).iteration_time_s == pytest.approx(25.0)
    # 4 chunk activations at the peak on each stage (s0: F0.0 F1.0 F2.0 F0.1; s1: F0.0 F0.1 F1.0 F1.1)
    assert result.peak_memory_bytes == (4 * GIB, 4 * GIB)
    # B keeping K = GIB / 4 until W, except L0's (the pipeline's first chunk: its whole backward
    # runs at W): s0 peaks after B0.1 (4 held, L3's mb 0 past B), later points hold no more
    # (B0.0 keeps nothing); s1 after B0.1 (4 held, 1 past B) and B3.0 (3 held, 3 past B) hold
    # 4 GIB + K and 3 GIB + 3 K. The cost model in stage units: s0 (2, 1 of its one keeping
    # chunk) -> 2 x 2 GIB + K; s1 max(2 x 2 GIB + 1/2 x 2 K, 1.5 x 2 GIB + 3/2 x 2 K)
    cm = HandCostModel(cluster, activation_bytes=GIB, weight_grad_s=1.0, kept_for_w_bytes=GIB / 4)
    assert simulate(tiny_model(4), cluster, plan, cm).peak_memory_bytes == pytest.approx((4.25 * GIB, 4.25 * GIB))
    assert [m.activations_bytes for m in cm.plan_cost(tiny_model(4), plan).stage_memory] == \
        pytest.approx([4.25 * GIB, 4.25 * GIB])


@pytest.mark.parametrize("schedule", sorted(REGISTRY))
def test_every_schedule_plays_as_its_formula_on_4_stages(schedule):
    """F = B = W = 1 per layer, one layer per chunk, instant links, m = 8: the played iteration is
    the schedule's formula and each stage's peak activations its in_flight count. By hand, with
    T = 3 v per stage: GPipe and 1F1B (m + pp - 1) T = 11 * 3 = 33; interleaved and Looped BFS
    (v 2, T = 6) m T + (pp - 1) T / v = 48 + 9 = 57; ZB-H1 m T + (pp - 1)(F + B - W) = 24 + 3 = 27;
    ZB-V and DualPipeV m T + (pp - 1)(f + b - w) per chunk = 48 + 3 = 51."""
    entry = REGISTRY[schedule]
    v = entry.min_virtual_stages
    cluster = hand_cluster(4, bytes_per_s=1e15)
    plan = uniform_plan(4 * v, pp=4, global_batch=8, micro_batches=8, schedule=schedule,
                        **({"virtual_stages": v} if v > 1 else {}))
    cm = HandCostModel(cluster, backward_s=2.0, weight_grad_s=1.0, activation_bytes=GIB)
    result = simulate(tiny_model(4 * v), cluster, plan, cm)
    expected = {"gpipe": 33, "1f1b": 33, "interleaved_1f1b": 57, "looped_bfs": 57, "zb_h1": 27, "zbv": 51,
                "dualpipev": 51}[schedule]
    assert result.iteration_time_s == pytest.approx(expected)
    assert cm.plan_cost(tiny_model(4 * v), plan).iteration_time_s == pytest.approx(expected)
    assert result.peak_memory_bytes == tuple(entry.in_flight(4, k, 8, v) * v * GIB for k in range(4))


def test_looped_bfs_two_stages_two_chunks_four_micro_batches():
    # 4 layers round-robin (stage 0: L0, L2; stage 1: L1, L3), F = 1, B = 2, instant links. Each
    # stage runs its chunk 0 for every micro-batch, then chunk 1, then the backwards from the
    # last chunk, newest micro-batch first. By hand: s0 F0-F3 L0 0-4; s1 F0-F3 L1 1-5; s0 F0 L2
    # (input at 2, free at 4) 4-5 ... F3 L2 7-8; s1 F0 L3 5-6 ... F3 L3 8-9, then B3 L3 9-11,
    # B2 11-13, B1 13-15, B0 15-17; s0 B3 L2 (gradient at 11) 11-13, B2 13-15, B1 15-17, B0 17-19;
    # s1 B3 L1 (at 13, free at 17) 17-19, B2 19-21, B1 21-23, B0 23-25; s0 B3 L0 (at 19) 19-21,
    # B2 21-23, B1 23-25, B0 25-27.
    # 27 s = m T + (p - 1) T / v as interleaving (T = 6), every chunk activation held at once: 8.
    cluster = hand_cluster(2, bytes_per_s=1e15)
    plan = uniform_plan(4, pp=2, global_batch=4, micro_batches=4, schedule="looped_bfs", virtual_stages=2)
    cm = HandCostModel(cluster, activation_bytes=GIB)
    result = simulate(tiny_model(4), cluster, plan, cm, keep_spans=True)
    assert timeline(result, 0) == (
        [(f"F{i} L0", i, i + 1) for i in range(4)] + [(f"F{i} L2", 4 + i, 5 + i) for i in range(4)]
        + [(f"B{3 - i} L2", 11 + 2 * i, 13 + 2 * i) for i in range(4)]
        + [(f"B{3 - i} L0", 19 + 2 * i, 21 + 2 * i) for i in range(4)])
    assert timeline(result, 1) == (
        [(f"F{i} L1", 1 + i, 2 + i) for i in range(4)] + [(f"F{i} L3", 5 + i, 6 + i) for i in range(4)]
        + [(f"B{3 - i} L3", 9 + 2 * i, 11 + 2 * i) for i in range(4)]
        + [(f"B{3 - i} L1", 17 + 2 * i, 19 + 2 * i) for i in range(4)])
    assert result.iteration_time_s == pytest.approx(27.0)
    assert cm.plan_cost(tiny_model(4), plan).iteration_time_s == pytest.approx(27.0)
    assert result.peak_memory_bytes == (8 * GIB, 8 * GIB)


def test_dualpipev_two_stages_four_micro_batches():
    # The V of ZB-V (stage 0: L0, L3; stage 1: L1, L2), F = B = W = 1, instant links. Programs:
    #   s0: F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 B2.1 W2.1 F3.1 B1.0 W1.0
    #       B3.1 W3.1 B2.0 W2.0 B3.0 W3.0
    #   s1: F0.0 F0.1 F1.0 F1.1 F2.0 B0.1 W0.1 F2.1 B0.0 W0.0 F3.0 B1.1 W1.1 F3.1 B1.0 W1.0 B2.1 W2.1
    #       B2.0 W2.0 B3.1 B3.0 W3.1 W3.0
    # By hand: s0 F0-F2 L0 0-3; s1 F0 L1 1-2, F0 L2 2-3, F1 L1 3-4, F1 L2 4-5, F2 L1 5-6; s0 F0 L3
    # 3-4, B0 L3 4-5, W0 L3 5-6, F1 L3 6-7, F3 L0 7-8, B1 L3 8-9, W1 L3 9-10; s1 B0 L2 6-7, W0 L2
    # 7-8, F2 L2 8-9, B0 L1 9-10, W0 L1 10-11, F3 L1 11-12, B1 L2 12-13, W1 L2 13-14, F3 L2 14-15,
    # B1 L1 15-16, W1 L1 16-17; s0 F2 L3 (input at 9) 10-11, B0 L0 11-12, W0 L0 12-13, B2 L3
    # 13-14, W2 L3 14-15, F3 L3 (at 15) 15-16, B1 L0 (at 16) 16-17, W1 L0 17-18, B3 L3 18-19,
    # W3 L3 19-20; s1 B2 L2 (at 14, free at 17) 17-18, W2 L2 18-19, B2 L1 19-20, W2 L1 20-21,
    # B3 L2 (at 19) 21-22, B3 L1 22-23, W3 L2 23-24, W3 L1 24-25; s0 B2 L0 (at 20) 20-21,
    # W2 L0 21-22, B3 L0 (at 23) 23-24, W3 L0 24-25.
    # 25 s = m T + (p - 1)(f + b - w) (T = 6), the cost model's; 5 chunk activations at the peak.
    cluster = hand_cluster(2, bytes_per_s=1e15)
    plan = uniform_plan(4, pp=2, global_batch=4, micro_batches=4, schedule="dualpipev", virtual_stages=2)
    cm = HandCostModel(cluster, activation_bytes=GIB, weight_grad_s=1.0)
    result = simulate(tiny_model(4), cluster, plan, cm, keep_spans=True)
    s0 = ("F0 L0 0, F1 L0 1, F2 L0 2, F0 L3 3, B0 L3 4, W0 L3 5, F1 L3 6, F3 L0 7, B1 L3 8, W1 L3 9, F2 L3 10, "
          "B0 L0 11, W0 L0 12, B2 L3 13, W2 L3 14, F3 L3 15, B1 L0 16, W1 L0 17, B3 L3 18, W3 L3 19, B2 L0 20, "
          "W2 L0 21, B3 L0 23, W3 L0 24")
    s1 = ("F0 L1 1, F0 L2 2, F1 L1 3, F1 L2 4, F2 L1 5, B0 L2 6, W0 L2 7, F2 L2 8, B0 L1 9, W0 L1 10, F3 L1 11, "
          "B1 L2 12, W1 L2 13, F3 L2 14, B1 L1 15, W1 L1 16, B2 L2 17, W2 L2 18, B2 L1 19, W2 L1 20, B3 L2 21, "
          "B3 L1 22, W3 L2 23, W3 L1 24")
    for gpu, spans in ((0, s0), (1, s1)):  # every op takes 1 s: "name start"
        expected = [(" ".join(x.split()[:2]), int(x.split()[2]), int(x.split()[2]) + 1) for x in spans.split(", ")]
        assert timeline(result, gpu) == expected
    assert result.iteration_time_s == pytest.approx(25.0)
    assert cm.plan_cost(tiny_model(4), plan).iteration_time_s == pytest.approx(25.0)
    assert result.peak_memory_bytes == (5 * GIB, 5 * GIB)


def test_tp_overlap_plays_each_collective_beside_its_gemm_chunks():
    # 2 GPUs, one layer at tp 2 with Megatron-SP; each collective moves one ring step of 512 B of the
    # 1024 B activation at 1024 B/s: 0.5 s. Forward 4 s holds a 1 s GEMM beside the first all-gather
    # and a 0.4 s one beside the first reduce-scatter; backward 8 s a 1 s dgrad beside one
    # reduce-scatter. At tp 2 the first half of each GEMM runs alone, the second beside the transfer:
    # the all-gather and the backward's reduce-scatter hide whole, the forward's reduce-scatter
    # shows 0.3 s. The other collectives (one of each kind forward, three backward) stay on the path.
    cluster = hand_cluster(2, bytes_per_s=1024.0)
    pairs = (OverlapPair("F", "all_gather", 0.5, 0.5, 1.0, True), OverlapPair("F", "reduce_scatter", 0.5, 0.2, 0.4, True),
             OverlapPair("B", "reduce_scatter", 0.5, 0.5, 1.0, False))
    cm = HandCostModel(cluster)
    cm.t = LayerTime(forward_s=4.0, backward_s=8.0, tp_comm_s=8 * 0.5, tp_overlap=pairs)
    plan = uniform_plan(1, tp=2, sp="megatron", global_batch=1, stack="megatron-te", tp_comm_overlap=True)
    model = tiny_model(1, hidden=64, seq=8, heads=2)
    result = simulate(model, cluster, plan, cm, keep_spans=True)
    assert timeline(result, 0) == [
        ("F0 L0", 0.0, 2.6), ("F0 L0 sp ag 0 gemm own", 2.6, 3.1), ("F0 L0 sp ag 0 gemm beside", 3.1, 3.6),
        ("F0 L0 sp rs 1 gemm own", 3.6, 3.8), ("F0 L0 sp rs 1 gemm beside", 3.8, 4.0),
        ("B0 L0", 5.3, 12.3), ("B0 L0 sp rs 0 gemm own", 12.3, 12.8), ("B0 L0 sp rs 0 gemm beside", 12.8, 13.3)]
    assert timeline(result, 0, "tp") == [
        ("F0 L0 sp ag 0", 3.1, 3.6), ("F0 L0 sp rs 1", 3.8, 4.3), ("F0 L0 sp rs x1", 4.3, 4.8),
        ("F0 L0 sp ag x1", 4.8, 5.3), ("B0 L0 sp rs 0", 12.8, 13.3), ("B0 L0 sp rs x1", 13.3, 13.8),
        ("B0 L0 sp ag x2", 13.8, 14.8)]
    # the cost model's formula: F + B + all TP traffic - what the pairs hide (0.5 + 0.2 + 0.5)
    assert result.iteration_time_s == pytest.approx(14.8)
    assert cm.plan_cost(model, plan).iteration_time_s == pytest.approx(4.0 + 8.0 + 4.0 - 1.2)
    # without the choice, the same layer plays every collective after its compute
    plain = simulate(model, cluster, replace(plan, tp_comm_overlap=False), cm, keep_spans=True)
    assert plain.iteration_time_s == pytest.approx(16.0)



def _sp_layer_tp_spans(**plan_kwargs) -> list:
    """The TP spans of one tp 2 Megatron-SP layer of 64 wide, 8 tokens, at 1024 B/s, its compute
    4 s forward and 8 s backward (the layer above)."""
    cluster = hand_cluster(2, bytes_per_s=1024.0)
    cluster = replace(cluster, gpu=replace(cluster.gpu, peak_fp8_tflops=200.0))
    cm = HandCostModel(cluster)
    cm.t = LayerTime(forward_s=4.0, backward_s=8.0)
    plan = uniform_plan(1, tp=2, sp="megatron", global_batch=1, **plan_kwargs)
    return timeline(simulate(tiny_model(1, hidden=64, seq=8, heads=2), cluster, plan, cm, keep_spans=True), 0, "tp")


def test_an_fp8_layer_gathers_its_sp_inputs_in_fp8_forward_only():
    # The layer above in FP8 without the overlap: each forward all-gather moves the FP8 copy, one
    # ring step of 256 B of the 512 B input at 1024 B/s (0.25 s); the reduce-scatters and the
    # backward's all-gathers of BF16 gradients 0.5 s; a full recompute's forward gathers FP8 again
    assert _sp_layer_tp_spans(precision="fp8-current") == [
        ("F0 L0 sp rs x2", 4.0, 5.0), ("F0 L0 sp ag x2", 5.0, 5.5),
        ("B0 L0 sp rs x2", 13.5, 14.5), ("B0 L0 sp ag x2", 14.5, 15.5)]
    full = _sp_layer_tp_spans(precision="fp8-current", recompute="full")
    assert [name for name, _, _ in full][2:] == ["B0 L0 sp rs x4", "B0 L0 sp ag x2", "B0 L0 sp ag x2"]
    assert [round(b - a, 6) for _, a, b in full][2:] == [2.0, 1.0, 0.5]


def test_a_selective_op_layer_regathers_its_sp_inputs_but_keeps_the_reduce_scatters():
    # The layer above in BF16, each call 0.5 s. torchtitan's per-op policy keeps the
    # reduce-scatters' results, so the recomputed forward re-runs only the all-gathers: backward
    # plays rs x2 and ag x4 (its own two and the recomputed forward's two: one kind and size)
    assert _sp_layer_tp_spans(recompute="selective-op") == [
        ("F0 L0 sp rs x2", 4.0, 5.0), ("F0 L0 sp ag x2", 5.0, 6.0),
        ("B0 L0 sp rs x2", 14.0, 15.0), ("B0 L0 sp ag x4", 15.0, 17.0)]
