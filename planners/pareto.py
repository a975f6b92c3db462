"""Layer-by-layer DP over Pareto-optimal (memory, time) points: exact in memory, no MB bins.

A point is one partial plan of a stage's first j layers: its summed memory, the level of its
largest temporary buffer, its per-micro-batch time T, per-iteration tail D and a back-pointer.
Fast mode keeps points not dominated in (temp level, memory, T + w*D); exact mode keeps points
not dominated in (temp level, memory, T, D), which is what the pipeline objective needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from planners.tables import StageTables


@dataclass
class Frontier:
    """Non-dominated partial plans after one layer (flat over the layer's strategies)."""

    mem: np.ndarray
    level: np.ndarray
    T: np.ndarray
    D: np.ndarray
    strat: np.ndarray
    parent: np.ndarray
    """Index into the previous layer's frontier (-1 at the segment's first layer)."""

    def __len__(self) -> int:
        return len(self.mem)

    def take(self, idx: np.ndarray) -> "Frontier":
        return Frontier(self.mem[idx], self.level[idx], self.T[idx], self.D[idx], self.strat[idx], self.parent[idx])


def _staircase_keep(mem: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices (into the inputs) of the 2-D (mem, cost) non-dominated points, ascending mem."""
    order = np.lexsort((cost, mem))
    c = cost[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], c[:-1])))
    return order[c < best_before]


TIE_RTOL = 1e-12
"""Costs this close count as equal, so that the tie goes to the smaller tail."""


def argmin_low_tail(cost: np.ndarray, tail: np.ndarray):
    """argmin of ``cost`` along axis 0, ties going to the smaller ``tail`` (broadcastable to it): under a
    weight that ignores tails (T + 0 * D) ZeRO-1 then wins over DDP at equal time, which matters
    on the stage whose tail is the maximum."""
    low = cost.min(axis=0)
    tied = cost <= low + TIE_RTOL * np.abs(low)
    best = np.argmin(np.where(tied, tail, np.inf), axis=0)
    return int(best) if np.ndim(best) == 0 else best


FEW_SOURCES = 16
"""Below this many points the memory-blind step compares every source with every target."""


def _class_heads(cls: np.ndarray, cost: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """Per class present in ``cls`` (small non-negative ints): the index of its cheapest point,
    ties going to the smaller tail."""
    inv = cls
    low = np.full(inv.max() + 1, np.inf)
    np.minimum.at(low, inv, cost)
    key = np.where(cost <= low[inv] + TIE_RTOL * np.abs(low[inv]), tail, np.inf)
    order = np.lexsort((np.arange(len(cost)), key, inv))
    first = np.concatenate(([True], inv[order][1:] != inv[order][:-1]))
    return order[first]


def prune_fast(level: np.ndarray, mem: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of points not dominated in (level, mem, cost), in (mem, cost, level) order.

    Sorted by (mem, cost, level), point i is dominated iff an earlier point of level <= its own
    has cost <= its own (of equal points the first is kept). Few levels x points: one running
    minimum per level threshold, all at once; many: first the points an earlier point of their
    own level dominates are dropped (``_level_fronts``), which leaves few, then the same on the
    rest (a point dominated by a dropped one is dominated by the point of its level that dropped
    it, or by one before that: the kept set is the same). Over GRID_ABOVE points, those that a
    grid of (level, memory bucket) cells shows dominated go first (``_grid_survivors``)."""
    if len(mem) <= 1:
        return np.arange(len(mem))
    if len(mem) > GRID_ABOVE:
        rest = _grid_survivors(level, mem, cost)
        if len(rest) < len(mem):
            return rest[prune_fast(level[rest], mem[rest], cost[rest])]
    levels = np.flatnonzero(np.bincount(level))  # levels index the sorted temporaries: small ints
    if len(levels) * len(mem) > LEVEL_FRONTS_ABOVE:
        front = np.sort(_level_fronts(level, mem, cost))  # in index order: ties go the same way
        return front[_prune_running(level[front], mem[front], cost[front], levels)]
    return _prune_running(level, mem, cost, levels)


GRID_ABOVE = 2_000
"""Points beyond which prune_fast first drops those a grid of cells finds dominated (on
DeepSeek-V3's count frontiers, a few thousand points, under a third are left)."""
GRID_BUCKETS = 256
"""Memory buckets of that grid (per level). Finer buckets leave fewer points to sort: on count
frontiers of llama3-70b on 1024 H100 (~49,000 sums) 64 buckets left ~13,200, 256 ~11,200, and
prune_fast took 6.5 ms against 8.6; on DeepSeek-V3's 2.6 against 4.0 ms (512 buckets: no faster)."""


def _grid_survivors(level: np.ndarray, mem: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the points that no point of a lower memory bucket and of level <=
    their own beats in cost, over GRID_BUCKETS buckets of the memory range per level: each cell's
    least cost (one stable sort of small integer keys), a running minimum over levels and
    buckets. Only points of strictly less memory dominate, so every point prune_fast keeps, and
    each of equal points, survive; all where the values are not finite or the cells too many."""
    lo, hi = mem.min(), mem.max()
    levels, width = int(level.max()) + 1, GRID_BUCKETS + 1
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo and np.isfinite(cost).all()
            and level.min() >= 0 and levels * width < 2 ** 15):
        return np.arange(len(mem))
    bucket = ((mem - lo) * (GRID_BUCKETS / (hi - lo))).astype(np.int16)  # monotone in mem: 0..GRID_BUCKETS
    cell = level.astype(np.int16) * np.int16(width) + bucket
    order = np.argsort(cell, kind="stable")  # radix sort of 16-bit keys
    ordered = cell[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    least = np.full(levels * width, np.inf)
    least[ordered[starts]] = np.minimum.reduceat(cost[order], starts)
    least = np.minimum.accumulate(np.minimum.accumulate(least.reshape(levels, width), axis=0), axis=1)
    below = np.concatenate((np.full((levels, 1), np.inf), least[:, :-1]), axis=1).ravel()  # buckets < own
    return np.flatnonzero(~(below[cell] <= cost))


LEVEL_FRONTS_ABOVE = 20_000
"""levels x points beyond which prune_fast first drops the points dominated within their level
(on DeepSeek-V3's count frontiers, ~9,000 points over ~45 levels, ~7% survive)."""


def _prune_running(level: np.ndarray, mem: np.ndarray, cost: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """prune_fast by one running minimum of cost per level threshold (``levels``: those present)."""
    order = lexsort((level, cost, mem))
    lv, c = level[order], cost[order]
    masked = np.where(lv[None, :] <= levels[:, None], c[None, :], np.inf)
    running = np.minimum.accumulate(masked, axis=1)
    before = np.concatenate((np.full((len(levels), 1), np.inf), running[:, :-1]), axis=1)
    row = np.searchsorted(levels, lv)
    dominated = before[row, np.arange(len(c))] <= c
    return order[~dominated]


def lexsort(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """np.lexsort(keys) (the last key first, ties in index order), for many points by one
    unstable sort of one integer code: each key's rank among its values (the same order and
    ties; a key of small non-negative integers is its own), then the index, in mixed radix;
    np.lexsort itself for few points, or where the code would overflow."""
    n = len(keys[0])
    if n < LEXSORT_CODE_ABOVE:
        return np.lexsort(keys)
    code, span = np.zeros(n, dtype=np.int64), n
    for key in reversed(keys):
        small = key.dtype.kind in "iu" and 0 <= key.min() and key.max() < n  # levels: their own ranks
        rank, size = (key.astype(np.int64), int(key.max()) + 1) if small else _dense_rank(key)
        span *= size
        if span >= 2 ** 62:
            return np.lexsort(keys)
        code = code * size + rank
    return np.argsort(code * n + np.arange(n))


LEXSORT_CODE_ABOVE = 2_000
"""Points beyond which ``lexsort`` sorts one integer code (about twice as fast as np.lexsort at
10,000 points, slower at a few hundred)."""


def _dense_rank(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's rank among the distinct values of ``x`` (equal values one rank; NaN last, as
    np.sort puts them), and how many ranks there are."""
    perm = np.argsort(x)
    ordered = x[perm]
    step = np.empty(len(x), dtype=np.int64)
    step[0] = 0
    np.not_equal(ordered[1:], ordered[:-1], out=step[1:])
    if ordered.dtype.kind == "f":  # NaN != NaN: the NaNs (sorted last) share one rank
        nan = np.isnan(ordered)
        step[1:][nan[1:] & nan[:-1]] = 0
    rank = np.empty(len(x), dtype=np.int64)
    rank[perm] = np.cumsum(step)
    return rank, int(rank[perm[-1]]) + 1


def _running_min_before(c: np.ndarray) -> np.ndarray:
    return np.minimum.accumulate(np.concatenate(([np.inf], c[:-1])))


def _level_fronts(level: np.ndarray, mem: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of the points that no earlier point of their own level beats in (mem, cost)
    order: each level's (mem, cost) staircase, the first of equal points kept."""
    order = lexsort((cost, mem, level))
    lv, c = level[order], cost[order]
    cuts = (np.flatnonzero(lv[1:] != lv[:-1]) + 1).tolist()
    keep = np.empty(len(c), dtype=bool)
    for start, stop in zip([0] + cuts, cuts + [len(c)]):
        keep[start:stop] = c[start:stop] < _running_min_before(c[start:stop])
    return order[keep]


def prune_exact(level: np.ndarray, mem: np.ndarray, T: np.ndarray, D: np.ndarray) -> np.ndarray:
    """Indices of points not dominated in (level, mem, T, D), one per distinct point (its first),
    in (level, mem, T, D) order. In (mem, T, D, level) order a point can be dominated only by an
    earlier one, and (dominance being transitive) by an earlier kept one if by any. Blocks of
    EXACT_BLOCK points go in that order: each point is checked against the points kept before its
    block through one staircase per level (the (T, D) Pareto front of the kept points of that
    level or lower), then the block's survivors against one another: O(points x (levels x log +
    survivors a block)), not O(points^2)."""
    n = len(mem)
    if n == 0:
        return np.arange(0)
    order = np.lexsort((np.arange(n), level, D, T, mem))
    levels, lv = np.unique(level[order], return_inverse=True)
    t, d = T[order], D[order]
    stairs = [(np.empty(0), np.empty(0))] * len(levels)  # per level: T ascending, D strictly falling
    kept = np.zeros(n, dtype=bool)
    block = min(n, EXACT_BLOCK)
    earlier = np.triu(np.ones((block, block), dtype=bool), k=1)  # [i, j]: i before j
    for s in range(0, n, block):
        bl, bt, bd = lv[s:s + block], t[s:s + block], d[s:s + block]
        beaten = np.zeros(len(bl), dtype=bool)
        for k in np.unique(bl):
            st, sd = stairs[k]
            if len(st):
                at = np.flatnonzero(bl == k)
                pos = np.searchsorted(st, bt[at], side="right") - 1  # the kept point of T <= t with least D
                beaten[at] = (pos >= 0) & (sd[np.maximum(pos, 0)] <= bd[at])
        alive = np.flatnonzero(~beaten)  # a point beaten by a beaten one is beaten by a kept one
        al, a_t, a_d = bl[alive], bt[alive], bd[alive]
        beaten[alive] = (earlier[:len(alive), :len(alive)] & (al[:, None] <= al) & (a_t[:, None] <= a_t)
                         & (a_d[:, None] <= a_d)).any(axis=0)
        kept[s:s + len(bl)] = new = ~beaten
        if s + len(bl) < n:
            for k in range(int(bl[new].min()) if new.any() else len(levels), len(levels)):
                add = new & (bl <= k)
                stairs[k] = _staircase(np.concatenate((stairs[k][0], bt[add])), np.concatenate((stairs[k][1], bd[add])))
    out = order[kept]
    return out[np.lexsort((D[out], T[out], mem[out], level[out]))]


EXACT_BLOCK = 512
"""Points prune_exact takes at once (measured on the 8 GiB compare cell's pp 2 proof: 256 and
1024 were 15% and 35% slower)."""


def _staircase(t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (t, d) points no other has both coordinates at most: t ascending, d strictly falling."""
    o = np.lexsort((d, t))
    o = o[d[o] < _running_min_before(d[o])]
    return t[o], d[o]


@dataclass(frozen=True)
class Completion:
    """The least a stage's layers after layer j still add, for a pass read only at the stage's
    last layer: memory, and m t + d given the memory left. The latter is the LP relaxation of
    that knapsack (one strategy per later layer, their memory within what is left; relayouts,
    >= 0, left out) through its dual: for every price mu >= 0, sum over later layers of
    min_s (c + mu mem) - mu x left is a lower bound (weak duality); at the slopes of each layer
    type's lower convex hull of (mem, c), the max over prices is the LP optimum."""

    prices: np.ndarray
    """[K] mu in seconds per byte, 0 first."""
    cost_after: np.ndarray
    """[K, layer j] sum over the layers after j of min_s (m t + d + mu mem)."""
    memory_after: np.ndarray
    """[layer j] sum over the layers after j of their least memory."""

    @staticmethod
    def of(cost: np.ndarray, memory: np.ndarray, layer_type: np.ndarray) -> "Completion":
        """From [type, strategy] m t + d and memory (inf where not allowed)."""
        prices = np.unique(np.concatenate([[0.0]] + [_hull_prices(memory[t], cost[t]) for t in range(len(cost))]))
        ok = np.isfinite(cost) & np.isfinite(memory)
        priced = np.where(ok[None], cost[None] + prices[:, None, None] * np.where(ok, memory, 0.0)[None], np.inf)
        least = priced.min(axis=2)[:, layer_type]  # [K, layer]
        return Completion(prices, _after(least), _after(np.where(ok, memory, np.inf).min(axis=1)[layer_type]))

    def least(self, j: int, left: np.ndarray) -> np.ndarray:
        """Per point with ``left`` bytes still free: the least m t + d the later layers add."""
        big = np.finfo(float).max / 4
        left = np.clip(left, -big, big)  # 0 x inf would be nan
        return np.max(self.cost_after[:, j][:, None] - self.prices[:, None] * left[None, :], axis=0)


def _after(per_layer: np.ndarray) -> np.ndarray:
    """[..., j] the sum of ``per_layer`` over the layers after j (last axis)."""
    rev = np.cumsum(per_layer[..., ::-1], axis=-1)[..., ::-1]
    return np.concatenate((rev[..., 1:], np.zeros(per_layer.shape[:-1] + (1,))), axis=-1)


def _hull_prices(memory: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """-slopes of the lower convex hull of the finite (memory, cost) points where cost falls
    as memory grows: the prices at which the cheapest strategy changes."""
    ok = np.isfinite(memory) & np.isfinite(cost)
    x, y = memory[ok], cost[ok]
    order = np.lexsort((y, x))
    x, y = x[order], y[order]
    stair = y < _running_min_before(y)
    x, y = x[stair], y[stair]
    hull: list[int] = []
    for i in range(len(x)):
        while len(hull) >= 2 and ((x[hull[-1]] - x[hull[-2]]) * (y[i] - y[hull[-2]])
                                  - (y[hull[-1]] - y[hull[-2]]) * (x[i] - x[hull[-2]])) <= 0:
            hull.pop()
        hull.append(i)
    return -np.diff(y[hull]) / np.diff(x[hull])


@dataclass
class SegmentPass:
    """One DP pass of a stage starting at layer ``start``: frontiers after each layer."""

    stage: int
    start: int
    frontiers: list[Frontier]
    _arrays: tuple | None = field(default=None, repr=False, compare=False)
    _memory: tuple | None = field(default=None, repr=False, compare=False)

    def scalar_arrays(self, n_strategies: int) -> tuple[np.ndarray, np.ndarray]:
        """[layer, strategy] T and D of a memory-blind pass's points (one per strategy, in
        strategy order; T inf, D 0 where none), built once."""
        if self._arrays is None:
            T, D = np.full((len(self.frontiers), n_strategies), np.inf), np.zeros((len(self.frontiers), n_strategies))
            for j, f in enumerate(self.frontiers):
                T[j, f.strat], D[j, f.strat] = f.T, f.D
            self._arrays = (T, D)
        return self._arrays

    def scalar_memory(self, n_strategies: int) -> tuple[np.ndarray, np.ndarray]:
        """[layer, strategy] memory and temporary level of the same points (0 where none), built once."""
        if self._memory is None:
            shape = (len(self.frontiers), n_strategies)
            mem, level = np.zeros(shape), np.zeros(shape, dtype=int)
            for j, f in enumerate(self.frontiers):
                mem[j, f.strat], level[j, f.strat] = f.mem, f.level
            self._memory = (mem, level)
        return self._memory

    def strategies(self, last: int, point: int) -> list[int]:
        """Strategy indices of layers start..start+last for the point ``point`` of layer ``last``."""
        out = []
        for j in range(last, -1, -1):
            f = self.frontiers[j]
            out.append(int(f.strat[point]))
            point = int(f.parent[point])
        return out[::-1]


class PassRunner:
    """Runs the DP through a stage's layers; exact or fast pruning, memory cap per temp level."""

    def __init__(self, st: StageTables, layer_type: np.ndarray, allowed: np.ndarray, levels: np.ndarray,
                 cap_by_level: np.ndarray, weight: float, exact: bool, first_extra: np.ndarray | None = None,
                 check: Callable[[], None] | None = None) -> None:
        self.st, self.layer_type, self.allowed = st, layer_type, allowed
        self.check = check
        """Called before each layer's Pareto step (the caller's deadline: it raises to stop)."""
        self.levels = levels
        """Sorted distinct temporary sizes; a point's level indexes it."""
        self.cap_by_level = cap_by_level
        """Largest summed memory a point of each level may have (the loosest vocab choice)."""
        self.weight, self.exact = weight, exact
        self.first_extra = first_extra
        """[strategy, (T, D, memory)] added to layer 0 (the embedding's share that follows its dp type)."""
        self.strat_level = np.searchsorted(levels, np.where(np.isfinite(st.temp_bytes), st.temp_bytes, 0.0))
        self._classes: dict[int, tuple] = {}
        self.points = 0
        self.candidates = 0
        """Points handed to _prune (its cost, about linear in them)."""
        self.cut: tuple[float, np.ndarray, float, float] | None = None
        """(m, offset by layer, incumbent, least layer time): a point with
        m T + D + offset[j] + (layers off its segment) x least >= incumbent after layer j cannot
        lead to a better plan: plan_cost's time >= m T_k + D_k + sum_{i != k} T_i on any stage k,
        and every layer on another stage adds at least the least time of any layer there."""
        self.span = (0, 0)
        """(start, stop) of the pass under way."""
        self.completion: Completion | None = None
        """What the stage's layers after j add at least (when its segment ends at the stage's end)."""

    def cut_above(self, m: int, offset_by_layer: np.ndarray, incumbent_s: float,
                  completion: "Completion | None" = None, least_layer_s: float = 0.0) -> None:
        """Drop Pareto points that cannot beat ``incumbent_s`` (see ``cut``; inf: keep all), and
        with a ``completion`` (the layers after j still to come on this stage) the points whose
        later layers cannot fit or cannot beat it in the memory left (a later temporary only
        lowers the cap)."""
        self.cut = (float(m), offset_by_layer, incumbent_s, least_layer_s) if np.isfinite(incumbent_s) else None
        self.completion = completion

    def run(self, stage: int, start: int, stop: int) -> SegmentPass:
        """Frontiers for layers start..stop-1."""
        self.span = (start, stop)
        frontiers = [self._first(start)]
        for j in range(start + 1, stop):
            if self.check is not None:
                self.check()
            frontiers.append(self._step(frontiers[-1], j))
        return SegmentPass(stage, start, frontiers)

    def run_scalar(self, stage: int, start: int, stop: int) -> SegmentPass:
        """The same layers ignoring memory: one point per strategy, the cheapest path ending in it.
        Where that point fits, it is the answer and no Pareto pass is needed."""
        first = self._first_unpruned(start)
        frontiers = [first]
        for j in range(start + 1, stop):
            frontiers.append(self._scalar_step(frontiers[-1], j))
        return SegmentPass(stage, start, frontiers)

    def _first_unpruned(self, j: int) -> Frontier:
        saved = self.cap_by_level, self.cut
        self.cap_by_level, self.cut = np.full(len(self.levels), np.inf), None
        try:
            return self._first(j)
        finally:
            self.cap_by_level, self.cut = saved

    def _scalar_step(self, prev: Frontier, j: int) -> Frontier:
        """Per target strategy the cheapest path into it. Sources whose relayout rows are equal
        (a layout class) reach every target at the same price, so only each class's cheapest point
        (ties to the smaller tail) competes: O(classes x targets), not O(strategies^2)."""
        if not len(prev):
            return prev
        R = self.st.trans_s[self.layer_type[j - 1]]
        src_cls = self._source_target_classes(self.layer_type[j - 1])[0]
        ty = self.layer_type[j]
        st = self.st
        targets = np.flatnonzero(self.allowed[ty])
        cost = self._cost(prev.T, prev.D)
        heads = _class_heads(src_cls[prev.strat], cost, prev.D) if len(prev) > FEW_SOURCES else np.arange(len(prev))
        total = cost[heads][:, None] + R[prev.strat[heads]][:, targets]
        best = heads[argmin_low_tail(total, prev.D[heads][:, None])]
        shift = R[prev.strat[best], targets]
        f = Frontier(prev.mem[best] + st.memory_bytes[ty, targets],
                     np.maximum(prev.level[best], self.strat_level[ty, targets]),
                     prev.T[best] + shift + st.time_s[ty, targets], prev.D[best] + st.tail_s[ty, targets],
                     targets, best)
        self.points += len(f)
        return f

    def _cost(self, T: np.ndarray, D: np.ndarray) -> np.ndarray:
        return T + self.weight * D

    def _first(self, j: int) -> Frontier:
        ty = self.layer_type[j]
        strat = np.flatnonzero(self.allowed[ty])
        st = self.st
        f = Frontier(st.memory_bytes[ty, strat], self.strat_level[ty, strat], st.time_s[ty, strat],
                     st.tail_s[ty, strat], strat, np.full(len(strat), -1))
        if j == 0 and self.first_extra is not None:
            extra = self.first_extra[strat]
            f = Frontier(f.mem + extra[:, 2], f.level, f.T + extra[:, 0], f.D + extra[:, 1], f.strat, f.parent)
        return self._finish(f, j)

    def _finish(self, f: Frontier, j: int) -> Frontier:
        with np.errstate(invalid="ignore"):  # inf - inf: a memory-blind pass meets a layout of infinite
            left = self.cap_by_level[f.level] - f.mem  # memory (one the cost model cannot score)
        left = np.where(np.isnan(left), -np.inf, left)  # it never fits
        ok = left >= (0.0 if self.completion is None else self.completion.memory_after[j])
        if self.cut is not None:
            m, offset, incumbent, least = self.cut
            start, stop = self.span
            # layers off the segment: all but start..j, less those after j that the completion holds
            off = len(self.layer_type) - (j - start + 1) - (0 if self.completion is None else stop - 1 - j)
            owed = offset[j] + off * least + (0.0 if self.completion is None else self.completion.least(j, left))
            ok &= m * f.T + f.D + owed < incumbent
        f = f.take(np.flatnonzero(ok))
        self.points += len(f)
        return f

    def _source_target_classes(self, ty: int) -> tuple:
        """Strategies with identical relayout rows (sources) / columns (targets) share a class."""
        if ty not in self._classes:
            self._classes[ty] = (*self.st.relayout_classes(ty), self.st.finite_relayouts(ty))
        return self._classes[ty]

    def _step(self, prev: Frontier, j: int) -> Frontier:
        if not len(prev):
            return prev
        src_cls, dst_cls, R = self._source_target_classes(self.layer_type[j - 1])
        ty = self.layer_type[j]
        st = self.st
        targets = np.flatnonzero(self.allowed[ty])
        pieces = []
        by_source = self._unions_by_source(prev, src_cls)
        for h in np.unique(dst_cls[targets]):
            members = targets[dst_cls[targets] == h]
            cand = self._shifted(prev, by_source, R[:, members[0]])
            col = members[:, None]  # every member after every candidate, member by member
            pieces.append(Frontier((cand.mem + st.memory_bytes[ty, col]).ravel(),
                                   np.maximum(cand.level, self.strat_level[ty, col]).ravel(),
                                   (cand.T + st.time_s[ty, col]).ravel(), (cand.D + st.tail_s[ty, col]).ravel(),
                                   np.repeat(members, len(cand)), np.tile(cand.parent, len(members))))
        if not pieces:
            return Frontier(*(np.empty(0),) * 4, np.empty(0, dtype=int), np.empty(0, dtype=int))
        f = Frontier(*(np.concatenate([getattr(p, a) for p in pieces])
                       for a in ("mem", "level", "T", "D", "strat", "parent")))
        return self._finish(f, j)

    def _unions_by_source(self, prev: Frontier, src_cls: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Per source class: the representative strategy and the non-dominated points ending in it."""
        out = []
        cls = src_cls[prev.strat]
        for g in np.unique(cls):
            idx = np.flatnonzero(cls == g)
            idx = idx[self._prune(prev, idx)]
            out.append((int(prev.strat[idx[0]]), idx))
        return out

    def _shifted(self, prev: Frontier, by_source: list, column: np.ndarray) -> Frontier:
        """Union over source classes of their points plus the relayout into this target class, pruned."""
        idx = np.concatenate([i for _, i in by_source])
        shift = np.concatenate([np.full(len(i), column[rep]) for rep, i in by_source])
        f = Frontier(prev.mem[idx], prev.level[idx], prev.T[idx] + shift, prev.D[idx], prev.strat[idx], idx)
        keep = self._prune(f, np.arange(len(f)))
        return f.take(keep)

    def _prune(self, f: Frontier, idx: np.ndarray) -> np.ndarray:
        """Positions (into idx) of the non-dominated points among f[idx]."""
        self.candidates += len(idx)
        if self.exact:
            return prune_exact(f.level[idx], f.mem[idx], f.T[idx], f.D[idx])
        return prune_fast(f.level[idx], f.mem[idx], self._cost(f.T[idx], f.D[idx]))
