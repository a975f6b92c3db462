"""Where a MoE layer's expert shards live on its stage: one rank order that the cost models, the
simulator and the executor all read (Megatron-Core's: ep carved out of the layer's data-parallel
ranks)."""
from __future__ import annotations

from dataclasses import dataclass

from specs.plan import LayerStrategy


@dataclass(frozen=True)
class ExpertGroups:
    """Rank groups of one MoE layer on its stage."""

    etp: tuple[tuple[int, ...], ...]
    """Ranks splitting one expert's MLP."""
    ep: tuple[tuple[int, ...], ...]
    """Ranks exchanging tokens by all-to-all (each holds num_experts / ep experts)."""
    edp: tuple[tuple[int, ...], ...]
    """Ranks holding the same expert shard: the experts' gradient-sync and ZeRO group."""


def expert_rank(first_rank: int, s: LayerStrategy, t: int, e: int, d: int) -> int:
    """The rank holding expert-tp index t, ep index e, expert-dp index d.

    With etp = tp (the default) the experts follow the layer's own layout: the rank of dp index
    d * ep + e and tp index t, consecutive (t + tp * (e + ep * d), Megatron-Core's tp-ep-dp
    order) or strided (t * dp + d * ep + e). Any other etp (whole experts, or Ulysses' replicated
    weights) takes Megatron-Core's expert order t + etp * (e + ep * d) over the stage."""
    if s.etp == s.tp and not s.tp_consecutive and s.dp > 1:
        return first_rank + t * s.dp + d * s.ep + e
    return first_rank + t + s.etp * (e + s.ep * d)


def expert_coords(s: LayerStrategy, local: int) -> tuple[int, int, int]:
    """(expert-dp index, ep index, expert-tp index) of the stage's rank ``local`` (expert_rank's inverse)."""
    if s.etp == s.tp and not s.tp_consecutive and s.dp > 1:
        t, dense_dp = divmod(local, s.dp)
    else:
        t, dense_dp = local % s.etp, local // s.etp
    d, e = divmod(dense_dp, s.ep)
    return d, e, t


def expert_groups(first_rank: int, s: LayerStrategy) -> ExpertGroups:
    """The etp, ep and expert-dp groups of a MoE layer whose stage starts at ``first_rank``."""
    etp, ep, edp = s.etp, s.ep, s.expert_dp

    def rank(t: int, e: int, d: int) -> int:
        return expert_rank(first_rank, s, t, e, d)
    return ExpertGroups(
        etp=tuple(tuple(rank(t, e, d) for t in range(etp)) for d in range(edp) for e in range(ep)),
        ep=tuple(tuple(rank(t, e, d) for e in range(ep)) for d in range(edp) for t in range(etp)),
        edp=tuple(tuple(rank(t, e, d) for d in range(edp)) for e in range(ep) for t in range(etp)))
