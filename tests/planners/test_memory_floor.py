"""The per-segment memory bound (planners/memory_floor.py), with and without the integer count
bound of short identical segments (planners/counts.py), never exceeds a group's exact optimum
(random pipelines, identical and heterogeneous layers, T5- and Swin-like models, several budgets),
and it rules out a group the memory-blind bound cannot."""
from __future__ import annotations

import numpy as np
import pytest

from planners.memory_floor import _levels, _priced_min, memory_floor
from planners.outer import grouped_tables
from planners.segments import GroupDP
from tests.planners.test_gap import PIPE_SPACE, _case


def _floors_and_optima(seed: int):
    model, _, cm, budget = _case(seed)
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        dp = GroupDP(t, exact=True, even=False)
        recv = [None] + [dp._recv(k) for k in range(1, t.combo.pp)]
        for v in t.vocab:
            best = GroupDP(t, exact=True, even=False).solve(v)
            yield t, v, memory_floor(t, v, dp.bound_windows, recv), best, \
                memory_floor(t, v, dp.bound_windows, recv, counts=True)


def _check(seed: int) -> int:
    """Groups checked (some budgets fit nothing)."""
    checked = 0
    for t, v, floor, best, counted in _floors_and_optima(seed):
        assert counted >= floor * (1 - 1e-12), (t.combo, v, floor, counted)
        if best is None:
            continue
        assert counted <= best.objective_s * (1 + 1e-12), (t.combo, v, counted, best.objective_s)
        checked += 1
    return checked


@pytest.mark.parametrize("seed", range(6))
def test_the_memory_floor_is_below_every_group_optimum(seed):
    assert _check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 30))
def test_the_memory_floor_is_below_every_group_optimum_many(seed):
    _check(seed)


def test_the_memory_floor_can_beat_the_memory_blind_bound():
    """Somewhere on these instances memory binds, and the floor says so where the memory-blind
    bound (relaxed_objective) cannot."""
    lifted = 0
    for seed in range(6):
        for t, v, floor, best, _ in _floors_and_optima(seed):
            blind = GroupDP(t, exact=False, even=False).relaxed_objective(v)
            lifted += floor > blind * (1 + 1e-9)
    assert lifted


def test_levels_cover_every_temporary():
    """Every distinct temporary x lies in some (previous level, level] whose floor counts no more
    than x does: max(floor, embedding/head temporary) <= max(x, that temporary)."""
    temp = np.array([[0.0, 5.0, np.inf], [3.0, 9.0, 7.0]])
    for vocab_temp in (0.0, 4.0, 100.0):
        levels = _levels(temp, vocab_temp)
        prev = -np.inf
        for level, floor in levels:
            inside = [x for x in np.unique(temp[np.isfinite(temp)]) if prev < x <= level]
            assert all(max(floor, vocab_temp) <= max(x, vocab_temp) for x in inside)
            prev = level
        assert prev == 9.0


@pytest.mark.parametrize("seed", range(6))
def test_shared_memos_give_each_vocab_choice_its_own_floor(seed):
    """The memos in ComboTables.shared (count frontiers, the segment bounds of stages without
    embedding/head deltas) are shared with any_vocab_floor's merged choice, whose temporary levels
    differ: each vocab choice's floor is still the one computed on fresh tables."""
    from dataclasses import replace
    model, _, cm, budget = _case(seed)
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        dp = GroupDP(t, exact=False, even=False)
        recv = [None] + [dp._recv(k) for k in range(1, t.combo.pp)]
        fresh = {v: memory_floor(replace(t, shared={}), v, dp.bound_windows, recv, counts=True) for v in t.vocab}
        dp.any_vocab_floor(np.inf, tails=False)
        for v in reversed(list(t.vocab)):
            got = memory_floor(t, v, dp.bound_windows, recv, counts=True)
            assert got == pytest.approx(fresh[v], rel=1e-12, abs=0.0) or got == fresh[v], (t.combo, v, got, fresh[v])


@pytest.mark.parametrize("seed", range(5))
def test_priced_min_over_all_levels_is_each_levels_own_minimum(seed):
    """_priced_min's running minimum over the strategies sorted by temporary equals, level by
    level, the minimum over the strategies within that level (some strategies not allowed)."""
    rng = np.random.default_rng(seed)
    layers, strategies = 3, 40
    cost = rng.uniform(1, 10, (layers, strategies))
    mem = rng.uniform(0, 5, (layers, strategies))
    temp = rng.choice([0.0, 1.0, 2.0, 3.0, 5.0], (layers, strategies))
    cost[rng.random((layers, strategies)) < 0.2] = np.inf
    temp[rng.random((layers, strategies)) < 0.1] = np.inf
    levels, prices = np.array([0.0, 1.0, 2.5, 5.0]), np.array([0.0, 0.5, 3.0])
    got = _priced_min(cost, mem, temp, levels, prices)
    for li, level in enumerate(levels):
        ok = (temp <= level) & np.isfinite(cost)
        want = np.where(ok[None], cost[None] + prices[:, None, None] * mem[None], np.inf).min(axis=2)
        assert np.array_equal(got[li], want)



def _layers_floors(seed: int):
    """(group tables, its layers_floor, its memory-blind layers-only bound) of each group."""
    from planners.memory_floor import layers_floor
    from planners.outer import layers_lower_bound_s
    from planners.partition import stage_windows
    from planners.tables import build_layer_tables
    model, _, cm, budget = _case(seed)
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        layers = build_layer_tables(model, cm, t.combo, PIPE_SPACE, budget.memory_bytes)
        yield t, layers_floor(layers, stage_windows(len(t.layer_type), t.combo.pp, False)), \
            layers_lower_bound_s(layers)


@pytest.mark.parametrize("seed", range(6))
def test_the_layers_only_floor_is_below_every_vocab_choices_optimum(seed):
    """layers_floor, from a group's layer tables alone (no embedding, head, relayouts or sends),
    bounds the exact optimum of each of its vocab choices."""
    checked = 0
    for t, floor, _ in _layers_floors(seed):
        for v in t.vocab:
            best = GroupDP(t, exact=True, even=False).solve(v)
            if best is not None:
                assert floor <= best.objective_s * (1 + 1e-12), (t.combo, v, floor, best.objective_s)
                checked += 1
    assert checked


def test_the_layers_only_floor_can_beat_the_memory_blind_layers_only_bound():
    """Somewhere memory binds, and layers_floor says so where the memory-blind layers-only bound
    cannot: a group it rules out before its tables are completed."""
    assert any(floor > blind * (1 + 1e-9) for seed in range(6) for _, floor, blind in _layers_floors(seed))
