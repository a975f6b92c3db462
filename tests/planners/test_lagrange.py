"""The Lagrangian memory bound with per-stage prices: its subgradient is the minimiser's stage
sums, and the prices it reaches never lift it above the group's exact optimum."""
from __future__ import annotations

import numpy as np
import pytest

from planners import lagrange
from planners.lagrange import Prices, lagrangian_bound, relaxation
from planners.outer import grouped_tables
from planners.segments import GroupDP
from tests.planners.test_fast_bounds import PIPE_SPACE, _pipe_instance


def _pipeline_groups(seed: int):
    model, _, cm, budget = _pipe_instance(seed)
    return [t for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)) if t.combo.pp > 1]


def _caps(t, v) -> np.ndarray:
    return np.array([t.budget_bytes - vc.memory_bytes - vc.temp_bytes for vc in t.vocab[v]])


@pytest.mark.parametrize("seed", [0, 2, 13])
def test_the_minimiser_stage_sums_give_the_relaxation_value(seed):
    """At random prices the value is sum_k (c_k T_k + u_k D_k + mu_k memory_k) - mu . cap of the
    plan that attains it (so the sums are a subgradient)."""
    rng = np.random.default_rng(seed)
    checked = 0
    for t in _pipeline_groups(seed):
        pp, m = t.combo.pp, t.combo.micro_batches
        for v in t.vocab:
            caps = _caps(t, v)
            prices = Prices(rng.dirichlet(np.ones(pp)), rng.dirichlet(np.ones(pp)),
                            rng.uniform(0, 1e-9, pp) * (rng.random(pp) < 0.7))
            value, sums = relaxation(t, v, prices, caps, even=False, deadline=None, path=True)
            if not np.isfinite(value):
                continue
            c = 1 + (m - 1) * prices.theta
            again = np.sum(c * sums.T + prices.u * sums.D + prices.mu * sums.memory) - prices.mu @ caps
            assert again == pytest.approx(value, rel=1e-9, abs=1e-12), (t.combo, v)
            assert relaxation(t, v, prices, caps, even=False, deadline=None)[0] == pytest.approx(value, rel=1e-12)
            checked += 1
    assert checked


@pytest.mark.parametrize("seed", [2, 13, 14, 20])
def test_stage_prices_never_exceed_the_group_optimum(seed, monkeypatch):
    """Aimed at an incumbent far above the optimum, the per-stage steps keep climbing but stay
    below the exact group optimum; on some group they lift the bound above the common-mu one."""
    monkeypatch.setattr(lagrange, "STAGE_WITHIN", 1.0)  # search them however far the incumbent is,
    monkeypatch.setattr(lagrange, "STEPS_PER_COMMON", lagrange.STAGE_STEPS)  # with every step
    lifted = checked = 0
    for t in _pipeline_groups(seed):
        for v in t.vocab:
            best = GroupDP(t, exact=True, even=False).solve(v)
            if best is None:
                continue
            aim = 2 * best.objective_s
            bound = lagrangian_bound(t, v, aim)
            assert bound <= best.objective_s * (1 + 1e-9), (t.combo, v, bound, best.objective_s)
            with monkeypatch.context() as patch:
                patch.setattr(lagrange, "STAGE_STEPS", 0)
                common = lagrangian_bound(t, v, aim)
            assert common <= bound
            lifted += bound > common * (1 + 1e-9)
            checked += 1
    assert checked
    assert lifted


def test_projection_onto_the_simplex():
    assert lagrange._onto_simplex(np.array([0.2, 0.3, 0.5])) == pytest.approx([0.2, 0.3, 0.5])
    assert lagrange._onto_simplex(np.array([2.0, 0.0, -1.0])) == pytest.approx([1.0, 0.0, 0.0])
    assert lagrange._onto_simplex(np.array([0.5, 0.5, 0.5])) == pytest.approx([1 / 3] * 3)
    assert lagrange._onto_simplex(np.array([1.0, 0.6, -3.0])) == pytest.approx([0.7, 0.3, 0.0])


@pytest.mark.parametrize("seed", [2, 13, 14])
def test_one_priced_bound_for_every_vocab_choice_stays_below_each_optimum(seed, monkeypatch):
    """any_vocab_floor with an incumbent adds the Lagrangian (per-stage prices) on the least
    embedding/head of every choice: never above any choice's exact optimum, never below the
    memory-blind floor."""
    monkeypatch.setattr(lagrange, "STAGE_WITHIN", 1.0)
    checked = 0
    for t in _pipeline_groups(seed):
        optima = [GroupDP(t, exact=True, even=False).solve(v) for v in t.vocab]
        optima = [o.objective_s for o in optima if o is not None]
        if not optima:
            continue
        floor = GroupDP(t, exact=False, even=False).any_vocab_floor()
        priced = GroupDP(t, exact=False, even=False).any_vocab_floor(2 * max(optima))
        assert floor <= priced <= min(optima) * (1 + 1e-9), (t.combo, floor, priced, optima)
        checked += 1
    assert checked
