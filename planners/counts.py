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
from functools import lru_cache

import numpy as np

from planners.pareto import _hull_prices, prune_fast
from planners.partition import Windows
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
        i, j = np.nonzero(row.worth_adding(self.level))
        level = np.maximum(self.level[i], row.level[j])
        memory = self.memory_bytes[i] + row.memory_bytes[j]
        cost = self.cost_s[i] + row.cost_s[j]
        fits = np.flatnonzero(memory <= cap_bytes)
        keep = fits[prune_fast(level[fits], memory[fits], cost[fits])]
        return CountFrontier(level[keep], memory[keep], cost[keep])

    def worth_adding(self, level: np.ndarray) -> np.ndarray:
        """[point of level ``level``, this row's point] whether adding the row's point can give a
        sum that no other sum with the same point beats or repeats: a row point above the level
        keeps its own level; those at or below it all take that level, where a row point that
        another of them beats in (memory, cost) (or equals, and comes after) adds nothing."""
        return level[:, None] < self._worth_below()[None, :]

    def _worth_below(self) -> np.ndarray:
        """[point] the levels below which the point is worth adding (``worth_adding``): its own
        level, or the least level of a point that beats it if higher (equal points: the earlier
        beats the later, as a staircase keeps the first)."""
        m, c, order = self.memory_bytes, self.cost_s, np.arange(len(self.cost_s))
        beats = ((m[:, None] <= m) & (c[:, None] <= c)
                 & ((m[:, None] < m) | (c[:, None] < c) | (order[:, None] < order)))  # [k, j]: k beats j
        beaten_from = np.min(np.where(beats, self.level[:, None], np.iinfo(np.int64).max), axis=0,
                             initial=np.iinfo(np.int64).max)
        return np.maximum(self.level, beaten_from)

    def least_fitting(self, row: "CountFrontier", levels: np.ndarray, cap_bytes: float,
                      temp_floor_bytes: float) -> float:
        """The least cost of a point plus one of ``row``'s whose memory plus max(its largest
        temporary, ``temp_floor_bytes``) fits in ``cap_bytes`` (inf: none): every sum at once,
        none pruned (a dominated sum fits only where its dominator does, at no less cost)."""
        memory = self.memory_bytes[:, None] + row.memory_bytes[None]
        held = memory + np.maximum(levels[np.maximum(self.level[:, None], row.level[None])], temp_floor_bytes)
        return float((self.cost_s[:, None] + row.cost_s[None])[held <= cap_bytes].min(initial=np.inf))


def row_frontier(cost: np.ndarray, memory: np.ndarray, temp: np.ndarray, levels: np.ndarray) -> CountFrontier:
    """One layer's strategies (inf where not allowed), those dominated in (temporary, memory,
    cost) dropped: swapping one for its dominator never hurts a sum."""
    ok = np.flatnonzero(np.isfinite(cost) & np.isfinite(memory) & np.isfinite(temp))
    level = np.searchsorted(levels, temp[ok])
    keep = prune_fast(level, memory[ok], cost[ok])
    return CountFrontier(level[keep], memory[ok][keep], cost[ok][keep])


@dataclass(frozen=True)
class SegmentClasses:
    """The segments of one stage grouped by what they hold: segments whose layers but the first
    and the last share one row, with the same first row, count and last row, hold the same
    multiset of rows, so every relaxation that drops relayouts gives them one value."""

    a: np.ndarray
    """[class] a representative segment's start."""
    b: np.ndarray
    """[class] its stop."""
    of_window: np.ndarray
    """[window] the class of each segment of the windows."""
    body: list[tuple[int, int, int] | None]
    """[class] (first layer's row or -1, the middle layers' row or -1, how many have it), None
    where the middle layers differ (then the class is its one segment)."""
    inner_rows: dict[int, tuple]
    """Row id -> (cost, memory, temp) of such a layer inside a segment, as bytes."""
    last_rows: dict[int, tuple]
    """Row id -> the same of such a layer ending a segment (its cost with the send to the next stage)."""
    row_id: np.ndarray
    """[layer] its row id."""


def segment_classes(rows: tuple, row_id: np.ndarray, windows: Windows) -> SegmentClasses:
    """``rows``: (cost, last_cost, memory, temp) [row, strategy] of each distinct row, as
    memory_floor._layer_arrays gives them (``last_cost``: the layer as a segment's last, with
    its send to the next stage); ``row_id``: [layer] its row."""
    cost, last_cost, memory, temp = rows
    inner_rows = {r: (cost[r].tobytes(), memory[r].tobytes(), temp[r].tobytes()) for r in range(len(cost))}
    last_rows = {r: (last_cost[r].tobytes(), memory[r].tobytes(), temp[r].tobytes()) for r in range(len(cost))}
    a, b, of_window, bodies = _classes(row_id.dtype.str, row_id.tobytes(), windows)
    return SegmentClasses(a, b, of_window, bodies, inner_rows, last_rows, row_id)


@lru_cache(maxsize=1024)
def _classes(dtype: str, row_bytes: bytes, windows: Windows) -> tuple:
    """segment_classes' grouping, which depends on the layers' row ids and the windows only (the
    same for every vocab choice and weight of a stage): (a, b, [window] class, bodies). Shared:
    read only."""
    row_id = np.frombuffer(row_bytes, dtype=dtype)
    a, b = windows.starts, windows.stops
    run_start = _run_starts(row_id)
    inside = b - 2 > a  # the segment has middle layers a+1..b-2
    uniform = ~inside | (run_start[np.maximum(b - 2, 0)] <= a + 1)
    head, plain, count = _bodies(row_id, a, b)
    keys = np.stack((np.where(uniform, head, -2), np.where(uniform, plain, a), np.where(uniform, count, b),
                     np.where(uniform, row_id[b - 1], -2)), axis=1)  # not uniform: its own class
    _, rep, of_window = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    bodies = [tuple(int(x) for x in keys[r, :3]) if uniform[r] else None for r in rep]
    return a[rep], b[rep], of_window.ravel(), bodies


def count_bounds(t: ComboTables, classes: SegmentClasses, levels: np.ndarray, vocab_memory_bytes: float,
                 vocab_temp_bytes: float, max_layers: int = MAX_COUNT_LAYERS, among: np.ndarray | None = None,
                 cutoff_s: float = np.inf) -> np.ndarray:
    """[class] the least T + lam D of a class's layers on its stage whose memory fits,
    relayouts left out, for the classes of identical middle layers and at most ``max_layers``
    layers (among ``among`` [class] when given; inf elsewhere: no bound given, or no plan fits).
    Frontiers are kept per (rows, count) in ``t.shared``, so every class, stage, vocab choice and
    budget of the group with the same rows shares them. With a finite ``cutoff_s`` (what a class's
    bound need not exceed: one below rules nothing out) each class's chain of copies drops the
    sums that cannot complete below it (ChainCut) and its bound is min(its least, the cut's)."""
    cap = t.budget_bytes - vocab_memory_bytes
    memo: dict = t.shared.setdefault(("count frontiers", t.budget_bytes, levels.tobytes()), {})
    # keyed by the levels too: a frontier's points index them, and tables sharing ``shared``
    # (GroupDP.any_vocab_floor's merged vocab choice) may have other levels
    out = np.full(len(classes.a), np.inf)
    for c, body in enumerate(classes.body):
        if body is None or classes.b[c] - classes.a[c] > max_layers or (among is not None and not among[c]):
            continue
        last = _row_of(memo, classes.last_rows[int(classes.row_id[classes.b[c] - 1])], levels)
        if np.isfinite(cutoff_s) and body[1] >= 0:
            head = _row_of(memo, classes.inner_rows[body[0]], levels) if body[0] >= 0 else None
            inner, held = _cut_chain(memo, classes.inner_rows[body[1]], body[2], head, last, levels, t.budget_bytes,
                                     cap - vocab_temp_bytes, cutoff_s)
            out[c] = min(inner.least_fitting(last, levels, cap, vocab_temp_bytes), held)
            continue
        inner = _frontier(memo, classes.inner_rows, *body, levels, t.budget_bytes)
        out[c] = inner.least_fitting(last, levels, cap, vocab_temp_bytes)
    return out


def _run_starts(row_id: np.ndarray) -> np.ndarray:
    """[j] the first layer of the run of equal rows that ends at layer j."""
    new = np.concatenate(([True], row_id[1:] != row_id[:-1]))
    return np.maximum.accumulate(np.where(new, np.arange(len(row_id)), 0))


def _bodies(row_id: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Layers a..b-2 of each segment (those after the first sharing one row) as (first layer's
    row or -1, the common row or -1, how many layers have it)."""
    empty = b - 1 == a
    lead, tail = row_id[a], row_id[np.maximum(b - 2, a)]
    joined = ~empty & (lead == tail)  # the first layer is one of them
    head = np.where(empty | joined, -1, lead)
    plain = np.where(empty, -1, np.where(joined | (b - 2 > a), tail, -1))
    count = np.where(empty, 0, np.where(joined, b - 1 - a, b - 2 - a))
    return head, plain, count


def _frontier(memo: dict, rows: dict[int, tuple], head: int, plain: int, count: int, levels: np.ndarray,
              cap: float) -> CountFrontier:
    """The frontier of the head row plus ``count`` copies of the plain row, memoised by the
    rows' contents (with the cap it was pruned under). The copies are summed first and the head
    added last, so segments with other first rows (another vocab choice's first layer) share
    the copies' chain."""
    key = (None if head < 0 else rows[head], None if plain < 0 else rows[plain], count, cap)
    if key not in memo:
        if head >= 0:
            copies = _frontier(memo, rows, -1, plain, count, levels, cap)
            memo[key] = copies.plus(_row_of(memo, rows[head], levels), cap)
        elif count == 0:
            memo[key] = CountFrontier.empty()
        else:
            before = _frontier(memo, rows, -1, plain, count - 1, levels, cap)
            memo[key] = before.plus(_row_of(memo, rows[plain], levels), cap)
    return memo[key]


def _row_of(memo: dict, row: tuple, levels: np.ndarray) -> CountFrontier:
    """row_frontier of ``row`` (cost, memory, temp as bytes), memoised by its contents: every
    class, stage and vocab choice ending on or repeating one layer row shares it."""
    key = ("row", row)
    if key not in memo:
        memo[key] = row_frontier(*(np.frombuffer(x) for x in row), levels)
    return memo[key]


@dataclass(frozen=True)
class ChainCut:
    """What a chain of ``count`` copies of one row may drop: a sum of c copies whose least
    completion reaches ``cutoff_s``. Its completion (the count - c copies still to add, the head
    and the last row) costs, for every price mu >= 0 s/byte, at least
    (count - c) phi_row(mu) + ends_s(mu) - mu (room - its memory), phi(mu) = min (cost + mu memory)
    over a row's points (weak duality: the LP bound of the completion in ``room_bytes``); the
    sum's cost plus the largest of these over ``prices`` is its floor. Every sum dropped has a
    floor >= cutoff_s, so a bound taken over the kept sums is min(their least, cutoff_s)."""

    prices: np.ndarray
    """mu values tried: 0 and the row's hull prices (where the cheapest point changes)."""
    row_s: np.ndarray
    """[price] phi of the copied row."""
    ends_s: np.ndarray
    """[price] phi of the head (if any) plus phi of the last row."""
    room_bytes: float
    """Memory the whole segment may hold (the cap less the least temporary)."""
    cutoff_s: float

    def covers(self, other: "ChainCut") -> bool:
        """Whether a chain cut by this drops only sums ``other`` drops too: its floors are no
        larger (ends no dearer, room no smaller) and its cutoff no smaller, on the same prices."""
        return (self.cutoff_s >= other.cutoff_s and self.room_bytes >= other.room_bytes
                and np.array_equal(self.prices, other.prices) and bool(np.all(self.ends_s <= other.ends_s)))

    def keep(self, sums: CountFrontier, left: int) -> CountFrontier:
        """The sums of ``sums`` (``left`` copies still to add) whose floor is below the cutoff."""
        rest = left * self.row_s + self.ends_s - self.prices * self.room_bytes
        floor = sums.cost_s + np.max(rest[None, :] + self.prices[None, :] * sums.memory_bytes[:, None], axis=1)
        kept = np.flatnonzero(floor < self.cutoff_s)
        return CountFrontier(sums.level[kept], sums.memory_bytes[kept], sums.cost_s[kept])


def _least_priced(row: CountFrontier, prices: np.ndarray) -> np.ndarray:
    """[price] phi of ``row``: min over its points of cost + mu memory."""
    return np.min(row.cost_s[None, :] + prices[:, None] * row.memory_bytes[None, :], axis=1)


def _cut_chain(memo: dict, plain: tuple, count: int, head: CountFrontier | None, last: CountFrontier,
               levels: np.ndarray, cap: float, room_bytes: float, cutoff_s: float) -> tuple[CountFrontier, float]:
    """The frontier of ``count`` copies of the row ``plain`` (bytes, as _frontier's rows), each
    step cut by a ChainCut (which keeps every sum that may complete below ``cutoff_s`` in
    ``room_bytes`` with ``head`` and ``last``), then ``head`` (if any) added; and the cutoff of the
    cut it was built under. The copies are kept in ``memo`` (one chain per row and count) for
    every later query their cut covers: within a search the incumbent only falls, and
    GroupDP.any_vocab_floor's merged choice, asked first, has the cheapest ends and the most room
    of the group's vocab choices, so its chain serves each of them (each adds its own head)."""
    row = _row_of(memo, plain, levels)
    prices = np.unique(np.concatenate(([0.0], _hull_prices(row.memory_bytes, row.cost_s))))
    ends = _least_priced(last, prices) + (_least_priced(head, prices) if head is not None else 0.0)
    cut = ChainCut(prices, _least_priced(row, prices), ends, room_bytes, cutoff_s)
    key = ("cut chain", plain, count, cap)
    held = memo.get(key)
    if held is None or not held[0].covers(cut):
        sums = CountFrontier.empty()
        for c in range(1, count + 1):
            sums = cut.keep(sums.plus(row, cap), count - c)
        held = memo[key] = (cut, sums, {})
    held_cut, copies, headed = held
    if head is None:
        return copies, held_cut.cutoff_s
    head_key = (head.level.tobytes(), head.memory_bytes.tobytes(), head.cost_s.tobytes())
    if head_key not in headed:
        headed[head_key] = copies.plus(head, cap)
    return headed[head_key], held_cut.cutoff_s
