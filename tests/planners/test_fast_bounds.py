"""Fast galvatron for pp > 1: the bound that skips groups is a lower bound, ties between equal
per-micro-batch times go to the smaller tail, and only proven results say "optimal"."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

import planners
from planners.outer import _least_delta, grouped_tables, layers_lower_bound_s, lower_bound_s
from planners.segments import GroupDP
from specs import SpecError
from tests.planners.random_instances import (
    SMALL_SPACE,
    RandomCostModel,
    instance,
    tiny_model,
)

PIPE_SPACE = replace(SMALL_SPACE, max_pp=4, micro_batches=(2, 4), dp_types=("ddp", "zero1", "zero3"))
"""pp up to 4 and m up to 4 on 4 GPUs, the three dp types whose ties matter."""


def _pipe_instance(seed: int):
    model, cluster, cm, budget = instance(seed)
    model = tiny_model(4 + seed % 2, identical=seed % 3 == 0)
    return model, cluster, cm, planners.Budget(memory_gib=budget.memory_gib * 4, global_batch=8)


@pytest.mark.parametrize("seed", [2, 13, 14])
def test_skip_bound_never_exceeds_the_group_optimum(seed):
    """On these seeds the old memory-blind heuristic value exceeded the exact group optimum (by up
    to 7%), so a group holding the winner could be skipped."""
    model, _, cm, budget = _pipe_instance(seed)
    checked = 0
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        if t.combo.pp == 1:
            continue
        for v in t.vocab:
            best = GroupDP(t, exact=True, even=False).solve(v)
            if best is None:
                continue
            bound = GroupDP(t, exact=False, even=False).relaxed_objective(v)
            assert bound <= best.objective_s * (1 + 1e-12), (t.combo, v, bound, best.objective_s)
            checked += 1
    assert checked


@pytest.mark.parametrize("seed", [2, 13, 14, 21])
def test_no_memory_blind_bound_exceeds_the_memory_blind_uniform_plan(seed):
    """lower_bound skips the memory-blind and tail-cap bounds once the memory floor reaches
    blind_plan_s (the best uniform plan's objective, memory ignored): on random pipelines
    neither bound exceeds it."""
    model, _, cm, budget = _pipe_instance(seed)
    checked = 0
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        dp = GroupDP(t, exact=False, even=False)
        for v in t.vocab:
            blind = dp.blind_plan_s(v)
            assert dp.relaxed_objective(v) <= blind * (1 + 1e-12), (t.combo, v)
            if t.combo.pp > 1:
                assert dp.tail_floor(v) <= blind * (1 + 1e-12), (t.combo, v)
            checked += np.isfinite(blind)
    assert checked


@pytest.mark.parametrize("seed", [2, 13, 14])
def test_one_bound_for_every_vocab_choice_is_below_each_of_theirs(seed):
    """any_vocab_floor (each stage's embedding/head at its least over the choices) never exceeds
    any vocab choice's memory-blind bound, nor so the group optimum; with one choice it equals it."""
    model, _, cm, budget = _pipe_instance(seed)
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        floor = GroupDP(t, exact=False, even=False).any_vocab_floor()
        each = [GroupDP(t, exact=False, even=False).relaxed_objective(v) for v in t.vocab]
        assert 0 < floor <= min(each) * (1 + 1e-12), (t.combo, floor, each)
        one = replace(t, vocab=dict([next(iter(t.vocab.items()))]), shared={})
        assert GroupDP(one, exact=False, even=False).any_vocab_floor() == pytest.approx(each[0], rel=1e-12)


class ZeroOneTies(RandomCostModel):
    """ZeRO-1 answers exactly as DDP does (time, memory, relayouts, embedding/head) except that
    its optimizer update, part of the tail, takes half as long."""

    def _rng(self, *key):
        return super()._rng(*(_as_ddp(k) for k in key))

    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0):
        t = super().layer_time(layer, strategy, micro_batch_size, micro_batches, first_rank)
        return replace(t, update_s=t.update_s / 2) if strategy.dp_type == "zero1" else t


def _as_ddp(k):
    if getattr(k, "dp_type", None) == "zero1":
        return replace(k, dp_type="ddp")
    return type(k)("ddp") if isinstance(k, str) and k == "zero1" else k


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_equal_time_goes_to_the_smaller_tail(seed):
    """ZeRO-1 weakly dominates DDP here, so a DDP layer with dp > 1 is never needed; fast mode
    must not keep one, and must reach the exact optimum."""
    model, cluster, _, budget = _pipe_instance(seed)
    cm = ZeroOneTies(cluster, seed)
    space = replace(PIPE_SPACE, pp_degrees=(2, 4))
    fast = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": space})
    exact = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": space, "mode": "exact"})
    assert fast.feasible and exact.feasible
    assert [ls for ls in fast.plan.layers if ls.dp > 1 and ls.dp_type == "ddp"] == []
    assert fast.iteration_time_s == pytest.approx(exact.iteration_time_s, rel=1e-12)


def test_status_is_optimal_only_where_proven():
    """Every option set reports a bound and a gap; the exact optimum of its space (even partitions
    only, when it asks for them) lies inside [bound, value]; "optimal" only where the gap is 0,
    and then the value is the optimum."""
    model, cluster, cm, budget = _pipe_instance(0)
    galvatron = planners.get("galvatron")
    optimum = galvatron.plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "mode": "exact"})
    even = galvatron.plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "mode": "exact", "partition": "even"})
    for exact in (optimum, even):
        assert exact.stats.solver_status == "optimal" and exact.stats.gap == 0.0
    assert even.iteration_time_s >= optimum.iteration_time_s * (1 - 1e-12)
    for opts in ({}, {"space": replace(PIPE_SPACE, pp_degrees=(1,))},
                 {"space": replace(PIPE_SPACE, pp_degrees=(1,)), "max_temp_levels": 2},
                 {"mode": "exact", "memory_granularity_mib": 1.0},
                 {"partition": "even"}, {"stage_imbalance": 1.0}):
        res = galvatron.plan(model, cluster, budget, cm, {"space": PIPE_SPACE, **opts})
        assert res.feasible and res.stats.gap is not None, opts
        best = (res.iteration_time_s if "space" in opts else even.iteration_time_s if "partition" in opts
                else optimum.iteration_time_s)
        assert res.stats.bound_s <= best * (1 + 1e-9) and res.iteration_time_s >= best * (1 - 1e-9), opts
        assert res.stats.gap == pytest.approx(1 - res.stats.bound_s / res.iteration_time_s, abs=1e-9)
        assert (res.stats.solver_status == "optimal") == (res.stats.gap == 0.0), opts


@pytest.mark.parametrize("seed", [0, 3, 14])
def test_memory_blind_options_are_each_segments_best_per_dp(seed):
    """relaxed_options (all lengths of a pass at once) gives, segment by segment and dp by dp,
    what ``_segment`` gives with no budget, and its refs rebuild each option's strategies."""
    model, _, cm, budget = _pipe_instance(seed)
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        dp = GroupDP(t, exact=False, even=False)
        for v, k, lam in itertools.product(t.vocab, range(t.combo.pp), (0.0, 1.0 / t.combo.pp)):
            opts, refs = dp.relaxed_options(k, v, lam)
            rows = []
            for a, b in dp.bound_windows[k]:
                p, _ = dp._stage_passes(k, v, scalar=lam)[a]
                for g, T, D, point in dp._segment(p, b - a - 1, dp.stages[k], t.vocab[v][k], np.inf, k, lam):
                    rows.append((a, b, g, T, D, p.strategies(b - a - 1, point)))
            built = [(a, b, g, T, D, refs[o][0].strategies(refs[o][1], refs[o][2]))
                     for o, (a, b, g, T, D) in enumerate(zip(opts.a, opts.b, opts.g, opts.T, opts.D))]
            assert built == rows, (t.combo, v, k, lam)


def test_gap_tolerance_skips_near_ties_and_keeps_the_optimum_inside_the_gap():
    """A group or vocab choice whose bound is within gap_tolerance of the incumbent is not
    searched: fewer DP states somewhere, the exact optimum still inside [bound, value], and
    "optimal" only at gap 0; a tolerance outside [0, 1) is refused in one line."""
    galvatron = planners.get("galvatron")
    fewer = 0
    for seed in range(6):
        def run(**opts):  # a fresh cost model each: no bounds cached by an earlier call
            model, cluster, cm, budget = _pipe_instance(seed)
            return galvatron.plan(model, cluster, budget, cm, {"space": PIPE_SPACE, **opts})
        optimum, full, loose = run(mode="exact"), run(), run(gap_tolerance=0.05)
        assert loose.feasible == optimum.feasible
        if not loose.feasible:
            continue
        best = optimum.iteration_time_s
        assert loose.stats.bound_s <= best * (1 + 1e-9) and loose.iteration_time_s >= best * (1 - 1e-9)
        assert (loose.stats.solver_status == "optimal") == (loose.stats.gap == 0.0)
        fewer += loose.stats.states_explored < full.stats.states_explored
    assert fewer > 0
    model, cluster, cm, budget = _pipe_instance(0)
    for bad in (-0.1, 1.0, True, "0.1"):
        with pytest.raises(SpecError, match="gap_tolerance: must be a number in"):
            galvatron.plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "gap_tolerance": bad})


@pytest.mark.parametrize("seed", [2, 13, 14])
def test_the_groups_cheap_bound_never_exceeds_their_optimum(seed):
    """outer.lower_bound_s (the order and first cut of the groups) against each group's exact
    optimum; on pipelines its slowest stage is floored by the stages holding the embedding and the
    head, which here lifts it above the mean's bound somewhere."""
    model, _, cm, budget = _pipe_instance(seed)
    checked = lifted = 0
    for t in grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (8,)):
        found = [GroupDP(t, exact=True, even=False).solve(v) for v in t.vocab]
        best = min((f.objective_s for f in found if f is not None), default=np.inf)
        bound = lower_bound_s(t)
        assert bound <= best * (1 + 1e-12), (t.combo, bound, best)
        assert layers_lower_bound_s(t) <= bound * (1 + 1e-12), (t.combo, bound)  # the layer tables' bound
        checked += np.isfinite(best)
        lifted += t.combo.pp > 1 and bound > _mean_bound(t) * (1 + 1e-12)
    assert checked and lifted


def _mean_bound(t) -> float:
    """lower_bound_s with the slowest stage floored by the mean alone."""
    f, pp = t.combo.formula, t.combo.pp
    layers = float(np.min([np.min(s.time_s, axis=1) for s in t.stages], axis=0)[t.layer_type].sum())
    totals = [layers + sum(vc.time_s + _least_delta(vc) for vc in costs) for costs in t.vocab.values()]
    return min(f.fill * total + f.steady * total / pp for total in totals)
