"""The simulator plays context parallelism: a 4-rank K/V ring beside the blockwise attention core,
worked out by hand; the all-gather variant; the load-balancing order; the --cp flag."""
from dataclasses import replace

import pytest

from cost_models import LayerTime
from simulator import simulate
from simulator.run import main
from specs import uniform_plan
from tests.simulator.handmade import HandCostModel, hand_cluster, timeline, tiny_model

# One layer of a tiny GPT (seq 8, 1 head of 128) on 4 GPUs at cp 4: each rank holds 8 / 4 = 2 tokens,
# its K/V block is 2 (K, V) * 2 tokens * 128 * 2 bytes = 1024 B; at 1024 B/s a ring send takes 1 s.
# Forward 4 s of which the attention core is 2 s (0.5 s a block); backward 8 s, core 4 s (1 s a block).
CLUSTER = hand_cluster(4, bytes_per_s=1024.0)
MODEL = tiny_model(1, hidden=128)


def _cost_model() -> HandCostModel:
    cm = HandCostModel(CLUSTER)
    cm.t = LayerTime(forward_s=4.0, backward_s=8.0, cp_core_fwd_s=2.0, cp_core_bwd_s=4.0)
    return cm


def _plan(**kw):
    return uniform_plan(1, cp=4, global_batch=1, **kw)


@pytest.mark.parametrize("full", [False, True])
def test_a_4_rank_ring_timeline(full):
    result = simulate(MODEL, CLUSTER, _plan(), _cost_model(), full=full, keep_spans=True)
    # forward: the rest of the layer 0-2; then 4 blocks of 0.5 s, each of the first 3 beside a
    # 1 s send of the next K/V block, so each step takes the send's 1 s; the last block alone.
    # backward: the rest 5.5-9.5; 4 blocks of 1 s, the first 3 beside 2 s sends (K/V and the
    # gradient block travelling with it); then the last dK/dV block goes home (1 s): 17.5.
    assert timeline(result, 0) == [
        ("F0 L0", 0, 2), ("F0 L0 attn 0", 2, 2.5), ("F0 L0 attn 1", 3, 3.5), ("F0 L0 attn 2", 4, 4.5),
        ("F0 L0 attn 3", 5, 5.5),
        ("B0 L0", 5.5, 9.5), ("B0 L0 attn 0", 9.5, 10.5), ("B0 L0 attn 1", 11.5, 12.5),
        ("B0 L0 attn 2", 13.5, 14.5), ("B0 L0 attn 3", 15.5, 16.5)]
    assert timeline(result, 0, "cp") == [
        ("F0 L0 cp ring 0", 2, 3), ("F0 L0 cp ring 1", 3, 4), ("F0 L0 cp ring 2", 4, 5),
        ("B0 L0 cp ring 0", 9.5, 11.5), ("B0 L0 cp ring 1", 11.5, 13.5), ("B0 L0 cp ring 2", 13.5, 15.5),
        ("B0 L0 cp dkv home", 16.5, 17.5)]
    assert result.iteration_time_s == pytest.approx(17.5)
    # the cost model's formula on the same numbers: forward 4 + 3 * max(0, 1 - 0.5) = 5.5,
    # backward 8 + 3 * max(0, 2 - 1) + 1 = 12: 17.5


def test_contiguous_chunks_stretch_every_block():
    # cp_load_balance none on a causal layer: each block takes (2 * 4 - 1) / 4 = 1.75 x its share:
    # forward 2 + 3 * max(1, 0.875) + 0.875 = 5.875; backward 4 + 3 * max(2, 1.75) + 1.75 + 1 = 12.75
    result = simulate(MODEL, CLUSTER, replace(_plan(), cp_load_balance="none"), _cost_model())
    assert result.iteration_time_s == pytest.approx(5.875 + 12.75)


def test_the_all_gather_variant_waits_for_the_whole_sequence():
    # all-gather of 4 blocks (4096 B) over a ring of 4: 3 steps of 1024 B at 1024 B/s = 3 s.
    # forward 2 + 3 + core 2 = 7; backward 4 + 3 (gather) + 4 (core) + 3 (reduce-scatter) = 14: 21
    result = simulate(MODEL, CLUSTER, _plan(cp_comm="all_gather"), _cost_model(), keep_spans=True)
    assert timeline(result, 0, "cp")[:1] == [("F0 L0 cp ag", 2, 5)]
    assert result.iteration_time_s == pytest.approx(21.0)


def test_the_cp_flag_runs_a_uniform_plan(capsys):
    assert main(["--model", "llama3-8b", "--cluster", "dgx-h100:2", "--seq-length", "131072", "--tp", "4",
                 "--cp", "4", "--sp", "megatron", "--zero", "1", "--global-batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "pp1 m2 | L0-31 tp4/dp1 zero1 sp cp4" in out


class _SlowGatherModel(HandCostModel):
    """Pipeline sends at the links' rate, all-gathers at half of it (a backend whose all-gather
    carries twice its ring's bytes)."""

    def link_calibration(self):
        return {"collective_slowdown": {"all_gather": 2.0}}


def test_a_ring_step_runs_at_the_all_gathers_rate_not_a_pipeline_sends():
    # the cost models charge a ring step as one step of a ring all-gather (context.ring_step_s):
    # at half the rate each forward step's 1024 B takes 2 s, each backward step's 2048 B 4 s;
    # the last dK/dV block home 2 s. Forward 2 + 3 * 2 + 0.5 = 8.5; backward 4 + 3 * 4 + 1 + 2 = 19
    cm = _SlowGatherModel(CLUSTER)
    cm.t = _cost_model().t
    result = simulate(MODEL, CLUSTER, _plan(), cm, keep_spans=True)
    assert timeline(result, 0, "cp")[:2] == [("F0 L0 cp ring 0", 2, 4), ("F0 L0 cp ring 1", 4, 6)]
    assert result.iteration_time_s == pytest.approx(8.5 + 19.0)
