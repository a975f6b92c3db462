"""Identical layers as counts (planners/counts.py): the count frontier's bound is the integer
optimum of the segment relaxation (relayouts dropped) found by enumerating every assignment, and
it lifts the LP bound on short pipelined stages."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from planners.counts import MAX_COUNT_LAYERS, CountFrontier, count_bounds, segment_classes
from planners.partition import Windows
from planners.memory_floor import _distinct_rows, _layer_arrays, memory_floor
from planners.outer import grouped_tables
from planners.segments import GroupDP
from planners.tables import temp_levels
from tests.planners.random_instances import RandomCostModel, tiny_cluster, tiny_model
from tests.planners.test_gap import PIPE_SPACE

KIB = 1024


def _groups(seed: int, layers: int, budget_kib: int):
    model, cluster = tiny_model(layers, identical=True), tiny_cluster()
    return grouped_tables(model, RandomCostModel(cluster, seed), budget_kib * KIB, PIPE_SPACE, (8,))


def _brute(t, v, k, lam, a, b) -> float:
    """The least T + lam D of layers a..b-1 over every assignment whose memory fits, relayouts left out."""
    cost, mem, temp = _layer_arrays(t, v, k, lam)
    st, vc = t.stages[k], t.vocab[v][k]
    last = cost + (st.send_next_s[t.layer_type] if k < t.combo.pp - 1 else 0.0)
    cap = t.budget_bytes - vc.memory_bytes
    best = np.inf
    for pick in itertools.product(range(len(t.strategies)), repeat=b - a):
        rows = range(a, b)
        c = sum(last[j, s] if j == b - 1 else cost[j, s] for j, s in zip(rows, pick))
        held = sum(mem[j, s] for j, s in zip(rows, pick)) + max([vc.temp_bytes] + [temp[j, s] for j, s in zip(rows, pick)])
        if np.isfinite(c) and held <= cap:
            best = min(best, c)
    return best


@pytest.mark.parametrize("seed", range(3))
def test_count_bounds_are_the_integer_optimum(seed):
    checked = 0
    for t in _groups(seed, 4, 6000):
        if t.combo.pp != 2:
            continue
        v = next(iter(t.vocab))
        windows = GroupDP(t, exact=False, even=False).bound_windows
        for k in range(t.combo.pp):
            for lam in (0.0, 0.5):
                rows, row = _distinct_rows(t, v, k)
                cost, mem, temp = _layer_arrays(t, v, k, lam, rows)
                last = cost + (t.stages[k].send_next_s[t.layer_type[rows]] if k < t.combo.pp - 1 else 0.0)
                vc = t.vocab[v][k]
                classes = segment_classes((cost, last, mem, temp), row, windows[k])
                got = count_bounds(t, classes, temp_levels(t), vc.memory_bytes, vc.temp_bytes)[classes.of_window]
                for (a, b), value in zip(windows[k], got):
                    if b - a <= 3:
                        assert value == pytest.approx(_brute(t, v, k, lam, a, b), rel=1e-12, abs=0)
                        checked += 1
    assert checked


def test_count_bounds_lift_the_lp_bound_somewhere():
    """With few layers a stage the LP mixes strategies fractionally; the counts do not."""
    lifted = 0
    for seed in range(6):
        for t in _groups(seed, 6, 3000 + 2000 * seed):
            if t.combo.pp == 1:
                continue
            dp = GroupDP(t, exact=False, even=False)
            recv = [None] + [dp._recv(k) for k in range(1, t.combo.pp)]
            for v in t.vocab:
                lp = memory_floor(t, v, dp.bound_windows, recv)
                lifted += memory_floor(t, v, dp.bound_windows, recv, counts=True) > lp * (1 + 1e-9)
    assert lifted


def test_heterogeneous_models_keep_one_class_per_run():
    """T5-like (encoder run, decoder run) and Swin-like (runs ending in a downsampling block):
    segments inside one run share a class per length; a segment whose middle layers cross runs
    is its own class, with no count bound."""
    from tests.planners.test_gap import swin_like, t5_like
    for model in (t5_like(3, 3), swin_like((4, 3, 1))):
        t = grouped_tables(model, RandomCostModel(tiny_cluster(), 0), 1e9, PIPE_SPACE, (8,))[0]
        v, n = next(iter(t.vocab)), len(t.layer_type)
        rows, row = _distinct_rows(t, v, 0)
        cost, mem, temp = _layer_arrays(t, v, 0, 0.0, rows)
        windows = Windows((a, b) for a in range(n) for b in range(a + 1, n + 1))
        classes = segment_classes((cost, cost, mem, temp), row, windows)
        for (a, b), c in zip(windows, classes.of_window):
            inner = set(row[a + 1:b - 1].tolist())
            assert (classes.body[c] is None) == (len(inner) > 1), (model.name, a, b)
        assert len(set(classes.of_window.tolist())) < len(windows)  # runs share


@pytest.mark.parametrize("seed", range(4))
def test_galvatron_equals_the_ilp_where_counts_bound_groups(seed, monkeypatch):
    """Identical layers, pp up to 4, tight budgets: the count bound is asked, and the default
    galvatron's plan is the ILP optimum (or the ILP value lies inside its proven gap)."""
    import planners
    from planners import Budget, counts
    asked = []
    original = counts.count_bounds
    monkeypatch.setattr(counts, "count_bounds", lambda *a, **k: asked.append(1) or original(*a, **k))
    import planners.memory_floor as floor_module
    monkeypatch.setattr(floor_module, "count_bounds", counts.count_bounds)
    model, cluster = tiny_model(6, identical=True), tiny_cluster()
    cm = RandomCostModel(cluster, 100 + seed)
    for kib in (2500, 4000, 8000):
        budget = Budget(memory_gib=kib * KIB / 1024**3, global_batch=8)
        fast = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": PIPE_SPACE})
        ilp = planners.get("ilp").plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "warm_start": False})
        assert fast.feasible == ilp.feasible
        if fast.feasible:
            assert fast.stats.bound_s <= ilp.iteration_time_s * (1 + 1e-9) <= fast.iteration_time_s * (1 + 2e-9)
            if fast.stats.solver_status == "optimal":
                assert fast.iteration_time_s == pytest.approx(ilp.iteration_time_s, rel=1e-9)
    assert asked  # memory binds on some short identical segment


@pytest.mark.parametrize("seed", range(3))
def test_count_bounds_do_not_depend_on_levels_another_call_used(seed):
    """The count frontiers in t.shared index the temporary levels they were built with; tables
    sharing ``shared`` with other levels (any_vocab_floor's merged choice) must not read them:
    the bounds are those computed alone."""
    from dataclasses import replace
    checked = 0
    for t in _groups(seed, 4, 6000):
        v = next(iter(t.vocab))
        windows = GroupDP(t, exact=False, even=False).bound_windows
        levels = temp_levels(t)
        others = np.unique(np.concatenate((levels, (levels[:-1] + levels[1:]) / 2)))  # a level between each
        for k in range(t.combo.pp):
            rows, row = _distinct_rows(t, v, k)
            cost, mem, temp = _layer_arrays(t, v, k, 0.0, rows)
            last = cost + (t.stages[k].send_next_s[t.layer_type[rows]] if k < t.combo.pp - 1 else 0.0)
            vc = t.vocab[v][k]
            classes = segment_classes((cost, last, mem, temp), row, windows[k])
            alone = count_bounds(replace(t, shared={}), classes, levels, vc.memory_bytes, vc.temp_bytes)
            shared = replace(t, shared={})
            count_bounds(shared, classes, others, vc.memory_bytes, vc.temp_bytes)
            got = count_bounds(shared, classes, levels, vc.memory_bytes, vc.temp_bytes)
            assert np.array_equal(got, alone), (t.combo, k, got, alone)
            checked += np.isfinite(alone).sum()
    assert checked


def _frontier_of(rng, n: int, levels: int) -> CountFrontier:
    """A random (level, memory, cost) set with many ties, in no particular order."""
    return CountFrontier(rng.integers(0, levels, n), rng.integers(0, 12, n).astype(float),
                         rng.integers(0, 12, n).astype(float))


@pytest.mark.parametrize("seed", range(8))
def test_plus_equals_pruning_every_sum(seed):
    """plus skips the row points another one at or below a sum's level beats, and prunes the
    rest; it keeps exactly the points (in the same order) that pruning every sum keeps."""
    from planners.pareto import prune_fast
    rng = np.random.default_rng(seed)
    levels = int(rng.integers(1, 8))
    have, row = _frontier_of(rng, int(rng.integers(1, 80)), levels), _frontier_of(rng, int(rng.integers(1, 30)), levels)
    cap = float(rng.integers(6, 30))
    got = have.plus(row, cap)
    level = np.maximum(have.level[:, None], row.level[None]).ravel()
    memory = (have.memory_bytes[:, None] + row.memory_bytes[None]).ravel()
    cost = (have.cost_s[:, None] + row.cost_s[None]).ravel()
    fits = np.flatnonzero(memory <= cap)
    keep = fits[prune_fast(level[fits], memory[fits], cost[fits])]
    assert np.array_equal(got.level, level[keep])
    assert np.array_equal(got.memory_bytes, memory[keep])
    assert np.array_equal(got.cost_s, cost[keep])


def _one_stage_groups():
    """(tables, exact GroupDP) of every pp 1 group of identical layers past MAX_COUNT_LAYERS, over
    four random cost models and two budgets."""
    for seed in range(4):
        model, cluster = tiny_model(MAX_COUNT_LAYERS + 2, identical=True), tiny_cluster()
        for budget_kib in (9000, 14000):
            for t in grouped_tables(model, RandomCostModel(cluster, seed), budget_kib * KIB, PIPE_SPACE, (8,)):
                if t.combo.pp == 1:
                    yield t, GroupDP(t, exact=True, even=False)


def test_a_one_stage_group_takes_the_count_bound_over_all_its_layers():
    """pp 1: the count bound covers the whole stage, past MAX_COUNT_LAYERS (the identical layers'
    chain is built once a group): it lies between the LP bound and the group's exact optimum, and
    lifts the LP bound somewhere."""
    lifted = solved = 0
    for t, dp in _one_stage_groups():
        for v in t.vocab:
            lp = memory_floor(t, v, dp.bound_windows, [None])
            counted = memory_floor(t, v, dp.bound_windows, [None], counts=True)
            sol = dp.solve(v, bound=False)
            assert counted >= lp * (1 - 1e-12)
            if sol is not None:
                assert counted <= sol.objective_s * (1 + 1e-12)
                solved += 1
            lifted += np.isfinite(counted) and counted > lp * (1 + 1e-9)
    assert solved and lifted


def test_a_one_stage_count_bound_cut_by_an_incumbent_decides_as_the_whole_chain():
    """pp 1 with an incumbent: the chain drops the sums that cannot complete below it
    (counts.ChainCut). The bound it gives, B_cut, still bounds the group's exact optimum, is no
    weaker than the whole chain's B below the incumbent (min(B, incumbent) <= B_cut), and equals B
    where the group has a plan and B is below the incumbent. One chain, cut for the merged vocab
    choice first (as GroupDP.any_vocab_floor asks), serves the group's vocab choices after it."""
    from dataclasses import replace

    from planners.segments import ANY_VOCAB, _least_vocab
    equal = capped = 0
    for t, dp in _one_stage_groups():
        whole = {v: memory_floor(replace(t, shared={}), v, dp.bound_windows, [None], counts=True) for v in t.vocab}
        best = {v: dp.solve(v, bound=False) for v in t.vocab}
        finite = [b for b in whole.values() if np.isfinite(b)]
        if not finite:
            continue
        merged = replace(t, vocab={ANY_VOCAB: [_least_vocab([c[0] for c in t.vocab.values()])]}, shared={})
        for incumbent in (min(finite) * 1.001, float(np.median(finite)), max(finite) * 0.999):
            first = replace(merged, shared={})
            memory_floor(first, ANY_VOCAB, dp.bound_windows, [None], counts=True, incumbent_s=incumbent)
            for v, b in whole.items():
                reused = memory_floor(replace(t, shared=first.shared), v, dp.bound_windows, [None], counts=True,
                                      incumbent_s=incumbent)
                alone = memory_floor(replace(t, shared={}), v, dp.bound_windows, [None], counts=True,
                                     incumbent_s=incumbent)
                for cut in (reused, alone):
                    assert cut >= min(b, incumbent) * (1 - 1e-12)
                    if best[v] is not None:
                        assert cut <= best[v].objective_s * (1 + 1e-12)
                        if b < incumbent:
                            assert cut == pytest.approx(b, rel=1e-12)
                            equal += 1
                    capped += cut > b * (1 + 1e-9)
    assert equal and capped
