"""Expert parallelism of a MoE layer: the expert groups (Megatron-Core's rank order), the busiest
rank's routed load, the all-to-all dispatch and combine on the topology, and the split of the
layer's states into a dense part (synced over dp) and an expert part (synced over expert dp).

Used only where a strategy sets an expert field (``LayerStrategy.has_expert_split``); without
one every rank holds every expert and the layer is costed as before. Formulas: docs/cost_models.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from typing import Callable, NamedTuple, Sequence

import numpy as np

from cost_models import collectives as coll
from cost_models import ep_dispatch
from cost_models.ops import ExpertSplit
from specs import ClusterSpec, DPType, LayerSpec, LayerStrategy, SequenceParallel, SpecError, layer_grid

BYTES_PER_ACTIVATION = 2
"""Dispatched tokens are 16-bit activations."""
ALL_TO_ALLS_PER_PASS = 2
"""Dispatch (tokens to their experts) and combine (expert outputs back), in forward; their
transposes in backward; again in a full recompute."""
DROPLESS_IMBALANCE = 1.0
"""Busiest EP rank's routed copies over the even share when no token is dropped. 1.0 assumes a
router trained to balance (Switch's auxiliary loss, DeepSeek-V3's bias); set the cost model's
``expert_imbalance`` to a measured max/mean load to model skew."""


def applies(layer: LayerSpec, strategy: LayerStrategy) -> bool:
    """The expert terms replace the plain ones: a MoE layer whose strategy splits its experts."""
    return layer.moe is not None and strategy.has_expert_split


def imbalance(layer: LayerSpec, override: float | None = None) -> float:
    """Busiest rank's routed copies over an even share (tokens * k / ep).

    With a capacity factor c the busiest expert takes at most c times its even share and the
    buffers are padded to it, so every rank computes c times the even share: c. Dropless:
    DROPLESS_IMBALANCE. ``override`` (the cost model's ``expert_imbalance``) wins when set."""
    if override is not None:
        if not override >= 1.0:
            raise SpecError("expert_imbalance", f"must be >= 1 (busiest over mean load), got {override!r}")
        return float(override)
    return layer.moe.capacity_factor or DROPLESS_IMBALANCE


def busiest_passes_per_token(layer: LayerSpec, strategy: LayerStrategy, override: float | None = None) -> float:
    """Routed copies per local token that the busiest rank's experts compute: top_k * imbalance
    (ep 1: every copy stays local, so the padded count k * c, or k, with no imbalance)."""
    if strategy.ep == 1:
        return layer.moe.expert_passes_per_token
    return layer.moe.top_k * imbalance(layer, override)


def _seq_split(strategy: LayerStrategy) -> bool:
    return strategy.sp != SequenceParallel.NONE and strategy.degrees.split > 1


def dispatch_tokens(layer: LayerSpec, strategy: LayerStrategy, mbs: int) -> float:
    """Tokens one rank dispatches per micro-batch: its micro-batch's, split by tp under
    sequence parallelism (Megatron-SP or Ulysses), else whole on every tp rank; / cp."""
    return mbs * layer.seq_len / strategy.degrees.seq_split


def compute_split(layer: LayerSpec, strategy: LayerStrategy, override: float | None = None) -> ExpertSplit | None:
    """How ops.forward_ops counts the routed experts on one rank (None: as without ep).

    The rank's E / ep experts take the busiest rank's copies of the tokens of its ep group, at
    width f / etp. Under sequence parallelism the expert tp group gathers its tokens (etp of the
    tp shards), so the experts see etp / tp of the layer's tokens; without it every tp rank
    holds them all."""
    if not applies(layer, strategy):
        return None
    share = min(1.0, strategy.etp / (strategy.degrees.split // strategy.cp)) if _seq_split(strategy) else 1.0
    return ExpertSplit(passes_per_token=busiest_passes_per_token(layer, strategy, override),
                       etp=strategy.etp, tokens_factor=share)


# -- all-to-all --------------------------------------------------------------------------------
def all_to_all_bytes(layer: LayerSpec, strategy: LayerStrategy, mbs: int, override: float | None = None) -> float:
    """Send buffer per rank of one dispatch (or combine): tokens x routed copies x hidden x bytes
    (the busiest rank's copies, so the imbalance slows the whole group); (ep-1)/ep of it leaves."""
    passes = busiest_passes_per_token(layer, strategy, override)
    return dispatch_tokens(layer, strategy, mbs) * passes * layer.hidden_size * BYTES_PER_ACTIVATION


def pairwise_load(cluster: ClusterSpec, groups: Sequence[Sequence[int]]) -> dict[tuple, tuple[float, float]]:
    """Per resource of ``cluster.path``: (load, capacity in GB/s), the load being the share of one
    rank's buffer it carries when every group runs a pairwise all-to-all at once (each rank sends
    1/p of its buffer to each other member). Counted per place, not per pair: a rank's GPU ports
    carry its p-1 peers' shares, its node's NIC the peers outside its scale-up domain, its PCIe
    switch's uplinks the peers outside that switch (O(ranks), where walking the pairs is O(p^2)).
    The ranks of all groups are taken at once, group after group (each resource adds its shares
    in that order)."""
    per = cluster.gpus_per_node  # an uplink's place: (node, switch)
    return {(kind, *(divmod(k, per) if kind.startswith("uplink") else (k,))): (v, capacity)
            for kind, places, total, capacity in _resource_loads(cluster, groups)
            for k, v in zip(places.tolist(), total.tolist())}


def _resource_loads(cluster: ClusterSpec, groups: Sequence[Sequence[int]]
                    ) -> list[tuple[str, np.ndarray, np.ndarray, float]]:
    """pairwise_load by kind of resource: (kind, its places that carry a load, their loads,
    capacity in GB/s); an uplink's place is node x gpus_per_node + switch."""
    intra, inter = cluster.intra_node, cluster.inter_node
    port, nic = intra.bandwidth_gbytes_per_s, inter.nics_per_node * inter.nic_bandwidth_gbytes_per_s
    uplinks = intra.kind == "pcie" and intra.gpus_per_switch > 0
    ranks = np.fromiter(chain.from_iterable(groups), dtype=np.int64, count=sum(map(len, groups)))
    if not len(ranks):
        return []
    member = np.repeat(np.arange(len(groups)), [len(g) for g in groups])  # each rank's group
    p = np.array([len(g) for g in groups], dtype=np.int64)[member]
    node = ranks // cluster.gpus_per_node
    out = []

    def add(kind: str, places: np.ndarray, share: np.ndarray, capacity: float) -> None:
        """Each rank's share on the resource of ``kind`` at its place; a share of 0 adds none."""
        used = share > 0
        keys, at = np.unique(places[used], return_inverse=True)
        total = np.zeros(len(keys))
        np.add.at(total, at, share[used])  # in order: the sums the ranks' loop made
        out.append((kind, keys, total, capacity))

    ports = (p - 1) / p
    add("gpu_out", ranks, ports, port)
    add("gpu_in", ranks, ports, port)
    outside = (p - _peers_alike(member, ranks // cluster.domain_gpus)) / p
    add("nic_out", node, outside, nic)
    add("nic_in", node, outside, nic)
    if uplinks:
        per = cluster.gpus_per_node
        switch = node * per + (ranks % per) // intra.gpus_per_switch  # (node, switch) as one number
        off_switch = (p - _peers_alike(member, switch)) / p
        for kind in ("uplink_up", "uplink_down"):
            add(kind, switch, off_switch, intra.switch_uplink_gbytes_per_s)
    return out


def _peers_alike(member: np.ndarray, place: np.ndarray) -> np.ndarray:
    """[rank] how many ranks of its group (``member``) share its ``place`` (itself included)."""
    _, at, count = np.unique(member * (int(place.max()) + 1) + place, return_inverse=True, return_counts=True)
    return count[at]


def topology_all_to_all_s(cluster: ClusterSpec, nbytes: float, groups: Sequence[Sequence[int]],
                          alpha_s: Callable[[bool], float], efficiency: Callable[[bool], float]) -> float:
    """Pairwise all-to-all of ``nbytes`` per rank over every group at once, on the links:
    (p-1) alpha + (p-1)/p n / B (collectives.ring_time_s), with B the per-rank bandwidth the
    busiest resource leaves: B = (p-1)/p / max_r(load_r / (capacity_r * efficiency_r)).

    ``alpha_s(crosses_nodes)`` is the per-step latency, ``efficiency(crosses_nodes)`` the
    achieved share of a link (a NIC is a node-crossing link, GPU ports and uplinks are not)."""
    groups = tuple(tuple(g) for g in groups if len(g) > 1)
    if not groups or nbytes <= 0:
        return 0.0
    shape = _pairwise_shape(cluster, groups)
    seconds_per_byte = max(shape.nic_s_per_byte / efficiency(True), shape.link_s_per_byte / efficiency(False))
    # a bandwidth past float range (1e300 GB/s) leaves no time per byte: latency alone
    bandwidth = (shape.p - 1) / shape.p / seconds_per_byte if seconds_per_byte > 0 else math.inf
    return coll.ring_time_s("all_to_all", shape.p, nbytes, alpha_s(shape.crosses), bandwidth)


class PairwiseShape(NamedTuple):
    """What a pairwise all-to-all over some groups sees of the topology, whatever its size."""

    p: int
    """The largest group."""
    nic_s_per_byte: float
    """max over the NICs of load / capacity (s per byte of one rank's buffer at full efficiency)."""
    link_s_per_byte: float
    """The same over the other resources (GPU ports, PCIe uplinks)."""
    crosses: bool
    """Some group spans two scale-up domains."""


@lru_cache(maxsize=1024)
def _pairwise_shape(cluster: ClusterSpec, groups: tuple[tuple[int, ...], ...]) -> PairwiseShape:
    """The size-independent part of ``topology_all_to_all_s`` (a planner asks it once per
    message size)."""
    ratio = {True: 0.0, False: 0.0}
    for kind, _, total, capacity in _resource_loads(cluster, groups):
        if len(total):
            nic = kind.startswith("nic")
            ratio[nic] = max(ratio[nic], float((total / (capacity * 1e9)).max()))
    crosses = any(cluster.domain_of(min(g)) != cluster.domain_of(max(g)) for g in groups)  # domains ascend
    return PairwiseShape(max(len(g) for g in groups), ratio[True], ratio[False], crosses)


def passes(strategy: LayerStrategy) -> int:
    """Passes whose all-to-alls run per micro-batch: forward, backward, and a recompute that
    re-runs the forward's collectives (full, selective-op)."""
    return 3 if strategy.recompute.reruns_forward_collectives else 2


def dispatch_time_s(all_to_all: Callable[[float, Sequence[Sequence[int]]], float], layer: LayerSpec,
                    strategy: LayerStrategy, mbs: int, first_rank: int, override: float | None = None) -> float:
    """All-to-alls of one micro-batch (dispatch + combine per pass), on the critical path."""
    if not applies(layer, strategy) or strategy.ep == 1:
        return 0.0
    nbytes = all_to_all_bytes(layer, strategy, mbs, override)
    groups = layer_grid(first_rank, strategy.degrees).groups("ep")
    return passes(strategy) * ALL_TO_ALLS_PER_PASS * all_to_all(nbytes, groups)


def deepep_leg(all_to_all: Callable[[float, Sequence[Sequence[int]]], float], cluster: ClusterSpec,
               layer: LayerSpec, strategy: LayerStrategy, mbs: int, first_rank: int,
               override: float | None = None) -> ep_dispatch.DeepEPLeg:
    """The binding leg of one DeepEP dispatch (or combine) of the rank's tokens (dispatch_tokens, times
    the busiest rank's imbalance as all_to_all_bytes takes it): ep_dispatch.deepep_leg."""
    tokens = dispatch_tokens(layer, strategy, mbs) * busiest_passes_per_token(layer, strategy, override) / layer.moe.top_k
    return ep_dispatch.deepep_leg(all_to_all, cluster, layer, strategy, tokens, first_rank)


def deepep_time_s(all_to_all: Callable[[float, Sequence[Sequence[int]]], float], cluster: ClusterSpec,
                  layer: LayerSpec, strategy: LayerStrategy, mbs: int, first_rank: int,
                  override: float | None = None) -> float:
    """DeepEP's dispatches and combines of one micro-batch (Plan.ep_dispatcher deepep), on the critical
    path as dispatch_time_s's are: the binding leg of each."""
    if not applies(layer, strategy) or strategy.ep == 1:
        return 0.0
    leg = deepep_leg(all_to_all, cluster, layer, strategy, mbs, first_rank, override)
    return passes(strategy) * ALL_TO_ALLS_PER_PASS * leg.time_s


# -- states ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyncPart:
    """Parameters of one layer that one group keeps in sync (and shards under ZeRO)."""

    params: float
    """Parameters on one GPU before ZeRO sharding."""
    dp_type: DPType
    groups: tuple[tuple[int, ...], ...]
    """The gradient-sync groups."""
    size: int
    """Ranks per group."""


def expert_params(layer: LayerSpec) -> float:
    """Routed experts' parameters (the router and shared experts are dense)."""
    return float(layer.moe.num_experts * layer._mlp_params(layer.moe.expert_ffn_hidden_size))


def sync_parts(layer: LayerSpec, strategy: LayerStrategy, first_rank: int, dp_groups: Sequence[Sequence[int]],
               params: float | None = None) -> list[SyncPart]:
    """The layer's states by sync group: all of it over ``dp_groups`` (no expert split), or the
    dense part (attention, norms, router, shared experts) / tp over dp and the routed
    experts / (ep * etp) over the expert-dp groups with ``expert_dp_kind``. ``params``: the
    layer's total (a profile's count) split in the spec's proportion; default the spec's."""
    total = float(layer.param_count()) if params is None else float(params)
    groups = coll.rank_groups(dp_groups)
    if not applies(layer, strategy):
        return [SyncPart(total / strategy.tp, strategy.dp_type, groups, strategy.degrees.grad_sync)]
    expert = total * expert_params(layer) / layer.param_count()
    edp = layer_grid(first_rank, strategy.degrees).groups("edp")
    return [SyncPart((total - expert) / strategy.tp, strategy.dp_type, groups, strategy.degrees.grad_sync),
            SyncPart(expert / (strategy.ep * strategy.etp), strategy.expert_dp_kind, edp, strategy.expert_dp)]


def activation_correction_bytes(layer: LayerSpec, strategy: LayerStrategy, mbs: int, per_width: int,
                                override: float | None = None) -> float:
    """Kept activations of the routed experts under the split, less what memory.py counts for
    them without one (per copy: the dispatched input 2h, and ``per_width`` bytes per unit of the
    expert's inner width). The split's: the experts' tokens (compute_split) x the busiest
    copies x (2h + per_width f / etp)."""
    if not applies(layer, strategy):
        return 0.0
    split = compute_split(layer, strategy, override)
    tokens, h, f = mbs * layer.seq_len, layer.hidden_size, layer.moe.expert_ffn_hidden_size
    copies = tokens * split.tokens_factor * split.passes_per_token
    new = copies * (BYTES_PER_ACTIVATION * h + per_width * f / split.etp)
    plain = tokens * layer.moe.expert_passes_per_token
    if _seq_split(strategy):
        old = plain * (BYTES_PER_ACTIVATION * h + per_width * f) / strategy.degrees.split
    else:
        old = plain * (BYTES_PER_ACTIVATION * h + per_width * f / strategy.degrees.split)
    return new - old
