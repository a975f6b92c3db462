"""Honest solver limits: time_limit_s bounds the whole call and is checked up front; ILP and
CP-SAT report the status, bound and gap their solver gave."""
import pytest

import cost_models
import planners
from planners import Budget
from specs import SpecError, load_cluster, load_model

MODEL, CLUSTER = load_model("tiny-gpt"), load_cluster("cpu-4")
CM = cost_models.get("analytical", CLUSTER)
BUDGET = Budget(memory_gib=8.0, global_batch=8)


@pytest.mark.parametrize("name", ["ilp", "cpsat"])
@pytest.mark.parametrize("bad", [float("nan"), -1.0, 0, "10", True, float("inf")])
def test_bad_time_limits_are_refused_up_front(name, bad):
    with pytest.raises(SpecError, match="time_limit_s: must be a finite number of seconds > 0"):
        planners.get(name).plan(MODEL, CLUSTER, BUDGET, CM, {"time_limit_s": bad})


@pytest.mark.parametrize("name", ["ilp", "cpsat"])
def test_a_spent_limit_stops_every_group_and_says_so(name):
    # 1 us is spent before the warm start's first table: no group may start, and the answer says why
    res = planners.get(name).plan(MODEL, CLUSTER, BUDGET, CM, {"time_limit_s": 1e-6})
    assert res.stats.solver_status == "time_limit" and not res.feasible
    assert res.message.startswith("time limit of 1e-06 s reached while building cost tables")


@pytest.mark.parametrize("name", ["ilp", "cpsat"])
def test_status_bound_and_gap_come_from_the_solver(name):
    res = planners.get(name).plan(MODEL, CLUSTER, BUDGET, CM, {"time_limit_s": 60, "warm_start": False})
    assert res.feasible and res.stats.solver_status == "optimal" and res.stats.gap == 0.0
    # the solver's proven bound sits at (within its tolerance) the plan's own iteration time
    assert res.stats.bound_s is not None
    assert res.stats.bound_s <= res.iteration_time_s * (1 + 1e-6)
    assert res.stats.bound_s >= res.iteration_time_s * (1 - 1e-3)


def test_the_lp_bound_obeys_what_is_left_of_the_limit():
    from planners.exact import lp_bound
    from planners.formulation import build
    from planners.outer import grouped_tables
    from planners.space import SearchSpace
    t = grouped_tables(MODEL, CM, BUDGET.memory_bytes, SearchSpace(), (8,))[0]
    f = build(t, next(iter(t.vocab)))
    assert 0 < lp_bound(f) < float("inf")
    assert lp_bound(f, 0.0) == float("-inf")  # no time left: no bound, so nothing is pruned by it
