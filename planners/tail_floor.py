"""A lower bound on one group's objective with the largest tail enumerated, memory ignored.

The memory-blind bound (GroupDP.relaxed_objective) counts max_k D_k as the mean tail; where the
stages' tails differ (T5: encoder and decoder stages) that is several percent low. Here, for a
cap delta on every stage's tail, each segment's time is bounded by its memory-blind optima under
weights lam >= 0: a stage with D_k <= delta has T_k >= min (T + lam D) - lam delta (the minimum
over its plans, so also at this plan). For a plan whose largest tail lies in [lo, hi],
  fill sum_k T_k + steady max_k T_k + max_k D_k >= F(hi) + lo (the schedule's linear form),
F(hi) the least over partitions and bottleneck caps of those stage bounds at delta = hi
(partition.partition_floor). Intervals of delta covering [0, inf) give a bound (the least over
them); those below the incumbent are halved, the lowest first, while evaluations last.

Every split keeps an interval that starts at an evaluated cap c, whose bound F(hi) + c is at
most F(c) + c (F falls as the cap grows), so no refinement lifts the bound above the least
F(c) + c seen: once that is at or below a bound the caller already holds, the search stops.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from planners.partition import StageOptions, partition_floor
from specs.schedules import PipelineFormula

TAIL_WEIGHTS = (0.0, 0.25, 1.0, 4.0, 64.0)
"""lam values whose memory-blind segment optima bound a stage's time under a tail cap (with 1/pp,
which the memory-blind bound has computed already; the large ones rule out caps below a segment's
least tail)."""
START_INTERVALS = 16
"""First split of the tail caps: quantiles of the options' tails."""
MAX_EVALUATIONS = 40
"""Partition bounds (one per cap) computed at most; each is one partition_floor call."""
CLOSE_ENOUGH = 1e-3
"""Refining stops once the bound is within this fraction below the incumbent (the issue's
target gap is 0.5%)."""


def tail_floor(options: Callable[[float], list[StageOptions]], recv: list, n: int, formula: PipelineFormula, pp: int,
               incumbent_s: float = np.inf, known_s: float = -np.inf) -> float:
    """The bound above: ``options(lam)``: each stage's memory-blind segment options under weight
    lam (GroupDP.relaxed_options; the same segments and dp indices for every lam), ``recv`` as
    partition_floor takes it. Stops refining once every interval reaches ``incumbent_s``, and
    returns ``known_s`` (a bound the caller holds) once no refinement can exceed it."""
    weights = sorted(set(TAIL_WEIGHTS) | {1.0 / pp})
    by_weight = [options(lam) for lam in weights]
    if not _aligned(by_weight):
        return max(0.0, known_s)
    recv = [None] + [r.min(axis=1, keepdims=True) for r in recv[1:]]  # the sender's dp left free
    tails = np.concatenate([o.D for stage in by_weight for o in stage])
    caps = np.unique(np.concatenate(([0.0], np.quantile(tails, np.linspace(0, 1, START_INTERVALS)))))
    F: dict[float, float] = {}

    def evaluate(cap: float) -> bool:
        """F(cap) computed; whether the bound can still exceed ``known_s``."""
        F[cap] = _capped(by_weight, weights if np.isfinite(cap) else [0.0], cap, recv, n, formula)  # inf: lam 0
        return F[cap] + cap > known_s

    if not all(evaluate(c) for c in [*caps[1:], np.inf]):
        return known_s
    heap = [(F[hi] + lo, lo, hi) for lo, hi in zip(caps, list(caps[1:]) + [np.inf])]
    heapq.heapify(heap)
    for _ in range(MAX_EVALUATIONS - len(F)):
        if heap[0][0] >= incumbent_s * (1 - CLOSE_ENOUGH):
            break
        _, lo, hi = heapq.heappop(heap)
        split = (2.0 * lo if lo > 0 else 1.0) if not np.isfinite(hi) else 0.5 * (lo + hi)  # open: twice its start
        if not evaluate(split):
            return known_s
        heapq.heappush(heap, (F[split] + lo, lo, split))
        heapq.heappush(heap, (F[hi] + split, split, hi))
    return float(max(heap[0][0], known_s))


def _aligned(by_weight: list[list[StageOptions]]) -> bool:
    """Whether every weight's options list the same (segment, dp) per stage, in the same order."""
    first = by_weight[0]
    return all(np.array_equal(o.a, f.a) and np.array_equal(o.b, f.b) and np.array_equal(o.g, f.g)
               for stage in by_weight[1:] for o, f in zip(stage, first))


def _capped(by_weight: list[list[StageOptions]], weights: list[float], cap_s: float, recv: list, n: int,
            formula: PipelineFormula) -> float:
    """F(cap): the least over partitions and bottleneck caps of fill sum_k T_k + steady max_k T_k with
    every stage's T_k at least max over lam of (its option under lam) - lam cap, the least over
    the dp of the segment's last layer (``recv`` at its least over the sender's dp)."""
    stages = []
    for k, base in enumerate(by_weight[0]):
        lows = [by_weight[i][k].T + lam * by_weight[i][k].D - (lam * cap_s if lam else 0.0)
                for i, lam in enumerate(weights)]
        least = np.full((n + 1, n + 1), np.inf)
        np.minimum.at(least, (base.a, base.b), np.max(lows, axis=0))
        a, b = np.nonzero(np.isfinite(least))
        stages.append(StageOptions(a, b, np.zeros(len(a), dtype=int), least[a, b], np.zeros(len(a))))
    return partition_floor(stages, stages, recv, n, 1, formula)
