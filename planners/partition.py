"""Choosing pipeline stage boundaries: a DP over contiguous segments of layers.

Each stage k offers options (a, b, g, T, D): layers a..b-1 on stage k ending in a layer of dp g,
with per-micro-batch time T and tail D. Stage k > 0 also pays ``recv[k][a, g']``, the gradient sent
back to it, which depends on the dp g' of the previous stage's last layer. The objective is the
schedule's formula in its linear form fill sum_k T_k + steady max_k T_k + max_k D_k (specs.schedules;
sum + (m-1) max + max D with one chunk per rank). For a bottleneck cap tau (and a tail cap delta)
the min-sum partition is a shortest path; enumerating the caps in increasing order with the bound
fill S_min + steady tau + delta >= best makes the search exact over the given options.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from specs import even_stage_layers
from specs.schedules import PipelineFormula


class Windows(tuple):
    """One stage's (start, stop) segments: a tuple of pairs whose hash and start/stop arrays are
    computed once. The bounds key their caches on a stage's windows and read them as arrays for
    every group, vocab choice and budget (80 layers over 16 stages: about 2,000 pairs a stage)."""

    def __hash__(self) -> int:
        cached = self.__dict__.get("hash")
        if cached is None:
            cached = self.__dict__["hash"] = tuple.__hash__(self)
        return cached

    @cached_property
    def starts(self) -> np.ndarray:
        return self._column(0)

    @cached_property
    def stops(self) -> np.ndarray:
        return self._column(1)

    def _column(self, i: int) -> np.ndarray:
        out = np.array(self, dtype=int).reshape(-1, 2)[:, i]
        out.setflags(write=False)
        return out


@lru_cache(maxsize=4096)
def stage_windows(n: int, pp: int, even: bool, max_len: int | None = None) -> tuple[Windows, ...]:
    """(start, stop) segments each stage may take: contiguous, every stage non-empty, at most
    ``max_len`` layers when given. The same object for the same arguments (do not modify)."""
    if even:
        bounds = np.concatenate(([0], np.cumsum(even_stage_layers(n, pp))))
        return tuple(Windows([(int(bounds[k]), int(bounds[k + 1]))]) for k in range(pp))
    out = []
    for k in range(pp):
        starts = [0] if k == 0 else range(k, n - (pp - k) + 1)
        stops = [n] if k == pp - 1 else None
        out.append(Windows((a, b) for a in starts for b in (stops or range(a + 1, n - (pp - 1 - k) + 1))
                           if max_len is None or b - a <= max_len))
    return tuple(out)


@dataclass
class StageOptions:
    """Flat option arrays of one stage."""

    a: np.ndarray
    b: np.ndarray
    g: np.ndarray
    """Index into the dp values of the layer ending the segment."""
    T: np.ndarray
    D: np.ndarray


@dataclass
class PartitionChoice:
    """The chosen option index of each stage, and the objective it reaches."""

    option: list[int]
    objective_s: float
    cells_explored: int


def _cells(opts: StageOptions, n: int, G: int, delta: float, length: int | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """[a, b - a - 1, g] -> min T over options with D <= delta, and the option reaching it. The
    middle axis runs over segment lengths up to ``length`` (default: the longest option's), not
    over every end: a stage's options are a band of (a, b) pairs, so the DPs below work on
    (n + 1) x length cells a stage instead of (n + 1)^2."""
    length = length or _longest(opts)
    T = np.full((n + 1, length, G), np.inf)
    ok = np.flatnonzero(opts.D <= delta)
    cell = (opts.a[ok], opts.b[ok] - opts.a[ok] - 1, opts.g[ok])
    np.minimum.at(T, cell, opts.T[ok])
    hit = ok[opts.T[ok] == T[cell]]
    hit = hit[np.argsort(-opts.D[hit], kind="stable")]  # among equal T, the smallest D is written last
    which = np.full((n + 1, length, G), -1)
    which[opts.a[hit], opts.b[hit] - opts.a[hit] - 1, opts.g[hit]] = hit
    return T, which


class _TailCapped:
    """A stage's ``_cells`` T under a tail cap that only grows (search_partition's exact loop over
    caps): options enter in order of their tail, each once, instead of all at every cap."""

    def __init__(self, opts: StageOptions, n: int, G: int) -> None:
        self.opts = opts
        self.order = np.argsort(opts.D, kind="stable")
        self.entered = 0
        self.T = np.full((n + 1, _longest(opts), G), np.inf)

    def upto(self, delta: float) -> np.ndarray:
        """[a, len, g] the least T over the options with D <= ``delta`` (at least the last cap)."""
        o = self.opts
        stop = int(np.searchsorted(o.D[self.order], delta, side="right"))
        new = self.order[self.entered:stop]
        if len(new):
            np.minimum.at(self.T, (o.a[new], o.b[new] - o.a[new] - 1, o.g[new]), o.T[new])
        self.entered = max(self.entered, stop)
        return self.T


def _longest(opts: StageOptions) -> int:
    return max(1, int((opts.b - opts.a).max())) if len(opts.a) else 1


def _first_stage(cells: np.ndarray, n: int) -> np.ndarray:
    """[b, g] of the first stage's band (its segments start at layer 0)."""
    V = np.full((n + 1, cells.shape[2]), np.inf)
    length = min(cells.shape[1], n)
    V[1:length + 1] = cells[0, :length]
    return V


@lru_cache(maxsize=256)
def _starts(n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """[b, j] the start a = b - (length - j) of the segment of length (length - j) ending at b (n + 1,
    an all-inf row, where it would be negative), and its band index length - j - 1: longest
    first, so that an argmin over j prefers the smallest start, as one over a would."""
    lengths = np.arange(length, 0, -1)
    starts = np.arange(n + 1)[:, None] - lengths[None, :]
    return np.where(starts >= 0, starts, n + 1), np.broadcast_to(lengths - 1, starts.shape)


def _by_end(Y: np.ndarray, n: int, axis: int) -> np.ndarray:
    """``Y`` [..., a, len, g] (a at ``axis``) regathered as [..., b, j, g] (see _starts)."""
    pad = list(Y.shape)
    pad[axis] = 1
    Y = np.concatenate((Y, np.full(pad, np.inf)), axis=axis)
    start, band = _starts(n, Y.shape[axis + 1])
    return Y[(slice(None),) * axis + (start, band)]


def _min_sum(cells: list[np.ndarray], recv: list[np.ndarray], tau: float, n: int, path: bool = True
             ) -> tuple[float, list[tuple[int, int, int]]] | None:
    """Min sum of stage times with every stage <= tau; with ``path`` also the (a, b, g) of each
    stage (without it, only the value: no argmins, several times faster)."""
    G = cells[0].shape[2]
    V = _first_stage(np.where(cells[0] <= tau, cells[0], np.inf), n)  # [b, g]
    back = []
    for k in range(1, len(cells)):
        stage_t = recv[k][:, :, None, None] + cells[k][:, None, :, :]  # [a, g', len, g]
        total = np.where(stage_t <= tau, V[:, :, None, None] + stage_t, np.inf)
        if not path:
            V = _by_end(total.min(axis=1), n, 0).min(axis=1)
            continue
        g_prev = total.argmin(axis=1)  # [a, len, g]: the first g' reaching the least
        Z = _by_end(np.take_along_axis(total, g_prev[:, None], axis=1)[:, 0], n, 0)  # [b, j, g]
        j = Z.argmin(axis=1)  # [b, g]: the smallest start reaching the least
        V = np.take_along_axis(Z, j[:, None], axis=1)[:, 0]
        start, band = _starts(n, cells[k].shape[1])
        rows = np.arange(n + 1)[:, None]
        a, length = np.minimum(start[rows, j], n), band[rows, j]
        back.append(a * G + g_prev[a, length, np.arange(G)[None, :]])
    value = float(V[n].min())
    if not np.isfinite(value):
        return None
    if not path:
        return value, []
    g_end = int(np.argmin(V[n]))
    steps, b, g = [], n, g_end
    for k in range(len(cells) - 1, 0, -1):
        a, g_prev = divmod(int(back[k - 1][b, g]), G)
        steps.append((a, b, g))
        b, g = a, g_prev
    steps.append((0, b, g))
    return value, steps[::-1]


def _objective(path, whichs, opts, recv, formula: PipelineFormula) -> tuple[float, list[int]]:
    Ts, Ds, chosen = [], [], []
    for k, (a, b, g) in enumerate(path):
        o = int(whichs[k][a, b - a - 1, g])
        r = recv[k][a, path[k - 1][2]] if k else 0.0
        Ts.append(opts[k].T[o] + r)
        Ds.append(opts[k].D[o])
        chosen.append(o)
    return formula.linear_s(sum(Ts), max(Ts), max(Ds)), chosen


def search_partition(opts: list[StageOptions], recv: list[np.ndarray], n: int, G: int, formula: PipelineFormula,
                     exact: bool, deltas: np.ndarray | None = None) -> PartitionChoice | None:
    """Best partition over the options; exact in both caps when ``exact``, else in tau only
    (the tail max is then evaluated, not optimised). ``deltas``: tail caps to try instead of
    every distinct tail (then exact in tau for each of them only)."""
    if len(opts) == 1:
        return _single_stage(opts[0], n, formula.micro_batches)
    if deltas is None:
        deltas = np.unique(np.concatenate([o.D for o in opts])) if exact else np.array([np.inf])
    deltas = np.sort(np.asarray(deltas, dtype=float))
    best: PartitionChoice | None = None
    best_value, best_caps = np.inf, None
    explored = 0
    # a floor valid for every delta: the min sum and the min bottleneck with no tail cap
    loose = [_cells(o, n, G, np.inf)[0] for o in opts]
    if _min_sum(loose, recv, np.inf, n) is None:
        return None
    least_tau = _least_bottleneck(loose, recv, n)
    fill, steady = formula.fill, formula.steady
    floor = fill * _min_sum(loose, recv, np.inf, n)[0] + steady * least_tau
    capped = [_TailCapped(o, n, G) for o in opts] if exact else None
    for delta in deltas:
        d_lb = delta if exact else 0.0
        if floor + d_lb >= best_value:
            break
        if capped is not None:  # the tail caps rise: each option enters the cells once
            T_cells, whichs = [c.upto(delta) for c in capped], None
        else:
            cells = [_cells(o, n, G, delta) for o in opts]
            T_cells, whichs = [c[0] for c in cells], [c[1] for c in cells]
        base = _min_sum(T_cells, recv, np.inf, n, path=False)
        if base is None:
            continue
        base_s = fill * base[0]
        if base_s + steady * least_tau + d_lb >= best_value:
            continue  # this tail cap's min sum alone cannot win
        lowest = _least_bottleneck(T_cells, recv, n)  # below it nothing is feasible (a tight cap: most caps)
        taus = _caps(T_cells, recv, lowest, lambda tau: base_s + steady * tau + d_lb < best_value)
        if not len(taus):
            continue
        if exact:  # fill S(tau, delta) + steady tau + delta: its minimum is the optimum
            best_value, best_caps, seen = _exact_caps(T_cells, recv, taus, n, formula, base_s, delta,
                                                      best_value, best_caps)
            explored += seen
            continue
        for tau in taus:
            bound = base_s + steady * tau + d_lb
            if best_value <= bound:
                break
            res = _min_sum(T_cells, recv, tau, n)
            explored += 1
            if res is None:
                continue
            value, chosen = _objective(res[1], whichs, opts, recv, formula)
            if value < best_value:
                best_value, best = value, PartitionChoice(chosen, value, 0)
    if exact and best_caps is not None:
        tau, delta = best_caps
        cells = [_cells(o, n, G, delta) for o in opts]
        res = _min_sum([c[0] for c in cells], recv, tau, n)
        value, chosen = _objective(res[1], [c[1] for c in cells], opts, recv, formula)
        best = PartitionChoice(chosen, value, 0)
    if best is not None:
        best.cells_explored = explored
    return best


def _exact_caps(T_cells, recv, taus: np.ndarray, n: int, formula: PipelineFormula, base_s: float, delta: float,
                best_value: float, best_caps) -> tuple[float, tuple | None, int]:
    """The bottleneck caps of one tail cap in increasing order, S(tau) for a block of them per
    numpy call (blocks growing from 4), until fill S_min + steady tau + delta (``base_s``: fill
    S_min) cannot win: (best value, its caps, caps evaluated). The same caps and values as one
    _min_sum call per cap."""
    seen, start, block = 0, 0, 4
    steady = formula.steady
    limit = _batch_limit(T_cells, n)
    while start < len(taus):
        chunk = taus[start:start + block]
        sums = formula.fill * _capped_sums(T_cells, T_cells, recv, chunk, n)
        for tau, total in zip(chunk, sums):
            if best_value <= base_s + steady * tau + delta:
                return best_value, best_caps, seen
            seen += 1
            if np.isfinite(total) and total + steady * tau + delta < best_value:
                best_value, best_caps = float(total + steady * tau + delta), (tau, delta)
        start, block = start + len(chunk), min(2 * block, limit)
    return best_value, best_caps, seen


def partition_floor(sum_opts: list[StageOptions], max_opts: list[StageOptions], recv: list[np.ndarray],
                    n: int, G: int, formula: PipelineFormula) -> float:
    """A lower bound on fill sum_k S_k + steady max_k T_k over partitions, where each segment's S
    is at least its ``sum_opts`` T and its T at least its ``max_opts`` T (same segments): the least
    over bottleneck caps tau of fill [least sum of S over partitions whose every stage can be
    <= tau] + steady tau (inf when nothing is feasible). A partition whose bottleneck is tau* is
    counted at tau = tau*, so the minimum is a bound."""
    lengths = [max(_longest(a), _longest(b)) for a, b in zip(sum_opts, max_opts)]
    sum_cells = [_cells(o, n, G, np.inf, L)[0] for o, L in zip(sum_opts, lengths)]
    max_cells = [_cells(o, n, G, np.inf, L)[0] for o, L in zip(max_opts, lengths)]
    base = _min_sum(sum_cells, recv, np.inf, n, path=False)
    if base is None or _min_sum(max_cells, recv, np.inf, n, path=False) is None:
        return np.inf
    fill, steady = formula.fill, formula.steady
    least = _least_bottleneck(max_cells, recv, n)  # the first cap: it bounds which others can win
    best = float(fill * _capped_sums(sum_cells, max_cells, recv, np.array([least]), n)[0] + steady * least)
    base_s = fill * base[0]
    taus = _caps(max_cells, recv, least, lambda tau: (tau > least) & (base_s + steady * tau < best))
    limit = _batch_limit(max_cells, n)
    lo, batch = 0, min(8, limit)  # blocks growing from 8: the first caps usually settle it
    while lo < len(taus):
        chunk = taus[lo:lo + batch]
        if base_s + steady * chunk[0] >= best:
            break
        best = min(best, float(np.min(fill * _capped_sums(sum_cells, max_cells, recv, chunk, n) + steady * chunk)))
        lo, batch = lo + len(chunk), min(2 * batch, limit)
    return best


FLOOR_BATCH_CELLS = 2e6
"""partition_floor evaluates this many (cap, cell) pairs per numpy call."""


def _batch_limit(cells: list[np.ndarray], n: int) -> int:
    """Caps per numpy call: FLOOR_BATCH_CELLS over one cap's [a, g', len, g] cells."""
    G = cells[0].shape[2]
    return max(1, int(FLOOR_BATCH_CELLS // ((n + 1) * G * G * max(c.shape[1] for c in cells))))


def _capped_sums(sum_cells, max_cells, recv, taus: np.ndarray, n: int) -> np.ndarray:
    """[tau] least sum of sum_cells over partitions whose every stage's max_cells time <= tau."""
    cap = taus[:, None, None]
    V = np.where(_first_stage(max_cells[0], n)[None] <= cap, _first_stage(sum_cells[0], n)[None], np.inf)  # [tau, b, g]
    for k in range(1, len(sum_cells)):
        stage_sum = recv[k][:, :, None, None] + sum_cells[k][:, None, :, :]  # [a, g', len, g]
        stage_max = recv[k][:, :, None, None] + max_cells[k][:, None, :, :]
        total = np.where(stage_max[None] <= taus[:, None, None, None, None], V[:, :, :, None, None] + stage_sum[None],
                         np.inf)
        V = _by_end(total.min(axis=2), n, 1).min(axis=2)
    return V[:, n].min(axis=1)


def _single_stage(o: StageOptions, n: int, m: int) -> PartitionChoice | None:
    ok = np.flatnonzero((o.a == 0) & (o.b == n))
    if not len(ok):
        return None
    value = m * o.T[ok] + o.D[ok]
    i = int(ok[np.argmin(value)])
    return PartitionChoice([i], float(m * o.T[i] + o.D[i]), len(ok))


def _caps(cells: list[np.ndarray], recv: list[np.ndarray], lowest: float, keep) -> np.ndarray:
    """The bottleneck caps worth trying, sorted: the distinct stage times (summed as the passes
    sum them) from ``lowest`` (the least bottleneck: below it nothing is feasible) on, those for
    which ``keep`` (vectorised over caps) holds. The callers drop the caps whose bound cannot win:
    sorting only the rest is what this saves."""
    vals = [cells[0][0].ravel()]
    for k in range(1, len(cells)):
        vals.append((recv[k][:, :, None, None] + cells[k][:, None, :, :]).ravel())
    v = np.concatenate(vals)
    v = v[np.isfinite(v) & (v >= lowest)]
    return np.unique(v[keep(v)])


def _least_bottleneck(cells, recv, n: int) -> float:
    """The least over partitions of the largest stage time (one min-max pass over the stages):
    one of the stage times, summed as _caps sums them (inf when no partition exists)."""
    V = _first_stage(cells[0], n)  # [b, g] least bottleneck of the stages so far
    for k in range(1, len(cells)):
        stage_t = recv[k][:, :, None, None] + cells[k][:, None, :, :]  # [a, g', len, g]
        V = _by_end(np.maximum(V[:, :, None, None], stage_t).min(axis=1), n, 0).min(axis=1)
    return float(V[n].min())
