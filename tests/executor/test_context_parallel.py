"""Context parallelism runs with --check against the one-process reference: the K/V ring and the
all-gather variant, zigzag and contiguous chunks, beside dp with ZeRO, pp and recomputation."""
import pytest

import specs
from executor.checks import check_runnable
from executor.parallel.context import chunk_ids, positions
from specs import LayerStrategy as L
from specs import Plan, SpecError
from tests.executor.conftest import assert_matches_reference


def plan(stage_layers, layers, **kwargs):
    kwargs = {"global_batch": 4, "micro_batches": 2, **kwargs}
    return Plan(pp=len(stage_layers), stage_layers=tuple(stage_layers), layers=tuple(layers), **kwargs)


def test_zigzag_chunks_and_positions():
    # cp 2 over 8 tokens in 4 chunks of 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert chunk_ids(0, 2, "zigzag") == (0, 3) and chunk_ids(1, 2, "zigzag") == (1, 2)
    assert positions(0, 2, "zigzag", 8).tolist() == [0, 1, 6, 7]
    assert positions(1, 2, "none", 8).tolist() == [4, 5, 6, 7]


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


def test_ring_with_zero_pp_and_recomputation_on_4_ranks(tiny_gpt):
    assert_matches_reference(RING_ZERO_PP, tiny_gpt, 4)


def test_all_gather_contiguous_with_zero3_on_4_ranks():
    assert_matches_reference(ALL_GATHER_CONTIGUOUS, specs.load_model("tiny-llama"), 4)


@pytest.mark.slow
def test_cp_4_by_dp_2_on_8_ranks(tiny_gpt):
    assert_matches_reference(plan([4], [L(cp=4, dp=2, dp_type="zero2")] * 2 + [L(cp=8)] * 2,
                                  global_batch=4, micro_batches=2), tiny_gpt, 8)


def test_what_the_executor_refuses_under_cp(tiny_gpt):
    with pytest.raises(SpecError, match=r"^layer 0: cp 2 runs on dense blocks of full attention with tp 1 only"):
        check_runnable(tiny_gpt, plan([4], [L(tp=2, cp=2)] * 4), 4)
    with pytest.raises(SpecError, match=r"^executor cannot run layer 0: cp_comm a2a\+p2p"):
        check_runnable(tiny_gpt, plan([4], [L(ulysses=2, sp="ulysses", cp=2, cp_comm="a2a+p2p")] * 4), 4)
