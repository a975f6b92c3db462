"""Split-backward schedules in a search: the planners score their plans with plan_cost itself (the
uniform phase, planners.outer), so the memory a search holds them to is plan_cost's, what B keeps
for W included. On random instances at tight budgets, every uniform zero-bubble plan plan_cost
fits is scored (no table bound drops it) and none it rejects is kept."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import planners
from planners import outer
from specs import uniform_plan
from specs.schedules import schedule_entry
from tests.planners.random_instances import SMALL_SPACE, RandomCostModel, instance

SPACE = replace(SMALL_SPACE, micro_batches=(2, 4))


@pytest.fixture
def spied(monkeypatch):
    """(groups the uniform phase was asked about with their meta, plans it scored with plan_cost)."""
    groups, scored = [], []
    interleaved, keep = outer._interleaved, outer.OuterState.keep

    def spy_group(t, schedule, v, model, cost_model, budget_bytes, space, top_k, meta, state, deadline):
        groups.append((t, schedule, v, meta))
        return interleaved(t, schedule, v, model, cost_model, budget_bytes, space, top_k, meta, state, deadline)

    def spy_keep(self, cost_model, model, plan, budget_bytes):
        cost = keep(self, cost_model, model, plan, budget_bytes)
        scored.append((plan, cost))
        return cost

    monkeypatch.setattr(outer, "_interleaved", spy_group)
    monkeypatch.setattr(outer.OuterState, "keep", spy_keep)
    return groups, scored


def _zero_bubble_plans(model, global_batch: int, schedules=("zb_h1", "zbv")) -> list:
    """Uniform plans of ``model`` under ``schedules`` on two stages of the instances' 4 GPUs."""
    plans = []
    for schedule in schedules:
        v = schedule_entry(schedule).min_virtual_stages
        for tp, m in ((1, 2), (2, 2), (2, 4)):
            if len(model.layers) >= 2 * v:
                plans.append(uniform_plan(len(model.layers), tp=tp, dp=2 // tp, pp=2, global_batch=global_batch,
                                          micro_batches=m, schedule=schedule, virtual_stages=v))
    return plans


class LinearRandomCostModel(RandomCostModel):
    """Its memory is linear in the micro-batches in flight, and says so: the tables then bound
    which uniform plans can fit (planners.outer._interleaved_floor, _scheduled_fits)."""

    linear_in_flight = True


@pytest.mark.parametrize("seed", range(0, 24, 3))
@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("schedule, linear", [
    ("zb_h1", False), ("zb_h1", True), ("zbv", False), ("zbv", True), ("interleaved_1f1b", True)])
def test_every_uniform_schedule_plan_plan_cost_fits_is_scored(seed, quantile, schedule, linear, spied):
    """The budget is one such plan's peak exactly: it fits, some others do not. Interleaved 1F1B
    on odd layer counts lays out uneven chunks (the end ones a layer short), whose stages hold
    their chunk-micro-batches weighted by their layers (cost_models.stage_in_flight)."""
    groups, scored = spied
    model, cluster, cm, budget = instance(seed)
    cm = LinearRandomCostModel(cluster, seed) if linear else cm
    peaks = [cm.plan_cost(model, plan).peak_memory_bytes
             for plan in _zero_bubble_plans(model, budget.global_batch, (schedule,))]
    if not peaks:
        pytest.skip(f"{len(model.layers)} layers: too few for {schedule} on 2 stages")
    budget = replace(budget, memory_gib=float(np.quantile(peaks, quantile, method="nearest")) / 1024**3)
    space = replace(SPACE, uniform_schedules=(schedule,))
    planners.get("galvatron").plan(model, cluster, budget, cm, {"space": space, "mode": "exact", "top_k": 10**6})
    split = {p: cost for p, cost in scored if p.schedule == schedule}
    fits, entry = set(), schedule_entry(schedule)
    for t, asked, v, meta in groups:
        c = t.combo
        if asked != schedule or len(t.layer_type) < c.pp * v or not entry.allows(c.pp, c.micro_batches, v):
            continue
        for i in np.flatnonzero(t.allowed.all(axis=0)):
            plan = outer.uniform_schedule_plan(t, int(i), schedule, v, space, meta)
            if cm.plan_cost(model, plan).peak_memory_bytes <= budget.memory_bytes:
                fits.add(plan)
    assert fits <= set(split), f"{len(fits - set(split))} {schedule} plans that fit were not scored"
    assert all((cost is not None) == (p in fits) for p, cost in split.items())


class KeepsNothingForW(RandomCostModel):
    """The instances' cost model with a split backward's B keeping nothing for W."""

    def weight_wait_bytes(self, layer, strategy, micro_batch_size):
        return 0.0


def test_the_instances_exercise_what_b_keeps_for_w():
    """What B keeps for W decides whether some uniform zero-bubble plan of these instances fits."""
    decided = 0
    for seed in range(0, 24, 3):
        model, cluster, cm, budget = instance(seed)
        no_w = KeepsNothingForW(cluster, seed)
        plans = _zero_bubble_plans(model, budget.global_batch)
        peaks = [[c.plan_cost(model, plan).peak_memory_bytes for plan in plans] for c in (cm, no_w)]
        assert all(w >= none for w, none in zip(*peaks))
        for quantile in (0.2, 0.5, 0.8):
            cap = np.quantile(peaks[0], quantile, method="nearest")
            decided += sum(none <= cap < w for w, none in zip(*peaks))
    assert decided
