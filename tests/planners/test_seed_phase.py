"""The outer loop's seed phase: before any group is searched, every group's uniform recipes and
interleaved plans are scored, so a search stopped early still matches the tuned baselines."""
from __future__ import annotations

import pytest

import cost_models
import planners
from planners import Budget, SearchSpace
from planners.outer import run_outer
from specs import load_cluster, load_model

MODEL, CLUSTER = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g:2")
CM = cost_models.get("analytical", CLUSTER)
BASELINES = ("megatron_3d", "deepspeed_3d", "megatron_sp_selective")


def _seeded_best(budget: Budget, seed: bool) -> float:
    """Best throughput the outer loop holds when every group search finds nothing."""
    state, _ = run_outer("test", MODEL, CM, budget.memory_bytes, SearchSpace.preset("full"), budget.global_batches(),
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
    assert _seeded_best(budget, seed=False) < max(planners.get(n).plan(MODEL, CLUSTER, budget, CM)
                                                  .throughput_samples_per_s for n in BASELINES)
