"""Precision as a searched choice: the space's field, what the GPU and the cost model allow, the
planner option that fixes it, and an FP8 plan chosen where it pays."""
from __future__ import annotations

import pytest

import cost_models
from planners.base import Budget
from planners.registry import get
from planners.space import SearchSpace
from specs import SpecError, load_cluster, load_model

H100, A100, B200 = (load_cluster(n) for n in ("dgx-h100", "dgx-a100-80g", "dgx-b200"))


def test_presets_are_bf16_and_fp8_is_searched_on_request():
    assert SearchSpace().precisions == ("bf16",) and SearchSpace.preset("classic").precisions == ("bf16",)
    assert SearchSpace.preset("full").precisions == ("bf16",)
    searched = SearchSpace.preset("full").with_precision("search", H100.gpu)
    assert searched.precisions == ("bf16", "fp8-current")
    assert searched.for_gpu(A100.gpu).precisions == ("bf16",) and searched.for_gpu(H100.gpu) is searched
    galvatron = cost_models.get("galvatron", A100).capabilities
    assert searched.within(galvatron).precisions == ("bf16",)
    assert len(searched.stage_strategies(8)) == 2 * len(SearchSpace.preset("full").stage_strategies(8))


def test_with_precision_search_fixed_and_refused():
    space = SearchSpace()
    assert space.with_precision("search", H100.gpu).precisions == ("bf16", "fp8-current")
    assert space.with_precision("search", B200.gpu).precisions == ("bf16", "mxfp8")
    assert space.with_precision("search", A100.gpu).precisions == ("bf16",)
    assert space.with_precision("fp8", H100.gpu).precisions == ("fp8-current",)
    assert space.with_precision("fp8-delayed", H100.gpu).precisions == ("fp8-delayed",)
    with pytest.raises(SpecError, match=r"^precision: fp8-current needs an FP8 peak"):
        space.with_precision("fp8", A100.gpu)
    with pytest.raises(SpecError, match=r"^precision: a plan takes one FP8 recipe beside bf16, got fp8-delayed, "
                                        r"fp8-current$"):
        SearchSpace(precisions=("bf16", "fp8-delayed", "fp8-current"))


@pytest.fixture(scope="module")
def llama():
    return load_model("llama3-8b").with_seq_len(4096)


def test_the_planner_chooses_fp8_where_it_pays(llama):
    cm, budget = cost_models.get("analytical", H100), Budget(memory_gib=80, global_batch=32)
    bf16 = get("galvatron").plan(llama, H100, budget, cm, {})  # every preset is BF16
    searched = get("galvatron").plan(llama, H100, budget, cm, {"precision": "search"})
    assert all(s.precision == "bf16" for s in bf16.plan.layers)
    assert {s.precision for s in searched.plan.layers} == {"fp8-current"}  # one search per precision
    assert searched.iteration_time_s < bf16.iteration_time_s
    # the union counts both searches' work; its top plans are the best of both, best first
    assert searched.stats.states_explored > bf16.stats.states_explored
    thr = [k.throughput_samples_per_s for k in searched.top_k]
    assert thr == sorted(thr, reverse=True) and thr[0] == pytest.approx(searched.throughput_samples_per_s)
    assert thr[-1] > bf16.throughput_samples_per_s  # here the top 3 are all FP8
    fixed = get("megatron_3d").plan(llama, H100, budget, cm, {"precision": "fp8-delayed"})
    assert {s.precision for s in fixed.plan.layers} == {"fp8-delayed"}


def test_search_on_a_gpu_without_fp8_stays_bf16_and_fixed_fp8_is_refused(llama):
    cm, budget = cost_models.get("analytical", A100), Budget(memory_gib=80, global_batch=32)
    result = get("galvatron").plan(llama, A100, budget, cm, {"precision": "search"})
    assert {s.precision for s in result.plan.layers} == {"bf16"}
    with pytest.raises(SpecError, match="needs an FP8 peak"):
        get("zero3").plan(llama, A100, budget, cm, {"precision": "fp8"})
    with pytest.raises(SpecError, match=r"^target: precision: 'fp8': this planner plans in bf16 only"):
        get("target").plan(llama, H100, budget, cost_models.get("analytical", H100), {"precision": "fp8"})
