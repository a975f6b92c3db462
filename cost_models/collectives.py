"""Alpha-beta formulas of collectives (ring, tree, hierarchical) and the NCCL bus-bandwidth factors.

Pure functions of (ranks p, bytes n, per-step latency alpha, link bandwidth B); the cost models
choose alpha and B from the cluster topology. Formulas: docs/cost_models.md (formulas).
"""
from __future__ import annotations

import math
from typing import Sequence

from specs import RankGroups, SpecError

BUS_FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
              "reduce_scatter": lambda p: (p - 1) / p, "all_to_all": lambda p: (p - 1) / p,
              "broadcast": lambda p: 1.0}
"""NCCL busbw = algbw * factor(p): the bytes each rank's link carries per byte of buffer."""

RING_STEPS = {"all_reduce": lambda p: 2 * (p - 1), "all_gather": lambda p: p - 1,
              "reduce_scatter": lambda p: p - 1, "all_to_all": lambda p: p - 1,
              "broadcast": lambda p: p - 1}
"""Latency-bound steps of the ring (pairwise for all-to-all) algorithm."""


def rank_groups(groups: Sequence[Sequence[int]]) -> RankGroups:
    """``groups`` as RankGroups (itself when it already is one)."""
    return groups if type(groups) is RankGroups else RankGroups(map(tuple, groups))


def largest_group(groups: Sequence[Sequence[int]]) -> int:
    """Ranks in the largest of ``groups`` (1 when there is none); kept with a RankGroups."""
    return groups.largest() if type(groups) is RankGroups else max(map(len, groups), default=1)


def check_kind(kind: str) -> None:
    if kind not in BUS_FACTOR:
        raise SpecError("collective", f"unknown kind {kind!r}; choose from {', '.join(BUS_FACTOR)}")


def ring_time_s(kind: str, p: int, nbytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring (pairwise for all-to-all) collective: steps * alpha + factor * n / B."""
    return sum(ring_terms_s(kind, p, nbytes, alpha_s, bandwidth_bytes_per_s))


def ring_terms_s(kind: str, p: int, nbytes: float, alpha_s: float, bandwidth_bytes_per_s: float
                 ) -> tuple[float, float]:
    """The ring's two alpha-beta terms: (latency steps * alpha, transfer factor * n / B)."""
    check_kind(kind)
    if p <= 1 or nbytes <= 0:
        return 0.0, 0.0
    return RING_STEPS[kind](p) * alpha_s, BUS_FACTOR[kind](p) * nbytes / bandwidth_bytes_per_s


def concurrent_time_s(terms: Sequence[tuple[float, float]]) -> float:
    """Collectives started together on streams of their own over the same links, each given by
    its alpha-beta terms (latency_s, transfer_s) as if alone: its latency, then its bytes.

    A collective's latency leaves the link to the others, so the latencies overlap; the bytes
    share the link, which carries all of them from the first transfer on. They end at
    max(max_i (alpha_i + beta_i), min_i alpha_i + sum_i beta_i): none sooner than alone, nor
    sooner than the earliest latency plus every transfer (the simulator's fluid links play
    exactly this when each collective is one flow). Two of (10 ms, 5 ms) and (2 ms, 4 ms):
    max(15, 6, 2 + 9) = 15 ms, not 21 ms one after the other. An empty collective (0, 0) is none."""
    terms = [t for t in terms if t[0] + t[1] > 0]
    if not terms:
        return 0.0
    alone = max(alpha + beta for alpha, beta in terms)
    return max(alone, min(alpha for alpha, _ in terms) + sum(beta for _, beta in terms))


def tree_allreduce_time_s(p: int, nbytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Double binary tree / recursive halving-doubling: 2 log2(p) alpha + 2(p-1)/p n / B."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha_s + 2 * (p - 1) / p * nbytes / bandwidth_bytes_per_s


def hierarchical_allreduce_time_s(gpus_per_node: int, nodes: int, nbytes: float, alpha_intra_s: float,
                                  alpha_inter_s: float, intra_bytes_per_s: float,
                                  inter_bytes_per_s: float) -> float:
    """Reduce-scatter inside each node, all-reduce of n/g across nodes, all-gather inside:
    2(g-1)/g n/B_intra + 2(N-1)/N (n/g)/B_inter (+ the latencies of the three rings)."""
    g, big_n = gpus_per_node, nodes
    intra = 2 * ring_time_s("reduce_scatter", g, nbytes, alpha_intra_s, intra_bytes_per_s)
    inter = ring_time_s("all_reduce", big_n, nbytes / g, alpha_inter_s, inter_bytes_per_s)
    return intra + inter


def p2p_time_s(nbytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """One send: alpha + n / B."""
    if nbytes <= 0:
        return 0.0
    return alpha_s + nbytes / bandwidth_bytes_per_s
