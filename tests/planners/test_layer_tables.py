"""The outer loop builds every group's layer tables first and completes (relayouts, sends,
vocabulary) only the groups whose layers alone may still beat the plans kept: the others are
never completed, the result is the search's with every group completed, and a time limit that
passes while completing leaves each group not completed with its layers-only bound."""
from __future__ import annotations

import time

import cost_models
import planners
from planners import Budget, SearchSpace
from planners.galvatron import LAYERS_FLOOR_MAX_PP, resolve_space
from planners.memory_floor import layers_floor
from planners.outer import (OuterState, _complete_groups, build_layer_groups, combo_groups, grouped_tables,
                            layers_lower_bound_s)
from planners.partition import stage_windows
from planners.tables import build_layer_tables, build_tables, is_built
from specs import load_cluster, load_model

MODEL, CLUSTER = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g:2")
BUDGET = Budget(memory_gib=24, global_batch=96)
SPACE = SearchSpace.preset("full")


def _groups(cm):
    return combo_groups(MODEL, cm, resolve_space(SPACE, cm), BUDGET.global_batches())


def test_layer_tables_are_the_full_tables_less_relayouts_sends_and_vocabulary():
    cm = cost_models.get("analytical", CLUSTER)
    space = resolve_space(SPACE, cm)
    cs = _groups(cm)[-1]
    layers = build_layer_tables(MODEL, cm, cs[0], space, BUDGET.memory_bytes)
    full = build_tables(MODEL, cm, cs[0], [c.vocab for c in cs], space, BUDGET.memory_bytes)
    assert layers.vocab == {} and full.vocab and layers.budget_bytes == full.budget_bytes
    for a, b in zip(layers.stages, full.stages):
        assert a.trans_s is None and a.send_next_s is None and a.send_prev_s is None
        for name in ("time_s", "tail_s", "memory_bytes", "temp_bytes", "activation_bytes"):
            assert (getattr(a, name) == getattr(b, name)).all()
        assert b.trans_s is not None and b.send_next_s is not None


def test_groups_whose_layers_cannot_win_are_never_completed():
    cm = cost_models.get("analytical", CLUSTER)
    res = planners.get("galvatron").plan(MODEL, CLUSTER, BUDGET, cm, {"space": SPACE})
    assert res.stats.solver_status == "optimal"
    space = resolve_space(SPACE, cm)
    groups = _groups(cm)
    built = [is_built(MODEL, cm, cs[0], [c.vocab for c in cs], space) for cs in groups]
    assert any(built) and not all(built)
    usable = BUDGET.memory_bytes - cm.allocator_reserve_bytes(BUDGET.memory_bytes)
    top_k = planners.get("galvatron").defaults["top_k"]
    kth = sorted(p.throughput_samples_per_s for p in res.top_k)[-top_k]
    for cs, done in zip(groups, built):
        if not done:  # its layers alone cannot beat the top_k-th plan (memory-blind, or under the budget)
            t = build_layer_tables(MODEL, cm, cs[0], space, usable)
            floor = layers_lower_bound_s(t)
            if t.combo.pp <= LAYERS_FLOOR_MAX_PP:
                floor = max(floor, layers_floor(t, stage_windows(len(t.layer_type), t.combo.pp, False)))
            assert t.combo.global_batch / floor <= kth * (1 + 1e-12)
    # the same plan as a search whose every group's tables are complete (cached beforehand)
    warm = cost_models.get("analytical", CLUSTER)
    grouped_tables(MODEL, warm, usable, space, BUDGET.global_batches())
    again = planners.get("galvatron").plan(MODEL, CLUSTER, BUDGET, warm, {"space": SPACE})
    assert again.plan == res.plan and again.iteration_time_s == res.iteration_time_s


def test_a_limit_passing_while_completing_keeps_the_layers_only_bounds():
    cm = cost_models.get("analytical", CLUSTER)
    space = resolve_space(SPACE, cm)
    groups = _groups(cm)
    layers = build_layer_groups(MODEL, cm, BUDGET.memory_bytes, space, groups)
    assert len(layers) == len(groups)
    state = OuterState()
    done = _complete_groups(layers, groups, MODEL, cm, BUDGET.memory_bytes, space, 3, state,
                            time.monotonic() - 1.0, prune=True)
    assert done == [] and state.timed_out and state.doing.startswith("building cost tables (0 of ")
    assert state.unbounded == 0
    assert state.upper_thr == max(t.combo.global_batch / layers_lower_bound_s(t) for t in layers)
