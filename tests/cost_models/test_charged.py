"""The model-parallel collectives the analytical model charges (cost_models.charged), worked out
by hand on tiny-gpt (seq 64, hidden 128, 4 heads of 32: q and kv width 128, layernorm) and
tiny-llama (seq 64, hidden 128, 8 query heads and 4 kv heads of 16: q width 128, kv width 64)."""
import pytest

import specs
from cost_models import charged_collectives, charged_dp_collectives, expected_collectives
from cost_models.charged import Difference, Part
from specs import LayerStrategy as L
from specs import Plan, uniform_plan


@pytest.fixture(scope="module")
def gpt():
    return specs.load_model("tiny-gpt")


@pytest.fixture(scope="module")
def llama():
    return specs.load_model("tiny-llama")


def rows(charged, layer=0, part=Part.MODEL_PARALLEL):
    return sorted((str(r.op), r.group_axes, r.group_size, r.elements, r.calls)
                  for r in charged if r.layer == layer and r.part == part)


def test_tp_all_reduces_two_per_pass(gpt):
    # micro-batch of 8 / 2 = 4 sequences: 4 * 64 * 128 = 32768 elements; forward and backward,
    # attention and MLP, 2 micro-batches: 2 * 2 * 2 = 8 calls
    plan = uniform_plan(4, model="tiny-gpt", global_batch=8, micro_batches=2, tp=2)
    assert rows(charged_collectives(gpt, plan, 2)) == [("all_reduce", ("tp",), 2, 32768, 8)]
    assert rows(charged_collectives(gpt, plan, 2), layer=3) == [("all_reduce", ("tp",), 2, 32768, 8)]


def test_megatron_sp_with_full_recompute_has_three_passes(gpt):
    # one micro-batch of 4: 32768 elements; forward, recomputed forward, backward: 3 * 2 = 6
    plan = uniform_plan(4, model="tiny-gpt", global_batch=4, tp=2, sp="megatron", recompute="full")
    assert rows(charged_collectives(gpt, plan, 2)) == [("all_gather", ("tp",), 2, 32768, 6),
                                                        ("reduce_scatter", ("tp",), 2, 32768, 6)]


def test_ulysses_all_to_alls_qkv_and_output(gpt, llama):
    # 2 sequences of 64 over 2 ranks: 64 tokens; QKV 64 * (128 + 2 * 128), output 64 * 128
    plan = uniform_plan(4, model="tiny-gpt", global_batch=2, ulysses=2, sp="ulysses")
    assert rows(charged_collectives(gpt, plan, 2)) == [("all_to_all", ("ulysses",), 2, 8192, 2),
                                                        ("all_to_all", ("ulysses",), 2, 24576, 2)]
    # GQA: QKV 64 * (128 + 2 * 64) = 16384 charged; the executor sends K and V repeated: 3 * 8192
    plan = uniform_plan(4, model="tiny-llama", global_batch=2, ulysses=2, sp="ulysses")
    assert rows(charged_collectives(llama, plan, 2)) == [("all_to_all", ("ulysses",), 2, 8192, 2),
                                                          ("all_to_all", ("ulysses",), 2, 16384, 2)]
    executed = [r for r in expected_collectives(llama, plan, 2) if r.layer == 0 and r.op == "all_to_all"]
    assert sorted((r.elements, r.difference) for r in executed) == [
        (8192, ""), (24576, Difference.GQA_REPEATED)]


def test_cp_ring_sends_per_micro_batch(gpt, llama):
    # K/V block: 2 sequences * 32 tokens * 4 heads * 32 * (K, V) = 16384 elements; TE's ring:
    # cp - 1 forward, 2 (cp - 1) backward, 1 last dK/dV: 4 at cp 2, 10 at cp 4 (8192 elements)
    plan = uniform_plan(4, model="tiny-gpt", global_batch=2, cp=2)
    assert rows(charged_collectives(gpt, plan, 2)) == [("recv", ("cp",), 2, 16384, 4), ("send", ("cp",), 2, 16384, 4)]
    plan4 = uniform_plan(4, model="tiny-gpt", global_batch=2, cp=4)
    assert rows(charged_collectives(gpt, plan4, 4)) == [("recv", ("cp",), 4, 8192, 10), ("send", ("cp",), 4, 8192, 10)]
    # GQA: 4 kv heads of 16: 2 * 2 * 32 * 4 * 16 = 8192
    plan = uniform_plan(4, model="tiny-llama", global_batch=2, cp=2)
    assert rows(charged_collectives(llama, plan, 2)) == [("recv", ("cp",), 2, 8192, 4), ("send", ("cp",), 2, 8192, 4)]


def test_cp_all_gather_variant(gpt):
    # the whole sequence's K/V: 2 * 16384; gathered in forward and backward, gradients scattered once
    plan = uniform_plan(4, model="tiny-gpt", global_batch=2, cp=2, cp_comm="all_gather")
    assert rows(charged_collectives(gpt, plan, 2)) == [("all_gather", ("cp",), 2, 32768, 2),
                                                        ("reduce_scatter", ("cp",), 2, 32768, 1)]


def test_pipeline_scatter_gather_under_tp(gpt):
    # micro-batch of 2: 2 * 64 * 128 = 16384; each tp rank sends half, the receivers gather the
    # whole (forward and backward): per micro-batch one send, one receive, two gathers, at layer 1
    plan = uniform_plan(4, model="tiny-gpt", global_batch=8, micro_batches=4, pp=2, tp=2)
    assert rows(charged_collectives(gpt, plan, 4), layer=1, part=Part.PIPELINE) == [
        ("all_gather", ("tp",), 2, 16384, 8), ("recv", ("pp",), 2, 8192, 4), ("send", ("pp",), 2, 8192, 4)]
    assert rows(charged_collectives(gpt, plan, 4), layer=0, part=Part.PIPELINE) == []
    # the executor sends the whole activation from every lane and gathers nothing
    executed = [(str(r.op), r.elements, r.difference) for r in expected_collectives(gpt, plan, 4)
                if r.part == Part.PIPELINE]
    assert sorted(executed) == [("recv", 16384, Difference.PIPELINE_WHOLE), ("send", 16384, Difference.PIPELINE_WHOLE)]


def test_charged_collectives_adds_model_parallel_rows_to_the_data_parallel(gpt):
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2, dp=2),) * 4, global_batch=8, micro_batches=1,
                model="tiny-gpt")
    dp = charged_dp_collectives(gpt, plan, 4)
    every = charged_collectives(gpt, plan, 4)
    # tiny-gpt's embedding and head run in the vocabulary's layout (dp 4): relaid out to and from dp 2
    assert every[:len(dp)] == dp and {r.part for r in every[len(dp):]} == {Part.MODEL_PARALLEL, Part.RELAYOUT}
    # dp 2 halves the micro-batch: 4 * 64 * 128
    assert rows(every) == [("all_reduce", ("tp",), 2, 32768, 4)]


def test_expert_all_to_alls_per_pass(gpt):
    # tiny-moe (hidden 128, top-2): dp 2 x ep 2, micro-batch 4 / 2 = 2 sequences of 64: 128 tokens
    # x 2 copies x 128 = 32768 per dispatch and combine, forward and backward (and a full
    # recompute's forward), 2 micro-batches: 8 (12)
    moe = specs.load_model("tiny-moe")
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(dp=2, ep=2),) * 4, global_batch=8, micro_batches=2,
                model="tiny-moe")
    assert rows(charged_collectives(moe, plan, 2), part=Part.EXPERT_DISPATCH) == [("all_to_all", ("ep",), 2, 32768, 8)]
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(dp=2, ep=2, recompute="full"),) * 4, global_batch=8,
                micro_batches=2, model="tiny-moe")
    assert rows(charged_collectives(moe, plan, 2), part=Part.EXPERT_DISPATCH) == [("all_to_all", ("ep",), 2, 32768, 12)]
    # tp 2, ep 1: no all-to-all charged; the executor's experts all-reduce their routed rows
    # (4 sequences: 256 tokens x 2 copies x 128) in forward and backward
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2),) * 4, global_batch=4, micro_batches=1, model="tiny-moe")
    assert rows(charged_collectives(moe, plan, 2), part=Part.EXPERT_DISPATCH) == []
    assert rows(expected_collectives(moe, plan, 2), part=Part.EXPERT_DISPATCH) == [("all_reduce", ("tp",), 2, 65536, 2)]


def test_relayouts_where_the_batch_slices_change(gpt):
    # tp 2 -> dp 2 -> dp 2: one relayout, into layer 1; dp grows 1 -> 2: the gradient's all-gather
    # of the whole micro-batch (2 micro-batches of 2: 2 * 64 * 128) over 2 ranks in backward.
    # Tiny-gpt's embedding and head run in the vocabulary's layout (dp 2): into layer 0 dp shrinks
    # (an all-gather of 2 slices in forward), into the head nothing changes
    plan = Plan(pp=1, stage_layers=(3,), layers=(L(tp=2), L(dp=2), L(dp=2)), global_batch=4, micro_batches=2,
                model="tiny-gpt")
    model = gpt.scaled(num_layers=3)
    charged = charged_collectives(model, plan, 2)
    assert [rows(charged, layer=i, part=Part.RELAYOUT) for i in range(4)] == [
        [("all_gather", ("stage",), 2, 16384, 2)], [("all_gather", ("stage",), 2, 16384, 2)], [], []]
    # the executor gathers every slice over the stage in forward (the tp side's whole 16384 x 2)
    # and backward (the dp side's 8192 x 2)
    assert rows(expected_collectives(model, plan, 2), layer=1, part=Part.RELAYOUT) == [
        ("all_gather", ("stage",), 2, 16384, 2), ("all_gather", ("stage",), 2, 32768, 2)]


def test_vocabulary_parallel_and_tied_embedding_rows(gpt):
    # vocab tp 2 on 2 ranks, one micro-batch of 4: the embedding's lookups (4 * 64 * 128) all-reduced
    # in forward, the head's input gradient in backward, three fp32 per token (256) for the loss
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(dp=2),) * 4, global_batch=4, micro_batches=1, model="tiny-gpt",
                vocab_tp=2)
    charged = charged_collectives(gpt, plan, 2)
    assert [rows(charged, layer=i, part=p) for i, p in ((0, Part.EMBEDDING), (3, Part.HEAD), (3, Part.LOSS))] == [
        [("all_reduce", ("vocab_tp",), 2, 32768, 1)], [("all_reduce", ("vocab_tp",), 2, 32768, 1)],
        [("all_reduce", ("vocab_tp",), 2, 256, 3)]]
    assert rows(charged, part=Part.TIED_EMBEDDING) == []  # one stage: the embedding's own sync
    # pp 2, one rank per stage: the tied matrix (512 x 128) all-reduced by the pair once
    plan = uniform_plan(4, model="tiny-gpt", global_batch=4, micro_batches=2, pp=2)
    assert rows(charged_collectives(gpt, plan, 2), part=Part.TIED_EMBEDDING) == [("all_reduce", ("pp",), 2, 65536, 1)]
    [row] = [r for r in expected_collectives(gpt, plan, 2) if r.part == Part.TIED_EMBEDDING]
    assert (row.group_size, row.elements, row.difference) == (2, 65536, "")
    # pp 2 x dp 2: the executor reduces it over both ends' replicas in one group of 4
    plan = uniform_plan(4, model="tiny-gpt", global_batch=8, micro_batches=2, pp=2, dp=2)
    [row] = [r for r in expected_collectives(gpt, plan, 4) if r.part == Part.TIED_EMBEDDING]
    assert (row.group_size, row.elements, row.difference) == (4, 65536, Difference.TIED_ONE_GROUP)


def block_gathers(model, plan, world_size):
    """Per layer: the calls of its block-boundary all-gathers (0: none)."""
    rows = [r for r in expected_collectives(model, plan, world_size) if r.difference == Difference.BLOCK_GATHER]
    return [sum(r.calls for r in rows if r.layer == i) for i in range(len(plan.layers))]


def test_expected_differences_are_listed(gpt):
    # Megatron-SP, one micro-batch of 2 (16384 elements): the first block's input gradient gathered
    # in backward, the last block's output in forward, nothing between (the residual stream stays
    # split); each of the 4 layernorm parameters (128) all-reduced once
    plan = uniform_plan(4, model="tiny-gpt", global_batch=2, tp=2, sp="megatron")
    extra = sorted((str(r.op), r.elements, r.calls, r.difference) for r in expected_collectives(gpt, plan, 2)
                   if r.layer in (0, 3) and r.difference and r.part == Part.MODEL_PARALLEL)
    assert extra == [("all_gather", 16384, 1, Difference.BLOCK_GATHER)] * 2 + [
        ("all_reduce", 128, 4, Difference.SP_NORM_GRADS)] * 2
    assert block_gathers(gpt, plan, 2) == [1, 0, 0, 1]
    # cp 2 ring: 1 forward and 1 backward send (4 charged)
    plan = uniform_plan(4, model="tiny-gpt", global_batch=2, cp=2)
    sends = [r for r in expected_collectives(gpt, plan, 2) if r.layer == 0 and r.op == "send"]
    assert [(r.calls, r.difference) for r in sends] == [(2, Difference.CP_RING_KEEPS_KV)]
    # full recompute: tp's last all-reduce is not run again (6 charged, 5 run)
    plan = uniform_plan(4, model="tiny-gpt", global_batch=2, tp=2, recompute="full")
    [row] = [r for r in expected_collectives(gpt, plan, 2) if r.layer == 0 and r.part == Part.MODEL_PARALLEL]
    assert (row.calls, row.difference) == (5, Difference.RECOMPUTE_EARLY_STOP)


def test_block_gathers_only_where_the_split_ends(gpt):
    # 2 micro-batches: a block gathers its output (forward) where the next layer splits otherwise
    # or another chunk follows, its input gradient (backward) where the previous one did
    sp, tp = L(tp=2, sp="megatron"), L(tp=2)
    plan = Plan(pp=1, stage_layers=(4,), layers=(sp, sp, tp, sp), global_batch=4, micro_batches=2, model="tiny-gpt")
    assert block_gathers(gpt, plan, 2) == [2, 2, 0, 4]
    plan = uniform_plan(4, model="tiny-gpt", global_batch=4, micro_batches=2, pp=2, tp=2, sp="megatron")
    assert block_gathers(gpt, plan, 4) == [2, 2, 2, 2]
    # Ulysses beside Megatron-SP: different splits; cp under full recompute gathers its output again
    uly, cp = L(ulysses=2, sp="ulysses"), L(cp=2, recompute="full")
    plan = Plan(pp=1, stage_layers=(4,), layers=(sp, uly, uly, sp), global_batch=2, micro_batches=1, model="tiny-gpt")
    assert block_gathers(gpt, plan, 2) == [2, 1, 1, 2]
    plan = Plan(pp=1, stage_layers=(4,), layers=(cp,) * 4, global_batch=2, micro_batches=1, model="tiny-gpt")
    assert block_gathers(gpt, plan, 2) == [1, 0, 0, 2]
