"""TP communication overlap as a choice of the search: the space's axis (off in every preset but
moe, Megatron-SP only beside tp > 1 when on, dropped where the cost model cannot score it), the tables'
layer times less the hidden TP time, the plans stating it, the Megatron baselines and the
framework targets that carry it."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import cost_models
import frameworks
import planners
from cost_models.galvatron import GalvatronModel
from cost_models.profiled import ProfiledModel
from planners import Budget, SearchSpace
from planners.outer import combo_groups, grouped_tables
from planners.segments import GroupDP
from planners.space import VocabChoice
from planners.tables import build_layer_tables
from planners.targets import target_space, uniform_plans
from specs import SequenceParallel, SpecError, load_cluster, load_model
from specs.capabilities import Capabilities
from specs.stack import SoftwareStack
from tests.planners.random_instances import SMALL_SPACE, OverlapCostModel, instance

MODEL, CLUSTER = load_model("llama2-13b"), load_cluster("dgx-h100")
BUDGET = Budget(memory_gib=40, global_batch=16)
SPACE = replace(SearchSpace.preset("galvatron2"), pp_degrees=(1, 2), dp_types=("zero1", "zero3"))
"""llama2-13b on 8 H100 at 40 GiB: tp 4 with Megatron-SP wins once its collectives are hidden."""
PRESETS = ("full", "moe", "galvatron", "galvatron2", "classic", "dp+tp", "dp+pp", "3d", "dp", "zero3")


@pytest.fixture(scope="module")
def analytical():
    return cost_models.get("analytical", CLUSTER)


def test_every_preset_is_off_and_on_keeps_megatron_sp_beside_tp():
    assert all(SearchSpace.preset(p).tp_comm_overlap == (False,) for p in PRESETS if p != "moe")
    assert SearchSpace.preset("moe").tp_comm_overlap == (True,)
    off, on = (SPACE.with_tp_overlap(v).stage_strategies(8, MODEL) for v in ("off", "on"))
    assert any(s.tp > 1 and s.sp == SequenceParallel.NONE for s in off)
    assert all(s.sp == SequenceParallel.MEGATRON for s in on if s.tp > 1) and any(s.tp > 1 for s in on)
    assert [s for s in on if s.tp == 1] == [s for s in off if s.tp == 1]  # Ulysses (tp 1) stays
    assert SPACE.with_tp_overlap("search").tp_comm_overlap == (False, True)
    with pytest.raises(SpecError, match="tp_comm_overlap"):
        SPACE.with_tp_overlap("sometimes")
    with pytest.raises(SpecError, match="tp_comm_overlap"):
        replace(SPACE, tp_comm_overlap=(1,))


def test_within_drops_on_where_it_cannot_be_scored():
    """On stays for a cost model that scores it on a stack that runs it (megatron-te, compile);
    the profiled and Galvatron models, the eager stack and a model stating no stack drop it."""
    space = SPACE.with_tp_overlap("search")
    for stack in ("megatron-te", "compile"):
        cm = cost_models.get("analytical", CLUSTER, stack=stack)
        assert space.within(cm.capabilities).tp_comm_overlap == (False, True), stack
    eager = cost_models.get("analytical", CLUSTER, stack="eager")
    te = frozenset({SoftwareStack.MEGATRON_TE})
    for caps in (eager.capabilities, ProfiledModel.capabilities, GalvatronModel.capabilities, Capabilities(),
                 replace(ProfiledModel.capabilities, stack=te)):
        assert space.within(caps).tp_comm_overlap == (False,), caps


def test_the_tables_take_each_layers_hidden_tp_time_off(analytical):
    """Under on, a layer's time in the tables is plan_cost's: micro_batch_s - tp_hidden_s."""
    space = SPACE.with_tp_overlap("on")
    combo = combo_groups(MODEL, analytical, space, (16,))[0][0]
    t = build_layer_tables(MODEL, analytical, combo, space, BUDGET.memory_bytes)
    off = build_layer_tables(MODEL, analytical, combo, SPACE, BUDGET.memory_bytes)
    assert t.overlap_stack == SoftwareStack.MEGATRON_TE and off.overlap_stack is None
    mbs = BUDGET.global_batch // combo.micro_batches
    hidden = 0
    for i, s in enumerate(t.strategies):
        if s.tp > 1 and t.allowed[0, i]:
            lt = analytical.layer_time(t.types[0], s, mbs // s.dp, combo.micro_batches, 0)
            assert t.stages[0].time_s[0, i] == pytest.approx(lt.micro_batch_s - lt.tp_hidden_s, rel=1e-12)
            hidden += lt.tp_hidden_s > 0
            j = off.strategies.index(s)
            assert off.stages[0].time_s[0, j] == pytest.approx(lt.micro_batch_s, rel=1e-12)
    assert hidden


def test_the_planner_picks_an_overlap_plan_whose_plan_cost_is_its_objective(analytical):
    """Searched both ways, galvatron's best plan runs tp 4 with Megatron-SP and overlap on (the
    off search keeps tp 1) and states the cost model's stack; the exact DP over its group's
    tables finds it with plan_cost's time as its objective."""
    off = planners.get("galvatron").plan(MODEL, CLUSTER, BUDGET, analytical, {"space": SPACE})
    both = planners.get("galvatron").plan(MODEL, CLUSTER, BUDGET, analytical,
                                          {"space": SPACE, "tp_comm_overlap": "search"})
    plan = both.plan
    assert plan.tp_comm_overlap and plan.stack == SoftwareStack.MEGATRON_TE and not off.plan.tp_comm_overlap
    assert both.stats.solver_status == "optimal" and both.throughput_samples_per_s > off.throughput_samples_per_s
    plan.validate(MODEL, CLUSTER)
    assert analytical.plan_cost(MODEL, plan).iteration_time_s == both.iteration_time_s
    assert "mismatch" not in both.message
    assert len({k.plan for k in both.top_k}) == len(both.top_k)  # the two searches' tp 1 plans once
    usable = BUDGET.memory_bytes - analytical.allocator_reserve_bytes(BUDGET.memory_bytes)
    on = SPACE.with_tp_overlap("on")
    t = next(t for t in grouped_tables(MODEL, analytical, usable, on, (16,))
             if (t.combo.pp, t.combo.micro_batches) == (plan.pp, plan.micro_batches))
    v = VocabChoice(plan.vocab_tp, plan.vocab_zero3, plan.vocab_sp)
    sol = GroupDP(t, exact=True, even=False).solve(v)
    found = t.plan(sol.choice, sol.stage_layers, v, {})
    assert found.tp_comm_overlap
    assert analytical.plan_cost(MODEL, found).iteration_time_s == pytest.approx(sol.objective_s, rel=1e-12)
    assert sol.objective_s == pytest.approx(both.iteration_time_s, rel=1e-12)


@pytest.mark.parametrize("seed", [1, 4, 7])
def test_the_exact_planners_agree_searching_overlap_both_ways(seed):
    model, cluster, _, budget = instance(seed)
    cm = OverlapCostModel(cluster, seed)
    space = replace(SMALL_SPACE, sp=("none", "megatron"), tp_comm_overlap=(False, True))
    found = {name: planners.get(name).plan(model, cluster, budget, cm, {"space": space, **opts})
             for name, opts in (("galvatron", {"mode": "exact"}), ("ilp", {"warm_start": False}))}
    assert len({r.feasible for r in found.values()}) == 1
    if found["ilp"].feasible:
        assert found["galvatron"].iteration_time_s == pytest.approx(found["ilp"].iteration_time_s, rel=1e-9)
        for r in found.values():
            assert r.stats.solver_status == "optimal"
            assert cm.plan_cost(model, r.plan).iteration_time_s == r.iteration_time_s


def test_the_megatron_baselines_overlap_where_tp_runs_megatron_sp(analytical):
    """megatron_3d turns overlap on for every tp > 1 plan (all Megatron-SP) under megatron-te, as
    NeMo's recipes do; deepspeed_3d never; under the eager stack nothing overlaps."""
    rows = planners.get("megatron_3d")._grid(MODEL, CLUSTER, 16, analytical)[0]
    tp_plans = [p for *_, p in rows if p.layers[0].tp > 1]
    assert tp_plans and all(p.tp_comm_overlap and p.stack == SoftwareStack.MEGATRON_TE for p in tp_plans)
    assert not any(p.tp_comm_overlap for *_, p in rows if p.layers[0].tp == 1)
    assert not any(p.tp_comm_overlap for *_, p in planners.get("deepspeed_3d")._grid(MODEL, CLUSTER, 16, analytical)[0])
    eager = cost_models.get("analytical", CLUSTER, stack="eager")
    assert not any(p.tp_comm_overlap for *_, p in planners.get("megatron_3d")._grid(MODEL, CLUSTER, 16, eager)[0])
    best = planners.get("megatron_3d").plan(MODEL, CLUSTER, BUDGET, analytical)
    assert best.feasible and analytical.plan_cost(MODEL, best.plan).iteration_time_s == best.iteration_time_s


def test_targets_that_carry_overlap():
    """Megatron's and torchtitan's spaces search it (and the unrestricted one); torchtitan's plans
    carry it only under compile (its async TP); DeepSpeed's and Galvatron's never."""
    assert all(target_space(t).tp_comm_overlap == (False, True) for t in ("none", "megatron", "torchtitan"))
    assert all(target_space(t).tp_comm_overlap == (False,) for t in ("deepspeed", "galvatron"))
    model, cluster = load_model("tiny-llama"), load_cluster("cpu-8")

    def overlapping(target, stack):
        return [p for p in uniform_plans(target, model, cluster, 16, target_space(target), stack) if p.tp_comm_overlap]

    megatron = overlapping("megatron", SoftwareStack.MEGATRON_TE)
    assert megatron and all(p.stack == SoftwareStack.MEGATRON_TE for p in megatron)
    frameworks.get("megatron").export(megatron[0], model, cluster)
    assert not overlapping("torchtitan", SoftwareStack.MEGATRON_TE)
    assert overlapping("torchtitan", SoftwareStack.COMPILE)
    found = planners.get("target_megatron").plan(model, cluster, Budget(memory_gib=1.5, global_batch=16),
                                                  cost_models.get("analytical", cluster))
    assert found.feasible and np.isfinite(found.iteration_time_s)
