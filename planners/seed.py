"""A cheap incumbent for one group: every layer under one strategy, stages split evenly, scored
from the group's tables with plan_cost's formula for every strategy at once."""
from __future__ import annotations

import numpy as np

from planners.tables import ComboTables
from specs import even_stage_layers


def uniform_layer_sums(t: ComboTables, S: np.ndarray, stage_ids: tuple[tuple[int, ...], ...] | None = None
                       ) -> tuple[np.ndarray, ...]:
    """[stage, strategy in S] of a uniform plan whose stage k holds layers ``stage_ids[k]`` (even
    contiguous stages by default; interleaved and V-shaped layouts hold chunks apart), its layers
    only: summed per-micro-batch time, tail and memory, and the largest temporary. Kept in
    ``t.shared`` per layout and S (the schedules of a group share layouts): read only."""
    stage_ids = stage_ids or _even_stage_ids(t)
    key = ("uniform sums", stage_ids, S.tobytes())
    hit = t.shared.get(key)
    if hit is not None and hit[0] is t.stages:
        return hit[1]
    sums = []
    for ids, st in zip(stage_ids, t.stages):
        types = t.layer_type[list(ids)]
        sums.append([st.time_s[types][:, S].sum(axis=0), st.tail_s[types][:, S].sum(axis=0),
                     st.memory_bytes[types][:, S].sum(axis=0), st.temp_bytes[types][:, S].max(axis=0)])
    out = tuple(np.array(x) for x in zip(*sums))
    for a in out:
        a.flags.writeable = False
    t.shared[key] = (t.stages, out)
    return out


def uniform_activation_sums(t: ComboTables, S: np.ndarray, stage_ids: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """[stage, strategy in S] of a uniform plan whose stage k holds layers ``stage_ids[k]``: its
    layers' activations of one micro-batch in flight (tables of a cost model linear in the
    in-flight count)."""
    return np.array([st.activation_bytes[t.layer_type[list(ids)]][:, S].sum(axis=0)
                     for ids, st in zip(stage_ids, t.stages)])


def _even_stage_ids(t: ComboTables) -> tuple[tuple[int, ...], ...]:
    """Each stage's layers under even contiguous stages."""
    bounds = np.concatenate(([0], np.cumsum(even_stage_layers(len(t.layer_type), t.combo.pp))))
    return tuple(tuple(range(bounds[k], bounds[k + 1])) for k in range(t.combo.pp))


def uniform_seed(t: ComboTables, v, budget_bytes: float | None = None) -> tuple[float, int] | None:
    """(objective, strategy index) of the best uniform plan that fits ``budget_bytes`` (None: the
    group's budget; inf: memory ignored) under vocab choice ``v``, or None when none does."""
    budget_bytes = t.budget_bytes if budget_bytes is None else budget_bytes
    parts = _uniform_parts(t)
    if parts is None:
        return None
    S, layer_T, layer_D, layer_mem, layer_temp = parts
    Ts, Ds, fits = [], [], np.ones(len(S), dtype=bool)
    for k, vc in enumerate(t.vocab[v]):
        T, D = layer_T[k] + vc.time_s, layer_D[k] + vc.tail_s
        mem = layer_mem[k] + vc.memory_bytes + np.maximum(layer_temp[k], vc.temp_bytes)
        for d in (vc.first_delta, vc.last_delta):
            if d is not None:
                T, D, mem = T + d[S, 0], D + d[S, 1], mem + d[S, 2]
        Ts.append(T)
        Ds.append(D)
        fits &= mem <= budget_bytes
    Ts, Ds = np.array(Ts), np.array(Ds)
    value = np.where(fits, t.combo.formula.linear_s(Ts.sum(axis=0), Ts.max(axis=0), Ds.max(axis=0)), np.inf)
    i = int(np.argmin(value))
    return (float(value[i]), int(S[i])) if np.isfinite(value[i]) else None


def _uniform_parts(t: ComboTables) -> tuple[np.ndarray, ...] | None:
    """What uniform_seed needs that no vocab choice or budget changes, once per stage tables
    (kept in ``t.shared``): the strategies every layer allows, and per stage and strategy the
    layers' time with relayouts and sends, tail, memory and largest temporary."""
    key = ("uniform", id(t.stages))
    hit = t.shared.get(key)
    if hit is not None and hit[0] is t.stages:
        return hit[1]
    ok = t.allowed.all(axis=0)
    parts = None
    if ok.any():
        pp, lt, S = t.combo.pp, t.layer_type, np.flatnonzero(ok)
        bounds = np.concatenate(([0], np.cumsum(even_stage_layers(len(lt), pp))))
        layer_T, layer_D, layer_mem, layer_temp = uniform_layer_sums(t, S)
        layer_T = layer_T.copy()  # the sends and relayouts added below
        for k, st in enumerate(t.stages):
            types = lt[bounds[k]:bounds[k + 1]]
            layer_T[k] += sum(st.trans_s[a, S, S] for a in types[:-1])
            if k < pp - 1:
                layer_T[k] += st.send_next_s[types[-1], S]
            if k > 0:
                layer_T[k] += t.stages[k - 1].send_prev_s[lt[bounds[k] - 1], S]
        parts = (S, layer_T, layer_D, layer_mem, layer_temp)
    t.shared[key] = (t.stages, parts)
    return parts
