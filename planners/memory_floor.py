"""A memory-aware lower bound on one group's objective with the partition left exact: per
segment, the LP (knapsack) bound on its time under the stage's memory row, relayouts dropped;
then ``partition.partition_floor`` over the segments and the bottleneck caps.

Why: a Lagrangian bound (one that prices memory and the bottleneck together, tried before
this one) may mix partitions fractionally, and with 20 layers a stage half a layer is 2.5% of the objective
(llama2-70b pp 4 converged 0.5% below a group whose plans are 2.5% above). Here each segment
[a, b) gets its own price, and the bottleneck cap runs over whole partitions.

For a segment on stage k, a price mu >= 0 s/byte and a level l (the stage's largest temporary,
so only strategies whose temporary is <= l), any plan that fits satisfies
  sum_j mem_j <= cap_l = budget - embedding/head memory - max(l, embedding/head temporary),
so its cost C (T_k, or T_k + lam D_k) is at least sum_j min_s (c_js + mu mem_js) - mu cap_l:
relayouts (>= 0) dropped, each layer minimised alone (weak duality). The bound is the least
over levels of the largest over prices; the prices tried are the breakpoints of each layer
type's min_s (c + mu mem) (the slopes of the lower convex hull of (mem, c)), where the largest
over prices of the middle layers' sum lies, and 0.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from planners.counts import MAX_COUNT_LAYERS, count_bounds, segment_classes
from planners.pareto import _hull_prices
from planners.partition import StageOptions, Windows, partition_floor
from planners.tables import ComboTables, VocabCost, layer_temp_levels

MAX_LEVELS = 12
"""Temporary levels tried per stage (the largest kept; each level l stands for every level up to
the next one tried, with the cap of the lower: still a bound, a little looser)."""


def memory_floor(t: ComboTables, v, windows: tuple[Windows, ...], recv: list, counts: bool = False,
                 incumbent_s: float = np.inf) -> float:
    """A lower bound on the objective of the group ``t`` under vocab choice ``v`` over the
    partitions of ``windows`` (every stage's allowed (start, stop)): the least over partitions
    of sum_k (T_k + D_k / pp) + (m - 1) max_k T_k with every term bounded per segment as above
    (max_k D_k >= their mean). ``recv``: GroupDP._recv per stage (None for stage 0); the dp of
    a stage's last layer is left free (each segment at its least over it, each gradient
    received at its least over the sender's dp), which keeps the partition search one layer of
    dp values small. ``counts``: short segments of identical layers also take the integer bound
    of counts.count_bounds where larger (tighter on short stages, and dearer); with one stage
    (pp = 1) its one segment at any length: the chain of identical middle layers is built once
    per group and every vocab choice only adds its first and last rows, and on a long stage
    packed to the budget the LP bound's fractional layer still leaves a few tenths of a percent
    (llama3-70b on 1024 H100: 12.922 against the optimum 12.956 s, the count bound 12.956).
    ``incumbent_s``: an objective a bound need not exceed (one at or above it rules the group out
    all the same); with one stage its count chain then drops the sums that cannot complete below
    it (counts.ChainCut), and the bound is at most that cut's level."""
    pp, n, m = t.combo.pp, len(t.layer_type), t.combo.micro_batches
    lam = 1.0 / pp if pp > 1 else 1.0 / m  # pp = 1: m (T + D/m) = m T + D
    sums, maxes = [], []
    for k in range(pp):
        a, b = windows[k].starts, windows[k].stops
        if pp == 1:  # the objective is m (the stage's T + lam D): its segment need not exceed incumbent / m
            vc = t.vocab[v][0]
            cutoff = incumbent_s / m - vc.time_s - lam * vc.tail_s
            sums.append(_options(a, b, segment_bounds(t, v, k, lam, windows[k], counts, cutoff)))
            continue
        sums.append(_options(a, b, _shared_segment_bounds(t, v, k, lam, windows[k], counts)))
        maxes.append(_options(a, b, _shared_segment_bounds(t, v, k, 0.0, windows[k], counts)) if pp > 1 else None)
    if pp == 1:
        o = sums[0]
        return float(m * np.min(o.T[(o.a == 0) & (o.b == n)], initial=np.inf))
    least_recv = [None] + [r.min(axis=1, keepdims=True) for r in recv[1:]]
    return partition_floor(sums, maxes, least_recv, n, 1, t.combo.formula)


LAYERS_ONLY = "layers only"
"""The vocab choice of layers_floor's tables: no embedding or head."""


def layers_floor(t: ComboTables, windows: tuple[Windows, ...], incumbent_s: float = np.inf) -> float:
    """memory_floor (the LP bound) of layer tables alone (build_layer_tables: no relayouts, sends
    or vocabulary), with the embedding and head at nothing, the sends at 0 and relayouts dropped:
    each is >= 0 under every vocab choice and strategy, so this bounds the group's objective under
    each of its vocab choices before any of them is built."""
    zero = np.zeros_like(t.stages[0].time_s)
    bare = replace(t, stages=[replace(st, send_next_s=zero) for st in t.stages], shared={},
                   vocab={LAYERS_ONLY: [VocabCost(0.0, 0.0, 0.0, 0.0)] * t.combo.pp})
    recv = [None] + [np.zeros((len(t.layer_type) + 1, 1))] * (t.combo.pp - 1)
    return memory_floor(bare, LAYERS_ONLY, windows, recv, incumbent_s=incumbent_s)


def _options(a: np.ndarray, b: np.ndarray, bound: np.ndarray) -> StageOptions:
    """The segments (a, b) with a finite ``bound``, as options (dp index 0, tails 0)."""
    seg = np.flatnonzero(np.isfinite(bound))
    return StageOptions(a[seg], b[seg], np.zeros(len(seg), dtype=int), bound[seg], np.zeros(len(seg)))


def _shared_segment_bounds(t: ComboTables, v, k: int, lam: float, windows: Windows,
                           counts: bool) -> np.ndarray:
    """segment_bounds, kept in ComboTables.shared for a stage whose embedding/head adds no
    per-strategy deltas (the stages between the first and the last): there it depends on the
    vocab choice only through the four numbers of its VocabCost, which every vocab choice of the
    group shares, so the group's vocab choices (and any_vocab_floor's merged choice) compute it
    once rather than once each. The entry keeps the stage tables and the allowed mask it was
    computed from and is used only with those same objects."""
    vc = t.vocab[v][k]
    if vc.first_delta is not None or vc.last_delta is not None:
        return segment_bounds(t, v, k, lam, windows, counts)
    key = ("segment_bounds", k, float(lam), bool(counts), float(t.budget_bytes), float(vc.time_s),
           float(vc.tail_s), float(vc.memory_bytes), float(vc.temp_bytes), windows)
    hit = t.shared.get(key)
    if hit is not None and hit[0] is t.stages[k] and hit[1] is t.allowed and hit[2] is t.layer_type:
        return hit[3]
    out = segment_bounds(t, v, k, lam, windows, counts)
    t.shared[key] = (t.stages[k], t.allowed, t.layer_type, out)
    return out


def segment_bounds(t: ComboTables, v, k: int, lam: float, windows: Windows, counts: bool = False,
                   cutoff_s: float = np.inf) -> np.ndarray:
    """[window] a lower bound on T_k + lam D_k of the segment's layers on stage k over plans
    whose stage k fits (inf where none can; the gradient received from stage k+1 is the
    partition's): the LP bound, computed once per class of segments holding the same rows
    (counts.segment_classes: one per length for identical layers), and with ``counts`` the
    integer one of counts.count_bounds where larger (``cutoff_s``: its cut, with one stage)."""
    st, vc = t.stages[k], t.vocab[v][k]
    rows, inverse = _distinct_rows(t, v, k)
    cost, mem, temp = _layer_arrays(t, v, k, lam, rows)  # [row, strategy]: each distinct row once
    last_cost = cost + (st.send_next_s[t.layer_type[rows]] if k < t.combo.pp - 1 else 0.0)
    classes = segment_classes((cost, last_cost, mem, temp), inverse, windows)
    a, b = classes.a, classes.b
    prices = np.unique(np.concatenate([[0.0]] + [_hull_prices(mem[r], cost[r]) for r in range(len(rows))]))
    out, free = np.full(len(a), np.inf), np.full(len(a), np.inf)  # free: at price 0 (memory ignored)
    levels = _levels(temp, vc.temp_bytes)
    if levels:  # every level at once: [level, price, layer], then [level, price, segment]
        level, floor = (np.array(x) for x in zip(*levels))
        cap = t.budget_bytes - vc.memory_bytes - np.maximum(floor, vc.temp_bytes)
        priced = _priced_min(cost, mem, temp, level, prices)[:, :, inverse]
        # as the segment's last layer
        last = _priced_min(last_cost, mem, temp, level, prices)[:, :, inverse]
        missing = np.concatenate((np.zeros((len(level), 1), dtype=int), np.cumsum(~np.isfinite(priced[:, 0]), axis=1)),
                                 axis=1)
        prefix = np.concatenate((np.zeros((*priced.shape[:2], 1)),
                                 np.cumsum(np.where(np.isfinite(priced), priced, 0.0), axis=2)), axis=2)
        # segment [a, b): prefix[b-1] - prefix[a] + last[b-1] - mu cap, the largest over prices
        val = prefix[:, :, b - 1] - prefix[:, :, a] + last[:, :, b - 1] - prices[None, :, None] * cap[:, None, None]
        no_plan = missing[:, b - 1] - missing[:, a] > 0  # a layer of a..b-2 has no strategy
        out = np.where(no_plan, np.inf, np.max(val, axis=1)).min(axis=0)  # least over levels
        free = np.where(no_plan, np.inf, val[:, 0]).min(axis=0)
    if counts:  # only where memory lifts the LP bound: elsewhere the counts rarely add anything
        binds = np.isfinite(out) & (out > free)
        longest = len(t.layer_type) if t.combo.pp == 1 else MAX_COUNT_LAYERS  # one stage: one chain a group
        counted = count_bounds(t, classes, layer_temp_levels(t), vc.memory_bytes, vc.temp_bytes, longest, among=binds,
                               cutoff_s=cutoff_s if t.combo.pp == 1 else np.inf)
        out = np.where(np.isfinite(counted) & np.isfinite(out), np.maximum(out, counted), out)
    return out[classes.of_window] + vc.time_s + lam * vc.tail_s


def _distinct_rows(t: ComboTables, v, k: int) -> tuple[np.ndarray, np.ndarray]:
    """One layer per distinct row of the stage's arrays (layer type; layer 0 and the last layer
    apart where the embedding/head adds per-strategy deltas), and each layer's row."""
    key = t.layer_type.copy()
    vc = t.vocab[v][k]
    if vc.first_delta is not None:
        key[0] = -1
    if vc.last_delta is not None:
        key[-1] = -2
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def _layer_arrays(t: ComboTables, v, k: int, lam: float, layers: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[layer, strategy] cost (T + lam D), memory and temporary of each of ``layers`` (None:
    every layer) on stage k, the embedding's and the head's per-strategy deltas on layer 0 / the
    last layer; inf where not allowed."""
    st, vc = t.stages[k], t.vocab[v][k]
    layers = np.arange(len(t.layer_type)) if layers is None else layers
    lt = t.layer_type[layers]
    ok = t.allowed[lt]
    cost = np.where(ok, st.time_s[lt] + lam * np.where(ok, st.tail_s[lt], 0.0), np.inf)
    mem = np.where(ok, st.memory_bytes[lt], np.inf)
    for d, j in ((vc.first_delta, 0), (vc.last_delta, len(t.layer_type) - 1)):
        if d is not None:
            at = layers == j
            cost[at] = cost[at] + d[:, 0] + lam * d[:, 1]
            mem[at] = mem[at] + d[:, 2]
    return cost, mem, np.where(ok, st.temp_bytes[lt], np.inf)


def _priced_min(cost: np.ndarray, mem: np.ndarray, temp: np.ndarray, levels: np.ndarray, prices: np.ndarray
                ) -> np.ndarray:
    """[level, price, layer] min over the strategies whose temporary is at most the level of
    cost + mu mem (inf where none): the running minimum over the strategies in order of their
    temporaries, read at each level's last."""
    ok = np.isfinite(cost) & np.isfinite(mem) & np.isfinite(temp)
    # [price, layer, strategy]
    priced = np.where(ok, cost, np.inf)[None] + prices[:, None, None] * np.where(ok, mem, 0.0)[None]
    order = np.argsort(np.where(ok, temp, np.inf), axis=1, kind="stable")
    running = np.minimum.accumulate(np.take_along_axis(priced, order[None], axis=2), axis=2)
    counts = np.array([np.searchsorted(np.sort(np.where(ok[j], temp[j], np.inf)), levels, side="right")
                       for j in range(len(temp))])  # [layer, level]: strategies within each level
    out = np.full((len(levels), len(prices), len(temp)), np.inf)
    for j in range(len(temp)):
        within = counts[j] > 0
        out[within, :, j] = running[:, j, counts[j][within] - 1].T
    return out


def _levels(temp: np.ndarray, vocab_temp: float) -> list[tuple[float, float]]:
    """(level, floor) pairs to try: a plan whose largest layer temporary t lies in (previous
    level, level] uses only strategies with temporaries <= level and holds at least
    max(floor, embedding/head temporary), floor the least distinct temporary above the previous
    level. Levels below the embedding/head's temporary give the same cap with fewer strategies
    (a larger bound), so the largest of them stands for all; at most MAX_LEVELS, the largest kept."""
    vals = np.unique(temp[np.isfinite(temp)])
    if not len(vals):
        return []
    low = np.flatnonzero(vals <= vocab_temp)
    vals = vals[low[-1]:] if len(low) else vals
    idx = np.unique(np.linspace(0, len(vals) - 1, min(MAX_LEVELS, len(vals))).round().astype(int))
    floors = [vals[0]] + [vals[i + 1] for i in idx[:-1]]
    return list(zip(vals[idx], floors))
