"""The bound that spares plan_cost on uniform interleaved, zero-bubble and V-shaped plans
(outer.uniform_plan_floor_s) never exceeds plan_cost's time, on random instances."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planners import outer
from planners.outer import grouped_tables, uniform_plan_floor_s, uniform_schedule_plan
from cost_models import in_flight
from specs import Schedule
from specs.schedules import schedule_entry
from tests.planners.random_instances import SMALL_SPACE, instance, tiny_model

SCHEDULES = ((Schedule.INTERLEAVED_1F1B, 2), (Schedule.ZB_H1, 1), (Schedule.ZBV, 2), (Schedule.DUALPIPE_V, 2),
             (Schedule.LOOPED_BFS, 2))
SPACE = replace(SMALL_SPACE, max_pp=4, micro_batches=(2, 4, 8), dp_types=("ddp", "zero1", "zero3"),
                sp=("none", "megatron"), vocab_sp=("none", "megatron"))


@pytest.mark.parametrize("seed", range(8))
def test_the_floor_never_exceeds_plan_cost(seed):
    model, _, cm, budget = instance(seed)
    model = tiny_model(8, identical=seed % 3 == 0)
    checked, tight = 0, 0
    for t in grouped_tables(model, cm, budget.memory_bytes, SPACE, (16,)):
        c = t.combo
        for schedule, v in SCHEDULES:
            if c.pp == 1 or not schedule_entry(schedule).allows(c.pp, c.micro_batches, v):
                continue
            for i in np.flatnonzero(t.allowed.all(axis=0)):
                plan = uniform_schedule_plan(t, int(i), schedule, v, SPACE, {})
                floor = uniform_plan_floor_s(t, cm, model, plan, int(i))
                cost = cm.plan_cost(model, plan).iteration_time_s
                assert 0 < floor <= cost * (1 + 1e-12), (plan.summary(), floor, cost)
                checked += 1
                tight += floor > 0.9 * cost
    assert checked > 50
    assert tight  # the bound is not trivially low


@pytest.mark.parametrize("seed", range(6))
def test_the_tables_floor_holds_each_stage_to_its_own_layers(seed):
    """The first bound (outer._interleaved_floor, the layers alone) on models whose layers differ:
    interleaved and V-shaped stages hold chunks apart, so a stage's sums are over its own layers,
    not a contiguous run of as many."""
    model, _, cm, budget = instance(seed)
    model = tiny_model(8, identical=False)
    checked = 0
    for t in grouped_tables(model, cm, budget.memory_bytes, SPACE, (16,)):
        c, uniform = t.combo, np.flatnonzero(t.allowed.all(axis=0))
        for schedule, v in SCHEDULES:
            entry = schedule_entry(schedule)
            if c.pp == 1 or not entry.allows(c.pp, c.micro_batches, v) or not len(uniform):
                continue
            plans = [uniform_schedule_plan(t, int(i), schedule, v, SPACE, {}) for i in uniform]
            ids = tuple(tuple(r) for r in plans[0].stage_ranges())
            floors = outer._interleaved_floor(t, uniform, entry.formula(c.micro_batches, v), ids)
            for plan, floor in zip(plans, floors):
                assert floor <= cm.plan_cost(model, plan).iteration_time_s * (1 + 1e-12), plan.summary()
                checked += 1
    assert checked > 50


def test_the_1f1b_prefilter_holds_where_outer_uses_it():
    """outer.holds_1f1b_count: where it says so, every stage holds at least 1F1B's count, and
    ZB-V below 2 pp micro-batches is a case where a stage holds fewer (so the 1F1B tables alone
    would skip plans that fit)."""
    fewer = []
    for schedule, v in SCHEDULES:
        entry = schedule_entry(schedule)
        for pp in (2, 3, 4, 8, 16):
            for m in range(1, 4 * pp + 1):
                if not entry.allows(pp, m, v):
                    continue
                for k in range(pp):
                    held, one_f = in_flight(schedule, pp, k, m, v), in_flight(Schedule.ONE_F_ONE_B, pp, k, m)
                    if held < one_f:
                        fewer.append((schedule, pp, m))
                        assert not outer.holds_1f1b_count(schedule, pp, m), (schedule, pp, m, k, held, one_f)
    assert (Schedule.ZBV, 2, 2) in fewer


@pytest.mark.parametrize("seed", range(6))
def test_the_fits_prefilter_keeps_every_plan_plan_cost_fits_on_uneven_chunks(seed):
    """outer._scheduled_fits on interleaved layouts of uneven chunks (10 layers on pp 2 x v 2:
    2 + 3 + 3 + 2; on pp 4 x v 2: 1 + 2 + 2 + 1 x 5): at a budget of each plan's own peak under
    plan_cost, the prefilter lets the plan through. Its stages hold chunk-micro-batches weighted
    by their layers, as plan_cost's do (cost_models.stage_in_flight)."""
    from tests.planners.test_split_backward_memory import LinearRandomCostModel
    _, cluster, _, budget = instance(seed)
    cm = LinearRandomCostModel(cluster, seed)
    model = tiny_model(10, identical=True)
    checked = 0
    for t in grouped_tables(model, cm, budget.memory_bytes * 100, SPACE, (16,)):
        c, uniform = t.combo, np.flatnonzero(t.allowed.all(axis=0))
        if c.pp == 1 or not len(uniform) or not schedule_entry("interleaved_1f1b").allows(c.pp, c.micro_batches, 2):
            continue
        plans = [uniform_schedule_plan(t, int(i), "interleaved_1f1b", 2, SPACE, {}) for i in uniform]
        assert len(set(plans[0].layers_per_chunk())) > 1
        ids = tuple(tuple(r) for r in plans[0].stage_ranges())
        for pos, plan in enumerate(plans):
            tight = replace(t, budget_bytes=cm.plan_cost(model, plan).peak_memory_bytes)
            assert outer._scheduled_fits(tight, uniform, plans[0], ids)[pos], plan.summary()
            checked += 1
    assert checked > 20
