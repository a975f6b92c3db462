"""The expert dispatcher as a choice of the search: the space's axis (all_to_all in every preset,
deepep or both when asked, dropped where the cost model cannot score it or the nodes are not NVLink),
the tables' layer times with the dispatcher's expert traffic, the plans stating it, and their
objective equal to plan_cost."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
import planners
from cost_models.profiled import ProfiledModel
from planners import Budget, SearchSpace
from planners.outer import combo_groups
from planners.tables import build_layer_tables
from specs import SpecError, load_cluster, load_model
from specs.axes import EPDispatcher

MODEL, CLUSTER = load_model("mixtral-8x7b"), load_cluster("dgx-h100:2")
BUDGET = Budget(memory_gib=80, global_batch=32)
SPACE = replace(SearchSpace.preset("moe"), pp_degrees=(1, 2), micro_batches=(4, 8), virtual_stages=(1,),
                recompute=("full",), dp_types=("zero1",)).with_ep_dispatcher("deepep")
"""Mixtral on 16 H100 (two nodes): its experts split over ep up to 16, across the nodes."""
PRESETS = ("full", "galvatron", "galvatron2", "classic", "dp+tp", "dp+pp", "3d", "dp", "zero3")


def test_every_preset_dispatches_with_the_all_to_all_and_deepep_is_asked_for():
    assert all(SearchSpace.preset(p).ep_dispatcher == (EPDispatcher.ALL_TO_ALL,) for p in PRESETS + ("moe",))
    both = SPACE.with_ep_dispatcher("search")
    assert [s.ep_dispatcher for _, s in both.one_choice_spaces(True)] == [(EPDispatcher.ALL_TO_ALL,),
                                                                         (EPDispatcher.DEEPEP,)]
    with pytest.raises(SpecError, match="ep_dispatcher"):
        SPACE.with_ep_dispatcher("nccl")
    with pytest.raises(SpecError, match="ep_dispatcher"):
        replace(SPACE, ep_dispatcher=("nccl",))
    with pytest.raises(SpecError, match="ep_dispatcher"):
        replace(SPACE, ep_dispatcher=(EPDispatcher.DEEPEP, EPDispatcher.DEEPEP))


def test_deepep_is_dropped_where_it_cannot_be_scored_or_run():
    assert SPACE.within(ProfiledModel.capabilities).ep_dispatcher == (EPDispatcher.ALL_TO_ALL,)
    assert SPACE.for_cluster(CLUSTER).ep_dispatcher == (EPDispatcher.DEEPEP,)
    pcie = replace(CLUSTER, intra_node=replace(CLUSTER.intra_node, kind="pcie"))
    assert SPACE.for_cluster(pcie).ep_dispatcher == (EPDispatcher.ALL_TO_ALL,)


def test_the_tables_charge_the_dispatchers_expert_traffic():
    """DeepSeek-V3's experts split over both nodes: deepep's tables are plan_cost's layer times
    under it, and cheaper than the all-to-all's where the split crosses the nodes."""
    model = load_model("deepseek-v3")
    cm = cost_models.get("analytical", CLUSTER)
    combo = combo_groups(model, cm, SPACE, (BUDGET.global_batch,))[0][0]
    deepep = build_layer_tables(model, cm, combo, SPACE, BUDGET.memory_bytes)
    plain = build_layer_tables(model, cm, combo, replace(SPACE, ep_dispatcher=(EPDispatcher.ALL_TO_ALL,)),
                               BUDGET.memory_bytes)
    assert deepep.ep_dispatcher == EPDispatcher.DEEPEP and plain.ep_dispatcher == EPDispatcher.ALL_TO_ALL
    cheaper = 0
    moe = next(i for i, t in enumerate(deepep.types) if t.moe is not None)
    for i, s in enumerate(deepep.strategies):
        if not deepep.allowed[moe, i]:
            continue
        mbs = max(1, combo.global_batch // (s.dp * combo.micro_batches))
        lt = cm.layer_time(deepep.types[moe], s, mbs, combo.micro_batches, 0)
        assert deepep.stages[0].time_s[moe, i] == pytest.approx(
            lt.overlapped_micro_batch_s(True, EPDispatcher.DEEPEP), rel=1e-12)
        cheaper += s.ep > 8 and deepep.stages[0].time_s[moe, i] < plain.stages[0].time_s[moe, i]
    assert cheaper  # an expert split across the nodes sends a token once per node under deepep


def test_the_search_states_deepep_and_its_objective_is_plan_cost():
    cm = cost_models.get("analytical", CLUSTER)
    space = replace(SPACE, ep_dispatcher=(EPDispatcher.ALL_TO_ALL,))
    res = planners.get("galvatron").plan(MODEL, CLUSTER, BUDGET, cm, {"space": space, "ep_dispatcher": "deepep"})
    assert res.feasible and res.stats.solver_status == "optimal"
    for ranked in res.top_k:
        plan = ranked.plan
        assert plan.ep_dispatcher == (EPDispatcher.DEEPEP if any(s.ep > 1 for s in plan.layers)
                                      else EPDispatcher.ALL_TO_ALL)
        assert ranked.iteration_time_s == pytest.approx(cm.plan_cost(MODEL, plan).iteration_time_s, rel=1e-9)
    assert any(s.ep > 1 for s in res.plan.layers)
