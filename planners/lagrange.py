"""A memory-aware lower bound on one group's objective: each stage's memory row priced at mu
seconds per byte (Lagrangian relaxation), minimised by the memory-blind passes, mu searched.

plan_cost's sum_k T_k + (m-1) max_k T_k + max_k D_k is at least sum_k (c T_k + D_k / pp) with
c = 1 + (m-1)/pp (a max is at least the mean). A plan that fits has, on every stage k,
sum of its layers' memory <= cap_k = budget - embedding/head memory - their temporary (the largest
temporary is at least theirs), so for mu >= 0 the objective is at least
min over all plans of sum_k [c T_k + D_k / pp + mu (memory_k - cap_k)], which the memory-blind
layer DP and the min-sum partition compute exactly. The bound is concave in mu.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from planners.partition import _cells, _min_sum
from planners.tables import ComboTables, StageTables, VocabCost

GOLDEN = (np.sqrt(5.0) - 1) / 2
SCALES = (0.0, 0.0625, 0.25, 1.0, 4.0)
"""mu as multiples of the objective per byte of capacity, tried before the golden-section refinement."""


def lagrangian_bound(t: ComboTables, v, incumbent_s: float = np.inf, refine: int = 4, even: bool = False,
                     deadline: float | None = None) -> float:
    """max over the tried mu of the relaxation's value (a lower bound on the group's objective
    under vocab choice ``v``, over every partition, or over the even one when ``even``); stops
    early once it reaches ``incumbent_s``; raises segments.DeadlinePassed past ``deadline``."""
    caps = float(sum(t.budget_bytes - vc.memory_bytes - vc.temp_bytes for vc in t.vocab[v]))
    seen: dict[float, float] = {}

    def value(mu: float) -> float:
        if mu not in seen:
            seen[mu] = _relaxed_sum(_priced(t, v, mu), even, deadline) - mu * caps
        return seen[mu]

    base = value(0.0)
    if not np.isfinite(base) or base >= incumbent_s or caps <= 0:
        return base
    mus = [0.0]
    for scale in SCALES[1:]:  # concave: once a step does not rise, the maximum lies behind it
        mus.append(scale * base / caps)
        if value(mus[-1]) >= incumbent_s:
            return seen[mus[-1]]
        if seen[mus[-1]] <= seen[mus[-2]]:
            break
    i = int(np.argmax([seen[mu] for mu in mus]))
    if i == 0:
        return base
    lo, hi = mus[i - 1], mus[i + 1] if i + 1 < len(mus) else 4 * mus[i]
    for _ in range(refine):  # golden section on a concave function
        a, b = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
        if value(a) >= incumbent_s or value(b) >= incumbent_s:
            break
        lo, hi = (lo, b) if seen[a] >= seen[b] else (a, hi)
    return max(seen.values())


def _relaxed_sum(t: ComboTables, even: bool, deadline: float | None) -> float:
    """Least sum over stages of the priced per-micro-batch times, any partition (the even one
    when ``even``), memory ignored."""
    from planners.segments import GroupDP  # segments uses this module
    v = next(iter(t.vocab))
    dp = GroupDP(t, exact=False, even=even, deadline=deadline)
    pp, n, G = t.combo.pp, len(t.layer_type), len(t.dp_values)
    opts = [dp._options(k, v, {}, 0.0, relaxed=True)[0] for k in range(pp)]
    recv = [None] + [dp._recv(k) for k in range(1, pp)]
    res = _min_sum([_cells(o, n, G, np.inf)[0] for o in opts], recv, np.inf, n, path=False)
    return np.inf if res is None else res[0]


def _priced(t: ComboTables, v, mu: float) -> ComboTables:
    """The group's tables with every time scaled by c, tails by 1/pp and memory priced at mu,
    all folded into the per-micro-batch time (tails zero), for the vocab choice ``v`` only."""
    pp, m = t.combo.pp, t.combo.micro_batches
    c, w = 1.0 + (m - 1) / pp, 1.0 / pp
    stages = [_priced_stage(st, c, w, mu) for st in t.stages]
    vocab = [_priced_vocab(vc, c, w, mu) for vc in t.vocab[v]]
    return replace(t, stages=stages, vocab={v: vocab}, shared={})


def _priced_stage(st: StageTables, c: float, w: float, mu: float) -> StageTables:
    ok = np.isfinite(st.time_s)
    mem = np.where(ok, st.memory_bytes, 0.0)
    time_s = np.where(ok, c * st.time_s + w * np.where(ok, st.tail_s, 0.0) + mu * mem, np.inf)
    return replace(st, time_s=time_s, tail_s=np.zeros_like(st.tail_s), trans_s=c * st.trans_s,
                   send_next_s=c * st.send_next_s, send_prev_s=c * st.send_prev_s,
                   classes_from=st.classes_from or st)  # c > 0: equal relayout rows stay equal


def _priced_vocab(vc: VocabCost, c: float, w: float, mu: float) -> VocabCost:
    def delta(d):
        if d is None:
            return None
        out = np.zeros_like(d)
        out[:, 0] = c * d[:, 0] + w * d[:, 1] + mu * d[:, 2]
        return out
    return replace(vc, time_s=c * vc.time_s + w * vc.tail_s, tail_s=0.0,
                   first_delta=delta(vc.first_delta), last_delta=delta(vc.last_delta))
