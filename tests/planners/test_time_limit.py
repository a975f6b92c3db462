"""time_limit_s from the first second: a limit that passes while the cost tables are built, the
seeds scored or the groups searched stops the call there, which returns the best plan so far with
its bound and gap, or says in one line that it has none. The clock of these tests is a counter
(every reading one second later), so where a limit passes depends on the search's steps, never on
the machine."""
from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

import cost_models
import planners
from planners import Budget
from specs import SpecError, load_cluster, load_model
from tests.planners.random_instances import RandomCostModel
from tests.planners.test_gap import PIPE_SPACE, _case


class StepClock:
    """A stand-in for time.monotonic: each reading is one second after the one before."""

    def __init__(self) -> None:
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return float(self.readings)


def _run(name: str, limit_s: float, monkeypatch) -> tuple[planners.PlanResult, int]:
    """``name`` on a fresh cost model (no table cached) under ``limit_s`` seconds of StepClock,
    and how many readings the call took."""
    model, cluster, _, budget = _case(1)
    clock = StepClock()
    searches = "space" in getattr(planners.get(name), "defaults", {})  # not a grid baseline
    options = {"time_limit_s": limit_s} | ({"space": PIPE_SPACE} if searches else {})
    with monkeypatch.context() as patch:
        patch.setattr(time, "monotonic", clock)
        res = planners.get(name).plan(model, cluster, replace(budget, memory_gib=budget.memory_gib * 4),
                                      RandomCostModel(cluster, 1), options)
    return res, clock.readings


@pytest.mark.parametrize("name", ["galvatron", "galvatron_classic", "ilp", "cpsat"])
def test_a_limit_spent_before_any_table_says_so_in_one_line(name):
    model, cluster, _, budget = _case(1)
    res = planners.get(name).plan(model, cluster, budget, RandomCostModel(cluster, 1),
                                  {"space": PIPE_SPACE, "time_limit_s": 1e-9})
    assert not res.feasible and res.stats.solver_status == "time_limit"
    assert res.message.startswith("time limit of 1e-09 s reached while building cost tables (0 of ")
    assert res.message.endswith("no plan found before it") and "\n" not in res.message
    assert res.min_memory_gib is None  # groups not built may hold plans: no smallest memory is claimed


@pytest.mark.parametrize("name, outcomes", [
    ("galvatron", {"none", "plan and gap"}), ("galvatron_classic", {"none", "plan and gap"}),
    # the exact planners' warm start (galvatron) may end with a plan before their own groups are built
    ("ilp", {"none", "plan, no bound", "plan and gap"}), ("cpsat", {"none", "plan, no bound", "plan and gap"})])
def test_a_limit_passing_at_any_step_returns_the_best_plan_so_far_or_none(name, outcomes, monkeypatch):
    unlimited, readings = _run(name, 1e9, monkeypatch)
    assert unlimited.feasible and unlimited.stats.solver_status == "optimal"
    seen = set()
    best_so_far = 0.0
    for share in (0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99):
        res, _ = _run(name, readings * share, monkeypatch)
        assert res.stats.solver_status == "time_limit" and "\n" not in res.message
        assert res.message.startswith(f"time limit of {readings * share:g} s reached while ")
        if not res.feasible:
            assert best_so_far == 0.0 and res.message.endswith("no plan found before it")
            seen.add("none")
            continue
        # a later stop has run every step of an earlier one: its plan is at least as good
        assert res.throughput_samples_per_s >= best_so_far
        best_so_far = res.throughput_samples_per_s
        assert res.throughput_samples_per_s <= unlimited.throughput_samples_per_s * (1 + 1e-12)
        if res.stats.gap is None:  # some group's tables not built: nothing bounds it
            assert res.stats.bound_s is None and "the best plan so far, no bound" in res.message
            seen.add("plan, no bound")
            continue
        assert 0.0 <= res.stats.gap < 1.0 and f"the best plan so far, gap {res.stats.gap:.2%}" in res.message
        assert res.stats.bound_s <= unlimited.iteration_time_s * (1 + 1e-9)  # the bound holds
        seen.add("plan and gap")
    assert seen == outcomes


@pytest.mark.parametrize("name", ["megatron_3d", "megatron_moe"])
def test_a_grid_baseline_stopped_returns_its_best_plan_so_far_or_none(name, monkeypatch):
    unlimited, readings = _run(name, 1e9, monkeypatch)
    assert unlimited.feasible and unlimited.stats.solver_status == "exhaustive" and unlimited.stats.gap == 0.0
    outcomes = set()
    for limit_s in (0.5, readings / 2):  # passed at the first check; half-way
        res, _ = _run(name, limit_s, monkeypatch)
        assert res.stats.solver_status == "time_limit" and "\n" not in res.message
        assert res.message.startswith(f"time limit of {limit_s:g} s reached while scoring the grid (")
        if res.feasible:  # the plans not scored bound nothing
            assert res.stats.gap is None and res.message.endswith("the best plan so far, no bound")
            assert res.throughput_samples_per_s <= unlimited.throughput_samples_per_s
        outcomes.add(res.feasible)
    assert outcomes == {False, True}


def test_a_limit_passing_between_precisions_leaves_the_union_without_a_bound(monkeypatch):
    """precision_per=plan searches bf16, then FP8: a limit that passes as the bf16 search ends
    keeps its plan, and the FP8 space, not searched, bounds nothing."""
    model, cluster, budget = load_model("tiny-gpt"), load_cluster("dgx-h100"), Budget(memory_gib=80, global_batch=16)

    def run(precision: str, limit_s: float) -> tuple[planners.PlanResult, int]:
        clock = StepClock()
        with monkeypatch.context() as patch:
            patch.setattr(time, "monotonic", clock)
            res = planners.get("galvatron").plan(model, cluster, budget, cost_models.get("analytical", cluster),
                                                 {"precision": precision, "time_limit_s": limit_s})
        return res, clock.readings

    bf16, readings = run("bf16", 1e9)  # its deadline takes one reading, as the two searches' does
    assert bf16.stats.solver_status == "optimal"
    both, _ = run("search", 1e9)
    assert both.stats.solver_status == "optimal" and both.stats.gap == 0.0
    stopped, _ = run("search", readings - 0.5)  # passes after the bf16 search's last reading
    assert stopped.plan == bf16.plan and stopped.stats.solver_status == "time_limit"
    assert stopped.stats.gap is None and stopped.stats.bound_s is None
    assert stopped.message == f"time limit of {readings - 0.5:g} s reached before the fp8-current search: " \
                              "the best plan so far, no bound"


def test_cost_tables_that_would_not_fit_in_memory_stop_before_building(monkeypatch):
    import planners.outer as outer
    from planners.tables import cached_table_bytes, relayout_table_bytes
    model, cluster = load_model("gpt3-175b").scaled(num_layers=8), load_cluster("dgx-a100-80g:2")
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=80, global_batch=64)
    one_group = relayout_table_bytes(model, cm, planners.SearchSpace.preset("full"), 1)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setattr(outer, "TABLE_MEMORY_FRACTION", one_group / physical)  # room for one group's tables
    with pytest.raises(SpecError, match=r"^space: cost tables would need [0-9.]+ GiB for \d+ \(global batch, pp, "
                                        r"micro-batch\) groups \(\d+ strategies per stage at 16 GPUs\) beside 0.0 GiB"):
        planners.get("galvatron").plan(model, cluster, budget, cm)
    assert cached_table_bytes(cm) == 0  # nothing was built
    monkeypatch.setattr(outer, "TABLE_MEMORY_FRACTION", 0.5)
    assert planners.get("galvatron").plan(model, cluster, budget, cm).feasible
    assert cached_table_bytes(cm) > one_group  # the search's tables, counted as they were cached
