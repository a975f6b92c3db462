"""Targets restrict the search to what a framework runs; the plan found exports without refusal
and is never faster than the exact optimum of the unrestricted space."""
from __future__ import annotations

import pytest

import cost_models
import frameworks
from planners.base import Budget
from planners.registry import get
from planners.space import SearchSpace
from planners.targets import TARGETS, plan_for_target, target_space, uniform_plans
from specs import DPType, Recompute, SequenceParallel, SpecError, load_cluster, load_model

MODEL, CLUSTER = load_model("tiny-llama"), load_cluster("cpu-8")
BUDGET = Budget(memory_gib=1.5, global_batch=16)


@pytest.fixture(scope="module")
def cost_model():
    return cost_models.get("analytical", CLUSTER)


@pytest.fixture(scope="module")
def results(cost_model):
    return {t: plan_for_target(t, MODEL, CLUSTER, BUDGET, cost_model, top_k=20) for t in TARGETS}


def _plans(result):
    return [result.plan] + [r.plan for r in result.top_k]


def test_torchtitan_never_uses_zero1_and_megatron_never_zero2_or_zero3(results):
    for plan in _plans(results["torchtitan"]):
        assert all(s.dp_type != DPType.ZERO1 for s in plan.layers), plan.summary()
    for plan in _plans(results["megatron"]):
        assert all(s.dp_type in (DPType.DDP, DPType.ZERO1) for s in plan.layers), plan.summary()


def test_each_targets_plans_export_without_refusal(results):
    for target in ("megatron", "torchtitan", "deepspeed", "galvatron"):
        assert results[target].feasible, target
        for plan in _plans(results[target]):
            frameworks.get(target).export(plan, MODEL, CLUSTER)


def test_restricted_best_is_at_most_the_exact_unrestricted_optimum(results, cost_model):
    exact = get("galvatron").plan(MODEL, CLUSTER, BUDGET, cost_model,
                                  {"space": SearchSpace.preset("full"), "mode": "exact", "tp_comm_overlap": "search"})
    assert exact.feasible
    for target, r in results.items():
        assert r.throughput_samples_per_s <= exact.throughput_samples_per_s * (1 + 1e-9), target
        assert r.peak_memory_gib <= BUDGET.memory_gib


def test_the_dp_targets_search_the_budget_less_one_reserve(cost_model, monkeypatch):
    """The allocator reserve comes off the budget once: targets none and galvatron hand the DP
    what galvatron alone would search (80 GiB less 20%: 64 GiB), not that less 20% again."""
    from planners.galvatron import GalvatronPlanner
    seen, search = [], GalvatronPlanner._search

    def spy(self, model, cluster, budget, cm, options, *deadline):
        seen.append(budget.memory_gib)
        return search(self, model, cluster, budget, cm, options, *deadline)

    monkeypatch.setattr(GalvatronPlanner, "_search", spy)
    budget = Budget(memory_gib=80, global_batch=16)
    for target in ("none", "galvatron"):
        plan_for_target(target, MODEL, CLUSTER, budget, cost_model)
    get("galvatron").plan(MODEL, CLUSTER, budget, cost_model)
    assert seen and all(gib == pytest.approx(64.0) for gib in seen), seen


def test_uniform_targets_search_every_launchable_uniform_plan(cost_model):
    plans = list(uniform_plans("deepspeed", MODEL, CLUSTER, 16, target_space("deepspeed")))
    assert plans and all(len(set(p.layers)) == 1 for p in plans)
    assert {p.layers[0].sp for p in plans} == set(SequenceParallel)
    # its pipeline engine runs ZeRO 0/1 only: no pp > 1 plan shards gradients or parameters
    assert not [p for p in plans if p.pp > 1 and p.layers[0].dp_type in (DPType.ZERO2, DPType.ZERO3)]
    assert any(p.pp == 1 and p.layers[0].dp_type == DPType.ZERO3 for p in plans)


def test_target_spaces_hold_the_frameworks_flavours():
    full = SearchSpace.preset("full")
    assert DPType.ZERO1 not in full.for_target("torchtitan").dp_types
    assert Recompute.SELECTIVE not in target_space("torchtitan").recompute
    assert set(target_space("megatron").dp_types) == {DPType.DDP, DPType.ZERO1}
    assert SequenceParallel.ULYSSES not in target_space("megatron").sp
    assert target_space("galvatron").virtual_stages == (1,)
    # context parallelism: only Megatron's and Galvatron's files carry it
    assert target_space("megatron").cp == full.cp == target_space("galvatron").cp and len(full.cp) > 1
    assert all(target_space(t).cp == (1,) for t in ("torchtitan", "deepspeed"))
    assert set(target_space("galvatron").cp_comm) <= {"p2p", "a2a+p2p"}
    with pytest.raises(SpecError, match="unknown target"):
        target_space("jax")


def test_each_target_is_also_a_registered_planner(results, cost_model):
    for target in TARGETS[1:]:
        r = get(f"target_{target}").plan(MODEL, CLUSTER, BUDGET, cost_model)
        assert r.planner == f"target_{target}" and r.plan == results[target].plan, target


def test_torchtitans_per_op_ac_is_searched_where_the_cost_model_runs_it():
    # Llama 3 8B on 8 H100s at 60 GiB: dp 8 keeping every activation does not fit (60 GiB less the
    # allocator reserve); under the eager stack dp 8 with torchtitan's per-op policy (41 GiB) beats
    # every tp 2 plan that keeps them; a Megatron-TE model cannot price the policy, so it is not
    # searched there
    model, cluster = load_model("llama3-8b").with_seq_len(8192), load_cluster("dgx-h100:1")
    budget = Budget(memory_gib=60, global_batch=16)
    eager = plan_for_target("torchtitan", model, cluster, budget, cost_models.get("analytical", cluster, stack="eager"))
    assert {s.recompute for s in eager.plan.layers} == {Recompute.SELECTIVE_OP}
    fused = plan_for_target("torchtitan", model, cluster, budget, cost_models.get("analytical", cluster))
    assert Recompute.SELECTIVE_OP not in {s.recompute for s in fused.plan.layers}
    assert all(Recompute.SELECTIVE_OP not in {s.recompute for s in r.plan.layers} for r in fused.top_k)
    frameworks.get("torchtitan").export(eager.plan, model, cluster)


def test_megatron_and_deepspeed_targets_never_search_the_per_op_policy():
    for target in ("megatron", "deepspeed", "galvatron"):
        assert Recompute.SELECTIVE_OP not in target_space(target).recompute, target
    assert Recompute.SELECTIVE_OP in target_space("torchtitan").recompute
