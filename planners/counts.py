"""Identical layers as counts: with relayouts left out, what a segment's layers add (time, tail,
memory, largest temporary) depends only on how many of them take each strategy, so the Pareto
frontier of c copies of one layer serves every segment with c such layers, whatever its start.

``count_bounds`` gives each short segment of a stage the exact integer optimum of that relaxation
(relayouts, >= 0, dropped; memory and the largest temporary exact): a lower bound on the
segment's T + lam D over plans whose stage fits, at least the LP bound of memory_floor (which
may mix strategies fractionally: with 5 layers a stage that is worth a few tenths of a percent).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planners.pareto import prune_fast
from planners.tables import ComboTables

MAX_COUNT_LAYERS = 12
"""Segments up to this many layers get the count bound; longer ones keep the LP bound, whose
integrality gap shrinks as 1 / length (and whose cost does not grow with the count)."""


@dataclass(frozen=True)
class CountFrontier:
    """Non-dominated (largest temporary, memory, cost) sums of some layers' strategies."""

    level: np.ndarray
    """Index into the group's sorted temporary sizes of the largest temporary of the sum."""
    memory_bytes: np.ndarray
    cost_s: np.ndarray
    """T + lam D of the layers (relayouts left out)."""

    @staticmethod
    def empty() -> "CountFrontier":
        return CountFrontier(np.zeros(1, dtype=int), np.zeros(1), np.zeros(1))

    def plus(self, row: "CountFrontier", cap_bytes: float) -> "CountFrontier":
        """Every point plus one more layer taking any of ``row``'s strategies, pruned, the sums
        above ``cap_bytes`` dropped."""
        level = np.maximum(self.level[:, None], row.level[None]).ravel()
        memory = (self.memory_bytes[:, None] + row.memory_bytes[None]).ravel()
        cost = (self.cost_s[:, None] + row.cost_s[None]).ravel()
        fits = np.flatnonzero(memory <= cap_bytes)
        keep = fits[prune_fast(level[fits], memory[fits], cost[fits])]
        return CountFrontier(level[keep], memory[keep], cost[keep])

    def least_fitting(self, levels: np.ndarray, cap_bytes: float, temp_floor_bytes: float) -> float:
        """The least cost of a point whose memory plus max(its largest temporary,
        ``temp_floor_bytes``) fits in ``cap_bytes`` (inf: none)."""
        held = self.memory_bytes + np.maximum(levels[self.level], temp_floor_bytes)
        return float(self.cost_s[held <= cap_bytes].min(initial=np.inf))


def row_frontier(cost: np.ndarray, memory: np.ndarray, temp: np.ndarray, levels: np.ndarray) -> CountFrontier:
    """One layer's strategies (inf where not allowed), those dominated in (temporary, memory,
    cost) dropped: swapping one for its dominator never hurts a sum."""
    ok = np.flatnonzero(np.isfinite(cost) & np.isfinite(memory) & np.isfinite(temp))
    level = np.searchsorted(levels, temp[ok])
    keep = prune_fast(level, memory[ok], cost[ok])
    return CountFrontier(level[keep], memory[ok][keep], cost[ok][keep])


def count_bounds(t: ComboTables, k: int, rows: tuple, windows: list[tuple[int, int]], levels: np.ndarray,
                 vocab_memory_bytes: float, vocab_temp_bytes: float, max_layers: int = MAX_COUNT_LAYERS
                 ) -> np.ndarray:
    """[a, b] the least T + lam D of layers a..b-1 on stage k whose memory fits, relayouts left
    out, for each segment of ``windows`` with at most ``max_layers`` layers whose layers but its
    first and last share one row (inf elsewhere: no bound given, or no plan fits). ``rows``:
    (cost, last_cost, memory, temp) [layer, strategy] as memory_floor._layer_arrays gives them
    (``last_cost``: the layer as the segment's last, with its send to the next stage). Frontiers
    are kept per (rows, count) in ``t.shared``, so every segment, stage, vocab choice and budget
    of the group with the same rows shares them."""
    cost, last_cost, memory, temp = rows
    n = len(t.layer_type)
    cap = t.budget_bytes - vocab_memory_bytes
    inner_rows, inner_id = _row_ids(cost, memory, temp)
    last_rows, last_id = _row_ids(last_cost, memory, temp)
    run_start = _run_starts(inner_id)
    memo: dict = t.shared.setdefault(("count frontiers", t.budget_bytes), {})
    values: dict = {}
    out = np.full((n + 1, n + 1), np.inf)
    for a, b in windows:
        if b - a > max_layers or (b - 2 > a and run_start[b - 2] > a + 1):
            continue  # long, or layers a+1..b-2 not all one row
        head, plain, count = _body(inner_id, a, b)
        key = (head, plain, count, last_id[b - 1])
        if key not in values:
            inner = _frontier(memo, inner_rows, head, plain, count, levels, t.budget_bytes)
            last = row_frontier(*(np.frombuffer(x) for x in last_rows[last_id[b - 1]]), levels)
            values[key] = inner.plus(last, cap).least_fitting(levels, cap, vocab_temp_bytes)
        out[a, b] = values[key]
    return out


def _row_ids(cost: np.ndarray, memory: np.ndarray, temp: np.ndarray) -> tuple[list[tuple], np.ndarray]:
    """The distinct (cost, memory, temp) rows as bytes, and each layer's row index."""
    _, first, inverse = np.unique(np.concatenate((cost, memory, temp), axis=1), axis=0, return_index=True,
                                  return_inverse=True)
    return [(cost[j].tobytes(), memory[j].tobytes(), temp[j].tobytes()) for j in first], inverse.ravel()


def _run_starts(row_id: np.ndarray) -> np.ndarray:
    """[j] the first layer of the run of equal rows that ends at layer j."""
    new = np.concatenate(([True], row_id[1:] != row_id[:-1]))
    return np.maximum.accumulate(np.where(new, np.arange(len(row_id)), 0))


def _body(row_id: np.ndarray, a: int, b: int) -> tuple[int, int, int]:
    """Layers a..b-2 (their layers after the first share one row) as (first layer's row or -1,
    the common row or -1, how many layers have it)."""
    if b - 1 == a:
        return -1, -1, 0
    if row_id[a] == row_id[b - 2]:  # the first layer is one of them
        return -1, int(row_id[a]), b - 1 - a
    return int(row_id[a]), (int(row_id[b - 2]) if b - 2 > a else -1), b - 2 - a


def _frontier(memo: dict, rows: list[tuple], head: int, plain: int, count: int, levels: np.ndarray,
              cap: float) -> CountFrontier:
    """The frontier of the head row plus ``count`` copies of the plain row, memoised by the
    rows' contents (with the cap it was pruned under)."""
    key = (None if head < 0 else rows[head], None if plain < 0 else rows[plain], count, cap)
    if key not in memo:
        if count == 0:
            memo[key] = CountFrontier.empty() if head < 0 else _row_of(rows[head], levels)
        else:
            before = _frontier(memo, rows, head, plain, count - 1, levels, cap)
            memo[key] = before.plus(_row_of(rows[plain], levels), cap)
    return memo[key]


def _row_of(row: tuple, levels: np.ndarray) -> CountFrontier:
    return row_frontier(*(np.frombuffer(x) for x in row), levels)
