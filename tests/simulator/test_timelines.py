"""Timelines of cases small enough to work out by hand (hand-set compute times, no vocab)."""
import pytest

from simulator import simulate
from specs import uniform_plan
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
    # buffer, whose reduce-scatter over 2 ranks (one ring step of 500 B at 1000 B/s) frees it;
    # backward ends by waiting for it (so B1 starts at 4.5); after the optimizer step the
    # updated parameters are all-gathered (another 0.5 s).
    cluster = hand_cluster(2, bytes_per_s=1000.0)
    plan = uniform_plan(1, dp=2, global_batch=4, micro_batches=2, dp_type="zero2", schedule="gpipe")
    result = simulate(tiny_model(1), cluster, plan, HandCostModel(cluster, gradient_bytes=1000.0), keep_spans=True)
    assert timeline(result, 0) == [("F0 L0", 0, 1), ("F1 L0", 1, 2), ("B0 L0", 2, 4), ("B1 L0", 4.5, 6.5)]
    assert timeline(result, 0, "dp") == [("grad sync L0-L0 mb0 #1", 4.0, 4.5), ("grad sync L0-L0 mb1 #2", 6.5, 7.0),
                                         ("L0 param all-gather", 7.0, 7.5)]
    assert result.memory_timeline[0] == ((0.0, 500.0), (4.0, 1500.0), (4.5, 500.0), (6.5, 1500.0), (7.0, 500.0))
    assert result.iteration_time_s == pytest.approx(7.5)


def test_ddp_all_reduces_once_after_the_last_micro_batch():
    cluster = hand_cluster(2, bytes_per_s=1000.0)
    plan = uniform_plan(1, dp=2, global_batch=4, micro_batches=2, schedule="gpipe")
    result = simulate(tiny_model(1), cluster, plan, HandCostModel(cluster, gradient_bytes=1000.0), keep_spans=True)
    # ring all-reduce on 2 ranks: 2 steps of 500 B at 1000 B/s
    assert timeline(result, 0, "dp") == [("grad sync L0-L0 mb1 #1", 6.0, 7.0)]
    assert result.peak_memory_bytes == (1000.0, 1000.0)
