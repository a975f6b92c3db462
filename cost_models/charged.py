"""The data-parallel collectives the analytical model charges for a plan, listed: per layer and
state part (dense, routed experts), each kind with its group, elements per call and calls per
iteration, in the schedule ``AnalyticalModel.dp_traffic`` times (DDP, Megatron's distributed
optimizer, DeepSpeed ZeRO-2, FSDP). The executor's recorded collectives are compared with it."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cost_models import experts
from cost_models import sequence as seq
from cost_models.memory import GRAD_BYTES_PER_PARAM
from specs import DPType, ModelSpec, Plan


class Collective(StrEnum):
    """A data-parallel collective kind (torch.distributed's names)."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"


class Part(StrEnum):
    """The share of a layer's states one sync group holds (cost_models.experts.sync_parts)."""

    DENSE = "dense"
    """Attention, norms, router and shared experts (the whole layer without an expert split)."""
    EXPERTS = "experts"
    """The routed experts, over their expert-data-parallel group."""


@dataclass(frozen=True, kw_only=True)
class ChargedCollective:
    """One kind of data-parallel collective of one layer part, per rank and iteration."""

    layer: int
    part: Part
    op: Collective
    group_axes: tuple[str, ...]
    """The grid axes of the group (``dp``, ``cp``, ``ulysses``; ``edp`` for routed experts)."""
    group_size: int
    elements: float
    """Elements of the full buffer each call reduces or gathers on one rank (parameters of the
    part after tensor/expert parallelism)."""
    calls: int
    """Calls per iteration."""

    @property
    def bytes_per_call(self) -> float:
        """Bytes the cost model charges per call (GRAD_BYTES_PER_PARAM per element)."""
        return self.elements * GRAD_BYTES_PER_PARAM


def _kinds(dp_type: DPType, micro_batches: int) -> list[tuple[Collective, int]]:
    """(kind, calls per iteration) of one part as dp_traffic schedules them."""
    if dp_type == DPType.DDP:
        return [(Collective.ALL_REDUCE, 1)]
    if dp_type == DPType.ZERO1:
        return [(Collective.REDUCE_SCATTER, 1), (Collective.ALL_GATHER, 1)]
    if dp_type == DPType.ZERO2:
        return [(Collective.REDUCE_SCATTER, micro_batches), (Collective.ALL_GATHER, 1)]
    return [(Collective.REDUCE_SCATTER, micro_batches), (Collective.ALL_GATHER, 2 * micro_batches)]


def charged_dp_collectives(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """Every layer's charged data-parallel collectives (none for a part whose group is one rank)."""
    per_stage = world_size // plan.pp
    out = []
    for stage, layers in enumerate(plan.stage_ranges()):
        first_rank = stage * per_stage
        for i in layers:
            layer, s = model.layers[i], plan.layers[i]
            _, dp_groups = seq.sync_groups(first_rank, s)
            for part, sync in zip(Part, experts.sync_parts(layer, s, first_rank, dp_groups)):
                if sync.size <= 1 or sync.params <= 0:
                    continue
                axes = tuple(a for a in s.degrees.grad_sync_axes if getattr(s, a) > 1) if part == Part.DENSE \
                    else ("edp",)
                out += [ChargedCollective(layer=i, part=part, op=op, group_axes=axes, group_size=sync.size,
                                          elements=sync.params, calls=calls)
                        for op, calls in _kinds(sync.dp_type, plan.micro_batches)]
    return out
