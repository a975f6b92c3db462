"""DeepEP's dispatch and combine (Plan.ep_dispatcher ``deepep``): a token goes once per destination
scale-up domain over the network (RDMA to the GPU of the same local index there), then once per
destination GPU inside the domain over NVLink; combine is the reverse. The two legs run at once
(DeepEP forwards chunk by chunk as they arrive), so the slower bounds it.

Where a token's k routed experts lie comes from the model's routing (MoESpec.routing, expert_groups,
groups_per_token) and the ep group's placement (ep rank j holds experts [j E/ep, (j+1) E/ep)):
``hit_probability`` is the chance that a token sends at least one copy to a range of experts, and
the expected destinations (domains, GPUs) per token are sums of it. Formulas: docs/cost_models.md.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

from cost_models.base import BYTES_PER_ACTIVATION  # BF16 dispatch; DeepEP's FP8 dispatch is not modelled
from specs import ClusterSpec, Degrees, LayerSpec, LayerStrategy, MoESpec, layer_grid
from specs.layer_parts import FAKE_BALANCED


@lru_cache(maxsize=4096)
def hit_probability(moe: MoESpec, lo: int, hi: int) -> float:
    """P(a token routes at least one of its k copies to an expert in [lo, hi)).

    learned, unrestricted: uniform over the C(E, k) choices, 1 - C(E - n, k) / C(E, k) with n = hi - lo.
    learned, group-limited: the token's groups a uniform T-subset S of the G groups (T =
    groups_per_token), then its k experts uniform over the M = T E / G experts of S: 1 - E_S[C(M -
    x_S, k) / C(M, k)], x_S the range's experts inside S. fake_balanced: token t takes experts
    (k t + j) mod E, j < k; the share of the window starts k t mod E whose window meets the range."""
    e, k = moe.num_experts, moe.top_k
    if moe.routing == FAKE_BALANCED:
        step = math.gcd(k, e)  # k t mod E runs over the multiples of gcd(k, E), each as often
        starts = range(0, e, step)
        return sum(any(lo <= (s + j) % e < hi for j in range(k)) for s in starts) / len(starts)
    if not moe.group_limited:
        return 1.0 - math.comb(e - (hi - lo), k) / math.comb(e, k)
    size, t = e // moe.expert_groups, moe.groups_per_token
    inside = [max(0, min(hi, (g + 1) * size) - max(lo, g * size)) for g in range(moe.expert_groups)]
    pool = t * size
    miss = sum(ways * math.comb(pool - x, k) for x, ways in _subset_sums(tuple(inside), t).items())
    return 1.0 - miss / (math.comb(moe.expert_groups, t) * math.comb(pool, k))


def _subset_sums(counts: tuple[int, ...], t: int) -> dict[int, int]:
    """{x: how many t-subsets of ``counts`` sum to x} (the generating polynomial, group by group)."""
    table: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(t)]  # table[c][x]: c groups chosen, sum x
    for n in counts:
        for c in range(t, 0, -1):
            for x, ways in table[c - 1].items():
                table[c][x + n] = table[c].get(x + n, 0) + ways
    return table[t]


class DomainSplit(NamedTuple):
    """An ep group seen by DeepEP: its ranks by scale-up domain, and each domain's and rank's experts."""

    parts: tuple[tuple[int, ...], ...]
    """The group's ranks in each domain it spans (ascending; ep rank order)."""
    domain_experts: tuple[tuple[int, int], ...]
    """Each part's expert range [lo, hi)."""
    rank_experts: tuple[tuple[int, int], ...]
    """Each ep rank's expert range."""


def domain_split(cluster: ClusterSpec, group: Sequence[int], num_experts: int) -> DomainSplit:
    """``group`` (one ep group, ascending) by domain; ep rank j holds experts [j E/ep, (j+1) E/ep)."""
    per = num_experts // len(group)
    parts: dict[int, list[int]] = {}
    for r in group:
        parts.setdefault(cluster.domain_of(r), []).append(r)
    ranges, start = [], 0
    for ranks in parts.values():  # domains ascend with the ranks, so each holds a run of ep ranks
        ranges.append((start * per, (start + len(ranks)) * per))
        start += len(ranks)
    return DomainSplit(tuple(tuple(p) for p in parts.values()), tuple(ranges),
                       tuple((j * per, (j + 1) * per) for j in range(len(group))))


def expected_destinations(moe: MoESpec, split: DomainSplit) -> tuple[float, float]:
    """(domains, GPUs) a token's copies go to on average, its own included: sums of hit_probability."""
    return (sum(hit_probability(moe, lo, hi) for lo, hi in split.domain_experts),
            sum(hit_probability(moe, lo, hi) for lo, hi in split.rank_experts))


class DeepEPLeg(NamedTuple):
    """One of DeepEP's two concurrent transfers, as a pairwise all-to-all over ``groups``."""

    nbytes: float
    """Each rank's send buffer: tokens x expected destinations x h x 2 bytes ((p-1)/p of it leaves)."""
    groups: tuple[tuple[int, ...], ...]
    time_s: float


def deepep_leg(all_to_all: Callable[[float, Sequence[Sequence[int]]], float], cluster: ClusterSpec,
               layer: LayerSpec, strategy: LayerStrategy, tokens: float, first_rank: int) -> DeepEPLeg:
    """The slower of DeepEP's legs for one dispatch (or combine) of ``tokens`` per rank (imbalance
    included): the network leg, each rank to the ranks of its local index in the other domains (rail
    groups) with tokens x E[domains] x h x 2 bytes, and the NVLink leg inside each domain with tokens x
    E[GPUs] x h x 2 bytes; in the symmetric case (p-1)/p of each leaves, the copies to remote domains
    and to GPUs that did not receive the token themselves."""
    n_domains, rails, n_gpus, domains = _leg_geometry(cluster, layer.moe, strategy.degrees, first_rank)
    per_copy = tokens * layer.hidden_size * BYTES_PER_ACTIVATION
    legs = [(per_copy * n_domains, rails), (per_copy * n_gpus, domains)]
    return max((DeepEPLeg(n, g, all_to_all(n, g)) for n, g in legs), key=lambda leg: leg.time_s)


@lru_cache(maxsize=4096)
def _leg_geometry(cluster: ClusterSpec, moe: MoESpec, degrees: Degrees, first_rank: int
                  ) -> tuple[float, tuple[tuple[int, ...], ...], float, tuple[tuple[int, ...], ...]]:
    """(E[domains], rail groups, E[GPUs], domain groups) of the ep groups of a layer split by
    ``degrees`` from ``first_rank``: what deepep_leg's two legs send and over which groups, the same
    for every micro-batch size (a planner asks it for each), so worked out once."""
    rails, domains, n_domains, n_gpus = [], [], 0.0, 0.0
    for group in layer_grid(first_rank, degrees).groups("ep"):
        split = domain_split(cluster, group, moe.num_experts)
        d, g = expected_destinations(moe, split)
        n_domains, n_gpus = max(n_domains, d), max(n_gpus, g)
        domains += split.parts
        rails += [tuple(p[j] for p in split.parts if j < len(p)) for j in range(max(map(len, split.parts)))]
    return n_domains, tuple(rails), n_gpus, tuple(domains)
