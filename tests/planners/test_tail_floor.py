"""The tail-cap bound (planners/tail_floor.py) never exceeds a group's exact optimum (random
pipelines, identical and heterogeneous layers, T5- and Swin-like models), and it lifts the
memory-blind bound (which counts the largest tail as the mean) somewhere."""
from __future__ import annotations

import pytest

from planners.outer import grouped_tables
from planners.segments import GroupDP
from tests.planners.test_gap import PIPE_SPACE, _case


def _groups(seed: int):
    model, _, cm, budget = _case(seed)
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        if t.combo.pp == 1:
            continue
        for v in t.vocab:
            dp = GroupDP(t, exact=False, even=False)
            yield dp, v, GroupDP(t, exact=True, even=False).solve(v)


@pytest.mark.parametrize("seed", range(6))
def test_the_tail_floor_is_below_every_group_optimum(seed):
    for dp, v, best in _groups(seed):
        if best is not None:
            floor = dp.tail_floor(v)
            assert floor <= best.objective_s * (1 + 1e-12), (dp.t.combo, v, floor, best.objective_s)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 24))
def test_the_tail_floor_is_below_every_group_optimum_many(seed):
    test_the_tail_floor_is_below_every_group_optimum(seed)


def test_the_tail_floor_lifts_the_memory_blind_bound_somewhere():
    lifted = 0
    for seed in range(6):
        for dp, v, best in _groups(seed):
            lifted += dp.tail_floor(v) > dp.relaxed_objective(v) * (1 + 1e-9)
    assert lifted


def test_a_bound_already_held_stops_the_tail_caps_early_and_changes_nothing(monkeypatch):
    """With ``known_s`` the result is max(known_s, the bound without it): the search stops only
    once no refinement could exceed known_s, so it loses nothing; and it stops early where the
    memory-blind bound is already the larger (fewer partition bounds computed)."""
    from planners import tail_floor as module

    calls = []
    capped = module._capped
    monkeypatch.setattr(module, "_capped", lambda *a: calls.append(1) or capped(*a))
    fewer = 0
    for seed in range(6):
        for dp, v, best in _groups(seed):
            calls.clear()
            alone = dp.tail_floor(v)
            evaluated = len(calls)
            blind = dp.relaxed_objective(v)
            for known in (0.0, alone * (1 - 1e-6), alone, blind, alone * 1.5):
                calls.clear()
                assert dp.tail_floor(v, known_s=known) == max(known, alone), (dp.t.combo, v, known, alone)
                assert len(calls) <= evaluated
                fewer += known >= alone * 1.5 and len(calls) < evaluated
    assert fewer
