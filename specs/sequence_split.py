"""Where a plan keeps the residual stream split along the sequence from one block into the next
(as Megatron does between sequence-parallel layers) and where a block gathers it whole: the
executor runs it, the cost model's list of the executor's collectives counts it."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specs.model import ModelSpec
    from specs.plan import LayerStrategy, Plan


def sequence_split(s: LayerStrategy) -> tuple[int, int, int, int, int, bool] | None:
    """How a layer's block holds its residual stream between its entry and its exit: split over
    (Megatron-SP's tp, Ulysses, cp) on the rank grid (tp, dp, tp_consecutive when dp > 1) that
    places those groups; None: whole (replicated on its group)."""
    sp_tp = s.tp if s.megatron_sp else 1
    if sp_tp * s.ulysses * s.cp == 1:
        return None
    return sp_tp, s.ulysses, s.cp, s.tp, s.dp, s.tp_consecutive or s.dp == 1


def keeps_sequence_split(model: ModelSpec, plan: Plan) -> tuple[bool, ...]:
    """Per layer: whether its block's output goes on into the next layer's block still split
    (the next layer is in the same model chunk and splits the same sequence the same way; no
    patch merging in between). Elsewhere a split block gathers its output whole at its exit and
    cuts its own chunk of its input at its entry."""
    kept = [False] * len(plan.layers)
    for chunk in plan.chunk_ranges():
        for i, j in zip(chunk, chunk[1:]):
            split = sequence_split(plan.layers[i])
            kept[i] = (split is not None and split == sequence_split(plan.layers[j])
                       and not model.layers[i].downsample_to and model.layers[i].seq_len == model.layers[j].seq_len)
    return tuple(kept)


def split_ends(model: ModelSpec, plan: Plan) -> tuple[tuple[bool, bool], ...]:
    """Per layer (split_in, split_out): whether its block's input arrives and its output leaves
    sequence-split (keeps_sequence_split of the layer before it, and of itself)."""
    kept = keeps_sequence_split(model, plan)
    return tuple((i > 0 and kept[i - 1], out) for i, out in enumerate(kept))
