"""A memory-aware lower bound on one group's objective: each stage's memory row priced at mu_k
seconds per byte (Lagrangian relaxation), minimised by the memory-blind passes, the prices searched.

plan_cost's sum_k T_k + (m-1) max_k T_k + max_k D_k is at least sum_k ((1 + (m-1) theta_k) T_k +
u_k D_k) for any distributions theta and u over the stages (a max is at least any weighted mean).
A plan that fits has, on every stage k, sum of its layers' memory <= cap_k = budget - embedding/head
memory - their temporary (the largest temporary is at least theirs), so for mu >= 0 the objective
is at least min over all plans of sum_k [(1 + (m-1) theta_k) T_k + u_k D_k + mu_k (memory_k - cap_k)],
which the memory-blind layer DP and the min-sum partition compute exactly. The bound is concave in
(theta, u, mu): first one mu for every stage with uniform weights (a scan and golden section), then,
for pp > 1, per-stage prices by projected subgradient steps (Polyak's step towards the incumbent).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planners.partition import _cells, _min_sum
from planners.tables import ComboTables, StageTables, VocabCost

GOLDEN = (np.sqrt(5.0) - 1) / 2
SCALES = (0.0, 0.0625, 0.25, 1.0, 4.0)
"""mu as multiples of the objective per byte of capacity, tried before the golden-section refinement."""
STAGE_STEPS = 24
STEPS_PER_COMMON = 1
"""Subgradient steps on the per-stage prices (pp > 1) after the common-mu search: at most
STAGE_STEPS, and at most STEPS_PER_COMMON per relaxation the common search evaluated (the steps
then at most double the bound's cost; on t5-large-48 / titan-16 at pp 8 one relaxation takes 0.5 s)."""
STALL_STEPS, STALL_SHARE = 4, 0.1
"""The steps stop once the last STALL_STEPS of them gained less than STALL_SHARE of the distance
still to the incumbent (the bound converges below it: the group has to be searched)."""
STAGE_WITHIN = 0.03
"""Per-stage prices are searched only when the common-mu bound is this close (relative) below the
incumbent: measured, farther ones did not reach it (llama2-70b pp 4: 5.5% below, converged 0.5%
below; bert-huge-32 / titan-8: 1 of 46 reached, from 0.5% below)."""
AIM_ABOVE = 1e-4
"""Polyak's steps aim this far (relative) above the incumbent."""


@dataclass(frozen=True)
class Prices:
    """Multipliers of one relaxation, per stage: theta (weight of T_k in the bottleneck, a
    distribution), u (weight of D_k in the tail max, a distribution), mu (price of the memory
    row, seconds per byte, >= 0)."""

    theta: np.ndarray
    u: np.ndarray
    mu: np.ndarray

    @staticmethod
    def common(pp: int, mu: float) -> "Prices":
        even = np.full(pp, 1.0 / pp)
        return Prices(even, even, np.full(pp, mu))


@dataclass(frozen=True)
class StageSums:
    """The relaxation's minimiser, per stage: per-micro-batch time, tail, priced memory."""

    T: np.ndarray
    D: np.ndarray
    memory: np.ndarray


def lagrangian_bound(t: ComboTables, v, incumbent_s: float = np.inf, refine: int = 4, even: bool = False,
                     deadline: float | None = None) -> float:
    """max over the tried prices of the relaxation's value (a lower bound on the group's objective
    under vocab choice ``v``, over every partition, or over the even one when ``even``); stops
    early once it reaches ``incumbent_s``; raises segments.DeadlinePassed past ``deadline``."""
    caps = np.array([t.budget_bytes - vc.memory_bytes - vc.temp_bytes for vc in t.vocab[v]])
    pp = t.combo.pp
    seen: dict[float, float] = {}

    def value(mu: float) -> float:
        if mu not in seen:
            seen[mu] = relaxation(t, v, Prices.common(pp, mu), caps, even, deadline)[0]
        return seen[mu]

    base = value(0.0)
    if not np.isfinite(base) or base >= incumbent_s or caps.sum() <= 0:
        return base
    mus = [0.0]
    for scale in SCALES[1:]:  # concave: once a step does not rise, the maximum lies behind it
        mus.append(scale * base / caps.sum())
        if value(mus[-1]) >= incumbent_s:
            return seen[mus[-1]]
        if seen[mus[-1]] <= seen[mus[-2]]:
            break
    i = int(np.argmax([seen[mu] for mu in mus]))
    if i > 0:
        lo, hi = mus[i - 1], mus[i + 1] if i + 1 < len(mus) else 4 * mus[i]
        for _ in range(refine):  # golden section on a concave function
            a, b = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
            if value(a) >= incumbent_s or value(b) >= incumbent_s:
                break
            lo, hi = (lo, b) if seen[a] >= seen[b] else (a, hi)
    mu, best = max(seen.items(), key=lambda kv: kv[1])
    if pp == 1 or best >= incumbent_s or best < (1 - STAGE_WITHIN) * incumbent_s:
        return best
    steps = min(STAGE_STEPS, STEPS_PER_COMMON * len(seen))
    return _stage_prices(t, v, caps, Prices.common(pp, mu), best, incumbent_s, base / caps.sum(), steps, even,
                         deadline)


def _stage_prices(t: ComboTables, v, caps: np.ndarray, start: Prices, best: float, target: float,
                  mu_scale: float, steps: int, even: bool, deadline: float | None) -> float:
    """Projected subgradient ascent on per-stage prices from ``start``, at most ``steps``
    relaxations, Polyak's step towards ``target`` (halved after a step that does not rise): the
    best value seen. Prices are compared in seconds: mu in units of ``mu_scale`` (objective per
    byte of capacity)."""
    m = t.combo.micro_batches
    x, factor, last, history = start, 1.0, -np.inf, [best]
    aim = target * (1 + AIM_ABOVE)  # a step that keeps the same minimiser lands on the aim, not just short of it
    for _ in range(steps):
        value, sums = relaxation(t, v, x, caps, even, deadline, path=True)
        best = max(best, value)
        history.append(best)
        if best >= target or _stalled(history, target):
            break
        factor = factor if value > last else factor / 2
        last = value
        g_theta, g_u, g_nu = (m - 1) * sums.T, sums.D, mu_scale * (sums.memory - caps)
        g_nu = np.where((x.mu <= 0) & (g_nu < 0), 0.0, g_nu)  # the projection keeps mu at 0 there
        norm2 = np.sum((g_theta - g_theta.mean()) ** 2) + np.sum((g_u - g_u.mean()) ** 2) + np.sum(g_nu ** 2)
        if norm2 <= 0:
            break
        step = factor * (aim - value) / norm2
        x = Prices(_onto_simplex(x.theta + step * g_theta), _onto_simplex(x.u + step * g_u),
                   np.maximum(0.0, x.mu + step * mu_scale * g_nu))
    return best


def _stalled(history: list[float], target: float) -> bool:
    """The last STALL_STEPS steps gained less than STALL_SHARE of what is still missing."""
    if len(history) <= STALL_STEPS:
        return False
    return history[-1] - history[-1 - STALL_STEPS] < STALL_SHARE * (target - history[-1])


def _onto_simplex(y: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {x >= 0, sum x = 1}."""
    s = np.sort(y)[::-1]
    cum = np.cumsum(s) - 1.0
    k = np.flatnonzero(s - cum / np.arange(1, len(y) + 1) > 0)[-1]
    return np.maximum(y - cum[k] / (k + 1), 0.0)


def relaxation(t: ComboTables, v, prices: Prices, caps: np.ndarray, even: bool, deadline: float | None,
               path: bool = False) -> tuple[float, StageSums | None]:
    """The relaxation's value at ``prices`` (least priced sum over plans, any partition or the
    even one when ``even``, memory ignored, less sum_k mu_k cap_k), and with ``path`` its
    minimiser's per-stage sums (a subgradient: the value is linear in the prices through them)."""
    from planners.segments import GroupDP  # segments uses this module
    priced = _priced(t, v, prices)
    dp = GroupDP(priced, exact=False, even=even, deadline=deadline)
    pp, n, G = t.combo.pp, len(t.layer_type), len(t.dp_values)
    built = [dp.relaxed_options(k, v, 0.0) for k in range(pp)]
    recv = [None] + [dp._recv(k) for k in range(1, pp)]
    cells = [_cells(o, n, G, np.inf) for o, _ in built]
    res = _min_sum([c[0] for c in cells], recv, np.inf, n, path=path)
    if res is None:
        return np.inf, None
    value = res[0] - float(np.dot(prices.mu, caps))
    if not path:
        return value, None
    segments = []
    for k, (a, b, g) in enumerate(res[1]):
        p, last, point = built[k][1][int(cells[k][1][a, b, g])]
        received = recv[k][a, res[1][k - 1][2]] / _weight(t, prices, k) if k else 0.0  # priced recv / c_k
        segments.append((a, b, p.strategies(last, point), received))
    return value, stage_sums(t, v, segments)


def stage_sums(t: ComboTables, v, segments: list[tuple[int, int, list[int], float]]) -> StageSums:
    """Per stage, from the unpriced tables: T_k (layers, relayouts inside, embedding/head, the
    send to the next stage and the given gradient received), D_k, and the layers' memory (with the
    embedding/head's per-strategy deltas: the priced memory row) of stages (start, stop,
    strategies, received)."""
    T, D, mem = [], [], []
    lt = t.layer_type
    for k, (a, b, strats, received) in enumerate(segments):
        st, vc, types, s = t.stages[k], t.vocab[v][k], lt[a:b], np.array(strats)
        parts = np.array([st.time_s[types, s].sum() + st.trans_s[types[:-1], s[:-1], s[1:]].sum() + vc.time_s
                          + received + (st.send_next_s[types[-1], s[-1]] if k < len(segments) - 1 else 0.0),
                          st.tail_s[types, s].sum() + vc.tail_s, st.memory_bytes[types, s].sum()])
        for d, i in ((vc.first_delta, 0), (vc.last_delta, -1)):
            if d is not None:
                parts = parts + d[s[i]]
        T.append(parts[0])
        D.append(parts[1])
        mem.append(parts[2])
    return StageSums(np.array(T), np.array(D), np.array(mem))


def _weight(t: ComboTables, prices: Prices, k: int) -> float:
    """c_k = 1 + (m-1) theta_k: the weight of stage k's per-micro-batch time."""
    return 1.0 + (t.combo.micro_batches - 1) * float(prices.theta[k])


def _priced(t: ComboTables, v, prices: Prices) -> ComboTables:
    """The group's tables with stage k's times scaled by c_k, tails by u_k and memory priced at
    mu_k, all folded into the per-micro-batch time (tails zero), for the vocab choice ``v`` only.
    Stage k's gradient send-back is a term of stage k+1's time, so it takes c_{k+1}."""
    pp = t.combo.pp
    c = [_weight(t, prices, k) for k in range(pp)]
    stages = [_priced_stage(st, c[k], prices.u[k], prices.mu[k], c[k + 1] if k + 1 < pp else 0.0)
              for k, st in enumerate(t.stages)]
    vocab = [_priced_vocab(vc, c[k], prices.u[k], prices.mu[k]) for k, vc in enumerate(t.vocab[v])]
    return replace(t, stages=stages, vocab={v: vocab}, shared={})


def _priced_stage(st: StageTables, c: float, w: float, mu: float, c_next: float) -> StageTables:
    ok = np.isfinite(st.time_s)
    mem = np.where(ok, st.memory_bytes, 0.0)
    time_s = np.where(ok, c * st.time_s + w * np.where(ok, st.tail_s, 0.0) + mu * mem, np.inf)
    return replace(st, time_s=time_s, tail_s=np.zeros_like(st.tail_s), trans_s=c * st.trans_s,
                   send_next_s=c * st.send_next_s, send_prev_s=c_next * st.send_prev_s,
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
