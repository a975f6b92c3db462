"""A cheap incumbent for one group: every layer under one strategy, stages split evenly, scored
from the group's tables with plan_cost's formula for every strategy at once."""
from __future__ import annotations

import numpy as np

from planners.tables import ComboTables
from specs import even_stage_layers


def uniform_layer_sums(t: ComboTables, S: np.ndarray) -> tuple[np.ndarray, ...]:
    """[stage, strategy in S] of a uniform plan on even stages, its layers only: summed
    per-micro-batch time, tail and memory, and the largest temporary."""
    bounds = np.concatenate(([0], np.cumsum(even_stage_layers(len(t.layer_type), t.combo.pp))))
    sums = []
    for k, st in enumerate(t.stages):
        types = t.layer_type[bounds[k]:bounds[k + 1]]
        sums.append([st.time_s[types][:, S].sum(axis=0), st.tail_s[types][:, S].sum(axis=0),
                     st.memory_bytes[types][:, S].sum(axis=0), st.temp_bytes[types][:, S].max(axis=0)])
    return tuple(np.array(x) for x in zip(*sums))


def uniform_seed(t: ComboTables, v) -> tuple[float, int] | None:
    """(objective, strategy index) of the best uniform plan that fits under vocab choice ``v``,
    or None when none does."""
    pp, m, n = t.combo.pp, t.combo.micro_batches, len(t.layer_type)
    ok = t.allowed.all(axis=0)
    if not ok.any():
        return None
    bounds = np.concatenate(([0], np.cumsum(even_stage_layers(n, pp))))
    lt, S = t.layer_type, np.flatnonzero(ok)
    layer_T, layer_D, layer_mem, layer_temp = uniform_layer_sums(t, S)
    Ts, Ds, fits = [], [], np.ones(len(S), dtype=bool)
    for k, st in enumerate(t.stages):
        vc = t.vocab[v][k]
        types = lt[bounds[k]:bounds[k + 1]]
        T = layer_T[k] + vc.time_s
        T += sum(st.trans_s[a, S, S] for a in types[:-1])
        D = layer_D[k] + vc.tail_s
        mem = layer_mem[k] + vc.memory_bytes
        mem += np.maximum(layer_temp[k], vc.temp_bytes)
        for d in (vc.first_delta, vc.last_delta):
            if d is not None:
                T, D, mem = T + d[S, 0], D + d[S, 1], mem + d[S, 2]
        if k < pp - 1:
            T = T + st.send_next_s[types[-1], S]
        if k > 0:
            T = T + t.stages[k - 1].send_prev_s[lt[bounds[k] - 1], S]
        Ts.append(T)
        Ds.append(D)
        fits &= mem <= t.budget_bytes
    Ts, Ds = np.array(Ts), np.array(Ds)
    value = np.where(fits, Ts.sum(axis=0) + (m - 1) * Ts.max(axis=0) + Ds.max(axis=0), np.inf)
    i = int(np.argmin(value))
    return (float(value[i]), int(S[i])) if np.isfinite(value[i]) else None
