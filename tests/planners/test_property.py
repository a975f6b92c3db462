"""Random small instances: the exact DP, the MILP (HiGHS) and CP-SAT find the same optimum, every
plan is valid, fits, and is scored by plan_cost exactly as the planner predicted."""
from __future__ import annotations

import pytest

import planners
from tests.planners.random_instances import ENLARGED_SPACE, SMALL_SPACE, instance

SEEDS = range(50)
EXACT = (("galvatron", {"mode": "exact"}), ("ilp", {"warm_start": False}), ("cpsat", {"warm_start": False}))


def _run(seed, space=SMALL_SPACE):
    model, cluster, cm, budget = instance(seed)
    results = {name: planners.get(name).plan(model, cluster, budget, cm, {"space": space, **opts})
               for name, opts in EXACT}
    return model, cluster, cm, budget, results


ENLARGED_SEEDS = [s if s < 5 else pytest.param(s, marks=pytest.mark.slow) for s in SEEDS]
"""The enlarged space takes about a minute an instance here: five in the default run, all 50 with -m slow."""


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_planners_agree(seed):
    _check_agreement(seed, SMALL_SPACE)


@pytest.mark.parametrize("seed", ENLARGED_SEEDS)
def test_exact_planners_agree_on_the_enlarged_space(seed):
    """Selective recompute, Megatron-SP, Ulysses, vocabulary ZeRO-3/SP and interleaving added."""
    _check_agreement(seed, ENLARGED_SPACE)


def _check_agreement(seed, space):
    model, cluster, cm, budget, results = _run(seed, space)
    feasible = {n: r.feasible for n, r in results.items()}
    assert len(set(feasible.values())) == 1, feasible
    if not results["galvatron"].feasible:
        floors = {n: r.min_memory_gib for n, r in results.items()}
        assert all(f is not None and f > budget.memory_gib for f in floors.values()), floors
        return
    times = {n: r.iteration_time_s for n, r in results.items()}
    ref = times["ilp"]
    for name, t in times.items():
        assert t == pytest.approx(ref, rel=1e-9), times
    for name, r in results.items():
        assert r.stats.solver_status == "optimal"
        r.plan.validate(model, cluster)
        cost = cm.plan_cost(model, r.plan)
        assert cost.iteration_time_s == r.iteration_time_s
        assert cost.peak_memory_bytes <= budget.memory_bytes
        assert "mismatch" not in r.message


@pytest.mark.parametrize("seed", range(0, 50, 5))
def test_fast_mode_never_beats_exact(seed):
    """Fast mode returns a valid plan no better than the optimum (it is exact for pp = 1)."""
    model, cluster, cm, budget = instance(seed)
    fast = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": SMALL_SPACE})
    exact = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": SMALL_SPACE, "mode": "exact"})
    assert fast.feasible == exact.feasible
    if fast.feasible:
        assert fast.iteration_time_s >= exact.iteration_time_s * (1 - 1e-12)
        single = planners.get("galvatron").plan(model, cluster, budget, cm,
                                                {"space": _pp1(), "mode": "fast"})
        single_exact = planners.get("ilp").plan(model, cluster, budget, cm, {"space": _pp1()})
        assert single.feasible == single_exact.feasible
        if single.feasible:
            assert single.iteration_time_s == pytest.approx(single_exact.iteration_time_s, rel=1e-9)


def _pp1():
    from dataclasses import replace
    return replace(SMALL_SPACE, pp_degrees=(1,))


@pytest.mark.parametrize("seed", range(3, 50, 7))
def test_min_memory_is_the_threshold(seed):
    """Below the reported smallest memory nothing fits; at it, a plan does."""
    model, cluster, cm, budget = instance(seed)
    tiny = planners.Budget(memory_gib=1e-6, global_batch=budget.global_batch)
    res = planners.get("galvatron").plan(model, cluster, tiny, cm, {"space": SMALL_SPACE})
    assert not res.feasible and res.min_memory_gib is not None
    at = planners.Budget(memory_gib=res.min_memory_gib * (1 + 1e-9), global_batch=budget.global_batch)
    below = planners.Budget(memory_gib=res.min_memory_gib * (1 - 1e-6), global_batch=budget.global_batch)
    assert planners.get("galvatron").plan(model, cluster, at, cm, {"space": SMALL_SPACE}).feasible
    assert not planners.get("ilp").plan(model, cluster, below, cm, {"space": SMALL_SPACE}).feasible
