"""Identical layers as counts (planners/counts.py): the count frontier's bound is the integer
optimum of the segment relaxation (relayouts dropped) found by enumerating every assignment, and
it lifts the LP bound on short pipelined stages."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from planners.counts import count_bounds, segment_classes
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
                cost, mem, temp = _layer_arrays(t, v, k, lam)
                last = cost + (t.stages[k].send_next_s[t.layer_type] if k < t.combo.pp - 1 else 0.0)
                vc = t.vocab[v][k]
                classes = segment_classes((cost, last, mem, temp), _distinct_rows(t, v, k)[1], windows[k])
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
