"""The planners search context parallelism: the space's cp choices and rules, and a long sequence
where the best plan uses cp and beats every cp-free plan and Megatron's cp recipe."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
import planners
from cost_models.galvatron import GalvatronModel
from planners import Budget
from planners.space import SearchSpace, layer_allows
from specs import LayerStrategy, load_cluster, load_model

LONG = load_model("llama3-8b").with_seq_len(131072).scaled(num_layers=4)


def test_the_full_space_enumerates_cp_beside_tp_and_ulysses():
    space = SearchSpace.preset("full")
    found = {(s.tp, s.ulysses, s.cp, s.dp, s.cp_comm) for s in space.stage_strategies(16)}
    assert (2, 1, 4, 2, "p2p") in found and (2, 1, 4, 2, "all_gather") not in found
    assert (1, 2, 8, 1, "a2a+p2p") in found and (1, 2, 8, 1, "p2p") not in found
    assert (1, 1, 16, 1, "p2p") in found
    assert {s.cp for s in SearchSpace.preset("classic").stage_strategies(16)} == {1}
    with_ag = replace(space, cp_comm=("p2p", "all_gather", "a2a+p2p"))
    assert (2, 1, 4, 2, "all_gather") in {(s.tp, s.ulysses, s.cp, s.dp, s.cp_comm) for s in with_ag.stage_strategies(16)}
    # ranks keep >= 4096 tokens: none at 4096 tokens, cp 2 at 8192, all of 1..32 at 131072
    assert space.cp_choices(4096) == [1] and space.cp_choices(8192) == [1, 2]
    assert space.cp_choices(131072) == [1, 2, 4, 8, 16, 32]


def test_layer_allows_needs_2_cp_chunks():
    layer = load_model("llama3-8b").with_seq_len(80).layers[0]  # 80 = 16 * 5
    assert layer_allows(layer, LayerStrategy(cp=8), 1, 1) is True  # 2 * 8 = 16 divides 80
    assert layer_allows(layer, LayerStrategy(cp=16), 1, 1) is False  # 2 * 16 = 32 does not
    # a2a+p2p: 2 * cp * ulysses: 2 * 2 * 4 = 16 divides 80, 2 * 4 * 4 = 32 does not
    assert layer_allows(layer, LayerStrategy(cp=2, ulysses=4, sp="ulysses", cp_comm="a2a+p2p"), 1, 1) is True
    assert layer_allows(layer, LayerStrategy(cp=4, ulysses=4, sp="ulysses", cp_comm="a2a+p2p"), 1, 1) is False


def test_a_consumer_without_cp_keeps_it_out_of_the_search():
    space = SearchSpace.preset("full").within(GalvatronModel.capabilities)
    assert space.cp == (1,)


def test_at_128k_tokens_the_best_plan_uses_cp():
    """Llama-3-8B cut to 4 layers at 131072 tokens on 16 H100s: the full space finds a cp plan that
    beats every cp-free plan (the classic space, the Megatron/DeepSpeed grids) and ties or beats
    Megatron's long-context recipe (tp x cp x pp x dp grid, ZeRO-1)."""
    cluster = load_cluster("dgx-h100:2")
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=80, global_batch=4)
    best = planners.get("galvatron").plan(LONG, cluster, budget, cm)
    assert best.feasible and max(s.cp for s in best.plan.layers) > 1
    best.plan.validate(LONG, cluster)
    assert cm.plan_cost(LONG, best.plan).iteration_time_s == pytest.approx(best.iteration_time_s)
    recipe = planners.get("megatron_cp").plan(LONG, cluster, budget, cm)
    assert recipe.feasible and best.throughput_samples_per_s >= recipe.throughput_samples_per_s * (1 - 1e-12)
    for name in ("galvatron_classic", "megatron_3d", "deepspeed_3d", "megatron_sp_selective"):
        other = planners.get(name).plan(LONG, cluster, budget, cm)
        assert all(s.cp == 1 for s in other.plan.layers) if other.feasible else True
        if other.feasible:
            assert best.throughput_samples_per_s > other.throughput_samples_per_s, name


def test_at_128k_tokens_galvatron_is_at_least_every_registered_planner():
    """Every baseline, ablation and framework target on the same case (the exact solvers: test_zoo)."""
    cluster = load_cluster("dgx-h100:2")
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=80, global_batch=4)
    best = planners.get("galvatron").plan(LONG, cluster, budget, cm)
    feasible = 0
    for name in sorted(set(planners.available()) - {"galvatron", "ilp", "cpsat"}):
        other = planners.get(name).plan(LONG, cluster, budget, cm)
        if other.feasible:
            feasible += 1
            assert best.throughput_samples_per_s >= other.throughput_samples_per_s * (1 - 1e-12), name
    assert feasible >= 15  # the dp-only and pipeline-only baselines cannot hold 128k tokens
