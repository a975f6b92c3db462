"""Context parallelism runs with --check against the one-process reference: the K/V ring and the
all-gather variant, zigzag and contiguous chunks, beside dp with ZeRO, pp and recomputation; cp
beside tp (with and without Megatron-SP) and beside Ulysses (a2a+p2p); a dropped ring fails."""
import dataclasses

import pytest

import specs
from cost_models.context import cp_groups
from executor import train
from executor.checks import check_runnable
from executor.parallel import context
from executor.parallel.context import chunk_ids, positions
from executor.parallel.layout import SplitLayout
from executor.run import run_plan
from specs import LayerStrategy as L
from specs import Plan, SpecError
from tests.executor.conftest import assert_matches_reference


def plan(stage_layers, layers, **kwargs):
    kwargs = {"global_batch": 4, "micro_batches": 2, **kwargs}
    return Plan(pp=len(stage_layers), stage_layers=tuple(stage_layers), layers=tuple(layers), **kwargs)


def usp(**kwargs):
    """A layer with Ulysses of degree 2 and a ring over cp 2 (Megatron's a2a+p2p)."""
    return L(ulysses=2, sp="ulysses", cp=2, cp_comm="a2a+p2p", **kwargs)


def test_zigzag_chunks_and_positions():
    # cp 2 over 8 tokens in 4 chunks of 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert chunk_ids(0, 2, "zigzag") == (0, 3) and chunk_ids(1, 2, "zigzag") == (1, 2)
    assert positions(0, 2, "zigzag", 8).tolist() == [0, 1, 6, 7]
    assert positions(1, 2, "none", 8).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("s,tp_groups,cp_sets,ulysses_sets", [
    # strided: dp fastest, then tp, then cp (rank = d + 2 t + 4 c)
    (L(tp=2, cp=2, dp=2, tp_consecutive=False), [[0, 2], [1, 3], [4, 6], [5, 7]], [(0, 4), (2, 6), (1, 5), (3, 7)],
     None),
    # consecutive: cp before ulysses (rank = c + 2 u + 4 d)
    (usp(dp=2), [[0], [1], [2], [3], [4], [5], [6], [7]], [(0, 1), (2, 3), (4, 5), (6, 7)],
     [(0, 2), (1, 3), (4, 6), (5, 7)]),
])
def test_split_layout_takes_its_groups_from_the_rank_grid(s, tp_groups, cp_sets, ulysses_sets):
    layout, grid = SplitLayout.of(s), specs.layer_grid(0, s.degrees)
    assert layout.table(2)[0].tolist() == tp_groups and layout.table(2)[1].tolist() == [
        [r + 8 for r in g] for g in tp_groups]
    assert [tuple(c) for c in layout.table(1)[0].T.tolist()] == list(grid.groups(specs.GRAD_SYNC_AXES))
    assert layout.sets(1, "cp") == cp_sets == list(grid.groups("cp")) == list(cp_groups(0, s))
    assert ulysses_sets is None or layout.sets(1, "ulysses") == ulysses_sets


def test_ring_on_2_ranks(tiny_gpt):
    assert_matches_reference(plan([4], [L(cp=2)] * 4, global_batch=2, micro_batches=1), tiny_gpt, 2)


RING_ZERO_PP = plan([2, 2], [L(cp=2, dp_type="zero1"), L(cp=2, dp_type="zero1", recompute="selective"),
                             L(dp=2), L(cp=2, dp_type="zero2", recompute="full")])
"""pp 2 on 2 ranks a stage: the ring with ZeRO-1 over cp (no dp replicas: the states shard over
the cp ranks), under selective recomputation, then relaid out to dp 2 and back to the ring with
ZeRO-2 and full recomputation; zigzag chunks."""

ALL_GATHER_CONTIGUOUS = plan([4], [L(cp=2, dp=2, cp_comm="all_gather", dp_type="zero3"), L(cp=4),
                                   L(tp=2, dp=2, sp="megatron"), L(cp=4, cp_comm="all_gather")],
                             cp_load_balance="none", micro_batches=1)
"""LLaMA (grouped-query heads): the all-gather variant with ZeRO-3 over cp x dp, the ring at cp 4,
beside Megatron-SP; contiguous chunks."""

CP_BY_TP_ZIGZAG = plan([4], [L(tp=2, cp=2, dp_type="zero3"),
                             L(tp=2, cp=2, sp="megatron", dp_type="zero1", recompute="selective"),
                             L(tp=2, cp=2, sp="megatron", cp_comm="all_gather", recompute="full"),
                             usp(dp_type="zero2")])
"""cp 2 x tp 2 on 4 ranks: heads split over tp, the ring over cp with the local heads, ZeRO-3
over the cp ranks holding the same tp shard; Megatron-SP splitting each cp chunk over tp, with
ZeRO-1 and selective recomputation; the all-gather variant under full recomputation; then the
ring inside Ulysses' all-to-alls (a2a+p2p) with ZeRO-2; zigzag chunks."""

USP_CONTIGUOUS = plan([4], [usp(), usp(dp_type="zero3", recompute="selective"),
                            L(tp=2, cp=2, sp="megatron", dp_type="zero2"), L(tp=2, dp=2)],
                      cp_load_balance="none")
"""LLaMA (grouped-query: kv heads repeated before the all-to-all, split over tp beside cp): a2a+p2p,
with ZeRO-3 over the whole stage and selective recomputation, cp 2 x tp 2 with Megatron-SP and
ZeRO-2, relaid out to tp 2 x dp 2; contiguous chunks."""


def test_ring_with_zero_pp_and_recomputation_on_4_ranks(tiny_gpt):
    assert_matches_reference(RING_ZERO_PP, tiny_gpt, 4)


def test_all_gather_contiguous_with_zero3_on_4_ranks():
    assert_matches_reference(ALL_GATHER_CONTIGUOUS, specs.load_model("tiny-llama"), 4)


def test_cp_by_tp_with_and_without_megatron_sp_and_ulysses_zigzag_on_4_ranks(tiny_gpt):
    assert_matches_reference(CP_BY_TP_ZIGZAG, tiny_gpt, 4)


def test_ulysses_ring_and_cp_by_tp_contiguous_on_4_ranks():
    assert_matches_reference(USP_CONTIGUOUS, specs.load_model("tiny-llama"), 4)


def ring_dropped(rank, world_size, model, plan, cfg):
    """train.worker whose context-parallel core attends to the rank's own K/V block only."""
    def own_block(self, _core, q, k, v, causal):
        mine = positions(self.rank, self.cp, self.order, self.seq)
        return context._block_attention(q, k, v, mine, mine, causal)[0]

    context.ContextCore.__call__ = own_block
    return train.worker(rank, world_size, model, plan, cfg)


def test_the_check_fails_when_the_ring_is_dropped_beside_tp_and_ulysses(tiny_gpt):
    p = plan([4], [L(tp=2, cp=2), usp()] * 2, global_batch=2, micro_batches=1)
    m = run_plan(p, tiny_gpt, world_size=4, steps=2, check=True, track_memory=False, timeout_s=180,
                 rank_fn=ring_dropped)
    assert not m.check.passed and m.check.grad_max_abs_diff > 1e-3
    assert not m.check.state_bytes_errors and not m.check.execution_errors


@pytest.mark.slow
def test_cp_4_by_dp_2_on_8_ranks(tiny_gpt):
    assert_matches_reference(plan([4], [L(cp=4, dp=2, dp_type="zero2")] * 2 + [L(cp=8)] * 2,
                                  global_batch=4, micro_batches=2), tiny_gpt, 8)


@pytest.mark.slow
@pytest.mark.parametrize("model,p", [
    pytest.param("tiny-gpt", plan([4], [L(tp=2, cp=2, dp=2, dp_type="zero1"),
                                        L(tp=2, cp=2, dp=2, dp_type="zero2", tp_consecutive=False),
                                        L(tp=2, cp=2, dp=2, sp="megatron", dp_type="zero3", tp_consecutive=False),
                                        L(tp=2, cp=2, dp=2, sp="megatron", dp_type="zero3")]),
                 id="cp2 x tp2 x dp2, zero1/2/3, strided"),
    pytest.param("tiny-llama", plan([2, 2], [L(tp=2, cp=2, sp="megatron"), L(tp=2, cp=2, dp_type="zero1"),
                                             L(tp=2, cp=2, sp="megatron", recompute="full"),
                                             L(tp=2, cp=2, cp_comm="all_gather")], micro_batches=4),
                 id="cp2 x tp2 under pp2 1f1b"),
    pytest.param("tiny-llama", plan([4], [usp(dp=2, dp_type="zero3"), usp(dp=2, dp_type="zero1", tp_consecutive=False),
                                          usp(dp=2, recompute="selective"), L(tp=2, cp=2, dp=2, dp_type="zero2")],
                                    cp_load_balance="none"),
                 id="cp2 x ulysses2 x dp2, contiguous"),
])
def test_cp_beside_tp_and_ulysses_on_8_ranks(model, p):
    assert_matches_reference(p, specs.load_model(model), 8)


def test_what_the_executor_refuses_under_cp(tiny_gpt):
    with pytest.raises(SpecError, match=r"^layer 0: cp 2 on a MoE layer is not run"):
        check_runnable(specs.load_model("tiny-moe"), plan([4], [L(cp=2, dp=2)] * 4), 4)
    swin = specs.load_model("swin-huge-32")  # layer 0: windows of 49 of its 3136 tokens
    with pytest.raises(SpecError, match=r"^layer 0: cp 2 with attention window 49 < seq 3136 is not run"):
        check_runnable(swin, plan([32], [L(cp=2)] + [L(dp=2)] * 31, micro_batches=1), 2)
    short = dataclasses.replace(tiny_gpt, layers=tuple(dataclasses.replace(s, seq_len=12) for s in tiny_gpt.layers))
    with pytest.raises(SpecError, match=r"^layer 0: sp megatron with cp 2: tp 4 does not divide the 6 tokens"):
        check_runnable(short, plan([4], [L(tp=4, cp=2, sp="megatron")] * 4), 8)


def test_cp_beside_tp_and_ulysses_is_accepted_before_launch(tiny_gpt):
    check_runnable(tiny_gpt, CP_BY_TP_ZIGZAG, 4)
    check_runnable(specs.load_model("tiny-llama"), USP_CONTIGUOUS, 4)
