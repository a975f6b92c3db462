"""benchmarks/schedules.py on a small case: each row's plan runs its schedule, fits the budget,
and the cost model and the simulator agree on it within the benchmark's 3%."""
from __future__ import annotations

import pytest

import cost_models
from benchmarks.schedules import ROWS, UNIFORM_1F1B, best_of_schedule
from planners import Budget, SearchSpace
from specs import load_cluster, load_model


@pytest.fixture(scope="module")
def case():
    model, cluster = load_model("llama2-7b").scaled(num_layers=16), load_cluster("dgx-a100-80g:2")
    space = SearchSpace.preset("full")
    return model, cluster, cost_models.get("analytical", cluster), Budget(memory_gib=40, global_batch=64), space


@pytest.mark.parametrize("schedule, v", ROWS)
def test_each_row_runs_its_schedule_and_the_simulator_agrees(case, schedule, v):
    from simulator import simulate
    model, cluster, cm, budget, space = case
    res = best_of_schedule(model, cluster, budget, cm, space, schedule, v, time_limit_s=60)
    assert res.feasible, res.message
    expected = "1f1b" if schedule == UNIFORM_1F1B else schedule
    assert res.plan.schedule == expected
    if res.plan.pp > 1:
        assert res.plan.virtual_stages == v
    usable_gib = (budget.memory_bytes - cm.allocator_reserve_bytes(budget.memory_bytes)) / 2**30
    assert res.peak_memory_gib <= usable_gib + 1e-9
    sim = simulate(model, cluster, res.plan, cm)
    assert res.throughput_samples_per_s == pytest.approx(sim.throughput_samples_per_s, rel=0.03)


@pytest.mark.parametrize("schedule, v", [("zbv", 2), ("1f1b", 1)])
def test_a_row_the_time_limit_stops_says_so(case, schedule, v):
    """A spent limit gives a row without a plan whose message names the limit, not a crash."""
    model, cluster, cm, budget, space = case
    res = best_of_schedule(model, cluster, budget, cm, space, schedule, v, time_limit_s=1e-9)
    assert not res.feasible and res.stats.solver_status == "time_limit"
    assert "time limit of 1e-09 s reached" in res.message


def test_a_schedule_no_uniform_plan_fits_states_no_smallest_memory(case):
    """Where every uniform ZB-H1 plan fails plan_cost's memory, the row says so and claims no
    smallest memory (the tables' is 1F1B's, not the schedule's); 1F1B's own search states one."""
    model, cluster, cm, _, space = case
    tight = Budget(memory_gib=2, global_batch=64)  # no reserve under 20 GiB
    res = best_of_schedule(model, cluster, tight, cm, space, "zb_h1", 1, time_limit_s=60)
    assert not res.feasible and res.min_memory_gib is None
    assert res.message == "no uniform plan fits 2.0 GiB by plan_cost"
    one_f = best_of_schedule(model, cluster, tight, cm, space, "1f1b", 1, time_limit_s=60)
    assert not one_f.feasible and one_f.min_memory_gib > 2
