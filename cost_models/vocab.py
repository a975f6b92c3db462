"""Embedding (first stage) and head + loss (last stage) for the analytical model: their kernels,
TP and DP traffic, tied-embedding sync between the two ends, memory, and per-stage overheads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from cost_models import memory as mem
from cost_models.base import BYTES_PER_ACTIVATION, LayerTime, MemoryBreakdown
from cost_models.ops import (embedding_backward_ops, embedding_forward_ops, head_backward_ops,
                             head_forward_ops)
from specs import DPType, ModelSpec, Plan, Schedule

if TYPE_CHECKING:
    from cost_models.analytical import AnalyticalModel

LOSS_ALLREDUCE_BYTES_PER_TOKEN = 12
"""Vocab-parallel cross-entropy all-reduces three fp32 values per token (max, sum, target logit)."""
LOGIT_KEPT_BYTES = 4
"""The loss keeps its fp32 softmax for backward (Megatron vocab-parallel cross-entropy)."""


def _vocab_layout(plan: Plan, world_size: int, stage: int) -> tuple[int, int, float, list, list]:
    """(tp, dp, micro-batch size, tp groups, dp groups) of the vocabulary layers on ``stage``."""
    per_stage = world_size // plan.pp
    tp = plan.vocab_tp
    dp = per_stage // tp
    first = plan.stage_first_rank(stage, world_size)
    ranks = list(range(first, first + per_stage))
    tp_groups = [ranks[i * tp:(i + 1) * tp] for i in range(dp)]
    dp_groups = [ranks[j::tp] for j in range(tp)]
    return tp, dp, plan.global_batch / (dp * plan.micro_batches), tp_groups, dp_groups


def _dp_type(plan: Plan, layer_index: int, dp: int) -> str:
    return plan.layers[layer_index].dp_type if dp > 1 else DPType.DDP


def vocab_cost(model_: "AnalyticalModel", model: ModelSpec, plan: Plan, stage: int,
               world_size: int) -> tuple[LayerTime, MemoryBreakdown]:
    """Time and memory of what the stage holds besides its Transformer layers."""
    c = model_.constants
    tp, dp, mbs, tp_groups, dp_groups = _vocab_layout(plan, world_size, stage)
    tokens = mbs * model.seq_len
    h = model.embedding.hidden_size
    fwd = c.micro_batch_overhead_s
    bwd = tp_comm = dp_comm = exposed = 0.0
    update = c.iteration_overhead_s
    memory = MemoryBreakdown()
    last = plan.pp - 1
    if stage == 0:
        f = model_.ops_time(embedding_forward_ops(model.embedding, tokens, tp))
        b = model_.ops_time(embedding_backward_ops(model.embedding, tokens, tp))
        fwd, bwd = fwd + f, bwd + b
        if tp > 1 and model.embedding.kind == "token":
            tp_comm += model_.collective_time("all_reduce", tokens * h * BYTES_PER_ACTIVATION, tp_groups)
        params = model.embedding.param_count() / tp
        d_sync, d_exposed, d_update, states = _states(model_, params, plan, 0, dp, dp_groups, b)
        dp_comm, exposed, update = dp_comm + d_sync, exposed + d_exposed, update + d_update
        held = plan.micro_batches if plan.schedule == Schedule.GPIPE else min(plan.pp, plan.micro_batches)
        memory = memory + states + MemoryBreakdown(activations_bytes=held * tokens * h * mem.MASK_BYTES)
    if stage == last and model.head.kind != "none":
        head = model.head
        f = model_.ops_time(head_forward_ops(head, model.seq_len, mbs, tp))
        b = model_.ops_time(head_backward_ops(head, model.seq_len, mbs, tp))
        fwd, bwd = fwd + f, bwd + b
        head_tokens = mbs * head.seq_len
        if tp > 1:
            tp_comm += model_.collective_time("all_reduce", head_tokens * head.hidden_size * BYTES_PER_ACTIVATION,
                                              tp_groups)
            tp_comm += model_.collective_time("all_reduce", head_tokens * LOSS_ALLREDUCE_BYTES_PER_TOKEN, tp_groups)
        params = _head_params(model, plan) / tp
        d_sync, d_exposed, d_update, states = _states(model_, params, plan, len(plan.layers) - 1, dp, dp_groups, b)
        dp_comm, exposed, update = dp_comm + d_sync, exposed + d_exposed, update + d_update
        logits = head_tokens * head.output_size / tp
        kept = logits * LOGIT_KEPT_BYTES + head_tokens * head.hidden_size * BYTES_PER_ACTIVATION
        memory = memory + states + MemoryBreakdown(activations_bytes=kept,
                                                   temporary_bytes=logits * (BYTES_PER_ACTIVATION + 4))
    if plan.pp > 1 and model.head.tied and stage in (0, last) and model.head.kind == "lm":
        sync = _tied_embedding_sync_s(model_, model, plan, world_size)
        dp_comm, exposed = dp_comm + sync, exposed + sync
    return (LayerTime(forward_s=fwd, backward_s=bwd, tp_comm_s=tp_comm, dp_comm_s=dp_comm,
                      exposed_dp_comm_s=exposed, update_s=update), memory)


def _head_params(model: ModelSpec, plan: Plan) -> float:
    """The head's parameters on the last stage; a tied head on its own stage keeps a copy of
    the embedding matrix (Megatron), on the first stage it shares it."""
    params = model.head.param_count()
    if model.head.tied and plan.pp > 1 and model.head.kind == "lm":
        params += model.head.hidden_size * model.head.output_size
    return float(params)


def _states(model_: "AnalyticalModel", params: float, plan: Plan, layer_index: int, dp: int,
            dp_groups: list, backward_s: float) -> tuple[float, float, float, MemoryBreakdown]:
    dp_type = _dp_type(plan, layer_index, dp)
    sync = model_.dp_sync_time(params, dp_type, dp_groups)
    exposed = model_.exposed_time(sync, backward_s)
    return sync, exposed, model_.update_time(params, dp_type, dp), mem.model_state_bytes(params, dp_type, dp)


def _tied_embedding_sync_s(model_: "AnalyticalModel", model: ModelSpec, plan: Plan, world_size: int) -> float:
    """All-reduce of the tied word-embedding gradient between the first and last stage."""
    per_stage = world_size // plan.pp
    first, last = plan.stage_first_rank(0, world_size), plan.stage_first_rank(plan.pp - 1, world_size)
    groups = [[first + i, last + i] for i in range(per_stage)]
    nbytes = model.head.hidden_size * model.head.output_size / plan.vocab_tp * mem.GRAD_BYTES_PER_PARAM
    return model_.collective_time("all_reduce", nbytes, groups)
