"""The DP's building blocks against brute force: Pareto pruning and the partition search."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from planners.pareto import prune_exact, prune_fast
from planners import partition
from planners.partition import StageOptions, search_partition
from specs.schedules import schedule_entry


def _dominated(p, q):
    return all(a <= b for a, b in zip(q, p)) and any(a < b for a, b in zip(q, p))


@pytest.mark.parametrize("seed", range(20))
def test_prune_fast_keeps_exactly_the_non_dominated(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    level, mem, cost = rng.integers(0, 3, n), rng.integers(0, 10, n).astype(float), rng.integers(0, 10, n).astype(float)
    kept = set(prune_fast(level, mem, cost).tolist())
    pts = list(zip(level, mem, cost))
    for i, p in enumerate(pts):
        dominated = any(_dominated(p, q) for q in pts)
        if dominated:
            assert i not in kept
    # every non-dominated point value is represented exactly once
    values = sorted(pts[i] for i in kept)
    expect = sorted(set(p for p in pts if not any(_dominated(p, q) for q in pts)))
    assert values == expect


@pytest.mark.parametrize("seed", range(10))
def test_prune_exact_matches_definition(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    cols = [rng.integers(0, 4, n).astype(float) for _ in range(4)]
    kept = prune_exact(cols[0].astype(int), *cols[1:])
    pts = list(zip(*cols))
    expect = sorted(set(p for p in pts if not any(_dominated(p, q) for q in pts)))
    assert sorted(pts[i] for i in kept) == expect


@pytest.mark.parametrize("seed", range(4))
def test_prune_exact_matches_definition_across_blocks(seed):
    """More points than one block (EXACT_BLOCK), few distinct values (many ties and duplicates):
    the staircases that carry the kept points between blocks keep exactly the non-dominated ones,
    the first of each distinct point, in (level, mem, T, D) order."""
    from planners.pareto import EXACT_BLOCK
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2 * EXACT_BLOCK, 5 * EXACT_BLOCK))
    level = rng.integers(0, 5, n)
    mem, T = rng.integers(0, 12, n).astype(float), rng.integers(0, 12, n).astype(float)
    D = 24.0 - mem - T + rng.integers(0, 3, n)  # anti-correlated: long fronts
    pts = np.stack((level, mem, T, D), axis=1).astype(float)
    le = (pts[None, :, :] <= pts[:, None, :]).all(axis=2)  # [i, j]: j <= i everywhere
    earlier_twin = (pts[None, :, :] == pts[:, None, :]).all(axis=2) & (np.arange(n)[None, :] < np.arange(n)[:, None])
    strictly = le & ~(pts[None, :, :] == pts[:, None, :]).all(axis=2)
    expect = np.flatnonzero(~(strictly | earlier_twin).any(axis=1))
    expect = expect[np.lexsort((D[expect], T[expect], mem[expect], level[expect]))]
    assert np.array_equal(prune_exact(level, mem, T, D), expect)


def _brute(opts, recv, n, formula):
    best = np.inf
    pp = len(opts)
    for cuts in itertools.combinations(range(1, n), pp - 1):
        bounds = (0, *cuts, n)
        per_stage = []
        for k in range(pp):
            a, b = bounds[k], bounds[k + 1]
            per_stage.append([i for i in range(len(opts[k].a)) if opts[k].a[i] == a and opts[k].b[i] == b])
        for pick in itertools.product(*per_stage):
            Ts, Ds = [], []
            for k, i in enumerate(pick):
                r = recv[k][opts[k].a[i], opts[k - 1].g[pick[k - 1]]] if k else 0.0
                Ts.append(opts[k].T[i] + r)
                Ds.append(opts[k].D[i])
            best = min(best, formula.linear_s(sum(Ts), max(Ts), max(Ds)))
    return best


@pytest.mark.parametrize("v", [1, 2])
@pytest.mark.parametrize("seed", range(25))
def test_partition_search_is_exact_over_its_options(seed, v):
    """Under 1F1B (sum T + (m - 1) max T + max D) and under the interleaved schedule's linear
    form (fill 1/v on the sum), against every partition and option."""
    rng = np.random.default_rng(seed)
    n, pp, G, m = int(rng.integers(2, 7)), int(rng.integers(1, 4)), 2, int(rng.integers(1, 9))
    pp = min(pp, n)
    opts = []
    for k in range(pp):
        rows = []
        for a in range(n):
            for b in range(a + 1, n + 1):
                if (k == 0 and a) or (k == pp - 1 and b != n):
                    continue
                for _ in range(int(rng.integers(0, 3))):
                    rows.append((a, b, int(rng.integers(0, G)), float(rng.integers(1, 50)), float(rng.integers(0, 30))))
        rows = rows or [(0, n, 0, 1.0, 0.0)]
        a, b, g, T, D = (np.array(c) for c in zip(*rows))
        opts.append(StageOptions(a.astype(int), b.astype(int), g.astype(int), T.astype(float), D.astype(float)))
    recv = [None] + [rng.integers(0, 5, (n + 1, G)).astype(float) for _ in range(pp - 1)]
    formula = schedule_entry("1f1b" if v == 1 else "interleaved_1f1b").formula(m, v)
    got = search_partition(opts, recv, n, G, formula, exact=True)
    want = _brute(opts, recv, n, formula)
    if not np.isfinite(want):
        assert got is None
    else:
        assert got is not None and got.objective_s == pytest.approx(want)


@pytest.mark.parametrize("seed", range(25))
def test_the_least_bottleneck_is_the_first_feasible_cap(seed):
    """The min-max pass lands on the same cap as trying every cap in order with the min-sum DP,
    and the caps tried start there."""
    rng = np.random.default_rng(seed)
    n, pp, G = int(rng.integers(2, 9)), int(rng.integers(2, 5)), int(rng.integers(1, 3))
    pp = min(pp, n)
    opts = []
    for k in range(pp):
        rows = [(a, b, int(rng.integers(0, G)), float(rng.integers(1, 40)), 0.0)
                for a in range(n) for b in range(a + 1, n + 1)
                if not ((k == 0 and a) or (k == pp - 1 and b != n)) and rng.random() < 0.6]
        rows = rows or [(0 if k == 0 else n - 1, n if k == pp - 1 else 1, 0, 1.0, 0.0)]
        a, b, g, T, D = (np.array(c) for c in zip(*rows))
        opts.append(StageOptions(a.astype(int), b.astype(int), g.astype(int), T.astype(float), D.astype(float)))
    recv = [None] + [rng.integers(0, 5, (n + 1, G)).astype(float) for _ in range(pp - 1)]
    cells = [partition._cells(o, n, G, np.inf)[0] for o in opts]
    taus = partition._caps(cells, recv, -np.inf, lambda tau: np.ones(len(tau), dtype=bool))  # every stage time
    feasible = [tau for tau in taus if partition._min_sum(cells, recv, tau, n, path=False) is not None]
    least = partition._least_bottleneck(cells, recv, n)
    if feasible:
        assert least == feasible[0]
        assert partition._caps(cells, recv, least, lambda tau: tau < np.inf)[0] == least
    else:
        assert least == np.inf
