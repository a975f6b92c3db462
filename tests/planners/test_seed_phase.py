"""The outer loop's seed phase: before any group is searched, every group's uniform recipes and
interleaved plans are scored, so a search stopped early still matches the tuned baselines."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
import planners
from planners import Budget, SearchSpace
from planners.outer import run_outer
from specs import load_cluster, load_model

MODEL, CLUSTER = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g:2")
CM = cost_models.get("analytical", CLUSTER)
BASELINES = ("megatron_3d", "deepspeed_3d", "megatron_sp_selective")


def _seeded_best(budget: Budget, seed: bool, space: SearchSpace = SearchSpace.preset("full")) -> float:
    """Best throughput the outer loop holds when every group search finds nothing."""
    state, _ = run_outer("test", MODEL, CM, budget.memory_bytes, space, budget.global_batches(),
                         lambda tables, incumbent_s: [], 3, {"model": MODEL.name, "cluster": CLUSTER.name},
                         seed=seed)
    return max((s[0] for s in state.solutions), default=0.0)


@pytest.mark.parametrize("gib", [16, 24])
def test_seeds_alone_reach_every_tuned_baseline(gib):
    budget = Budget(memory_gib=gib, global_batch=96)
    seeded = _seeded_best(budget, seed=True)
    for name in BASELINES:
        baseline = planners.get(name).plan(MODEL, CLUSTER, budget, CM)
        assert baseline.feasible
        assert seeded >= baseline.throughput_samples_per_s * (1 - 1e-9), (name, seeded)
    # without the uniform seeds only the interleaved plans are tried: less than the best baseline
    best = max(planners.get(n).plan(MODEL, CLUSTER, budget, CM).throughput_samples_per_s for n in BASELINES)
    interleaved_only = replace(SearchSpace.preset("full"), uniform_schedules=())
    assert _seeded_best(budget, seed=False, space=interleaved_only) < best
    # the zero-bubble schedules' uniform plans alone beat every baseline (1F1B or interleaved)
    assert _seeded_best(budget, seed=False) > best


@pytest.mark.parametrize("name", BASELINES)
def test_a_grid_baseline_returns_the_best_of_its_grid_with_gap_zero(name):
    """Every candidate of a baseline's grid is scored by plan_cost, so its plan is the fastest
    that fits and it proves so: gap 0, bound = its own time."""
    budget = Budget(memory_gib=16, global_batch=96)
    planner = planners.get(name)
    res = planner.plan(MODEL, CLUSTER, budget, CM)
    fitting = [t for _, t, peak, _ in planner._grid(MODEL, CLUSTER, 96, CM)[0] if peak <= budget.memory_bytes]
    assert len(fitting) > 1
    assert res.iteration_time_s == min(fitting)
    assert res.stats.gap == 0.0 and res.stats.bound_s == res.iteration_time_s
