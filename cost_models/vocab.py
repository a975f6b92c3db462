"""Embedding (first stage) and head + loss (last stage) for the analytical model: their kernels,
TP and DP traffic, tied-embedding sync between the two ends, memory, and per-stage overheads.
"""
from __future__ import annotations

import weakref
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

from cost_models import memory as mem
from cost_models.base import BYTES_PER_ACTIVATION, CostModel, LayerTime, MemoryBreakdown, in_flight
from cost_models.collectives import largest_group, rank_groups
from cost_models.memo import HashOnce, hash_once
from cost_models.ops import (embedding_backward_ops, embedding_forward_ops, head_backward_ops,
                             head_forward_ops)
from specs import GRAD_SYNC_AXES, SPLIT_AXES, DPType, LayerStrategy, ModelSpec, Plan, RankGroups, layer_grid

if TYPE_CHECKING:
    from cost_models.analytical import AnalyticalModel

LOSS_ALLREDUCES = 3
"""Vocab-parallel cross-entropy all-reduces the logits' max, the sum of their exponentials and the
target's logit, one after the other (each needs the one before): three collectives of one fp32
per token (Megatron's and executor.parallel.vocab's)."""
LOSS_ALLREDUCE_BYTES_PER_TOKEN = 4
"""What each of those all-reduces carries: one fp32 per token."""
LOGIT_KEPT_BYTES = 4
"""The loss keeps its fp32 softmax for backward (Megatron vocab-parallel cross-entropy)."""


def layout_for(plan: Plan, world_size: int, stage: int) -> tuple[int, int, float, RankGroups, RankGroups]:
    """(split, dp, micro-batch size, split groups, gradient-sync groups) of the vocabulary layers on
    ``stage``, from Plan.vocab_degrees: the split groups are vocab_tp's (or Ulysses' under
    vocab_sp ulysses, whose gradients then sync over the whole stage)."""
    d = plan.vocab_degrees(world_size // plan.pp)
    grid = layer_grid(plan.stage_first_rank(stage, world_size), d)
    return d.split, d.dp, plan.global_batch / (d.dp * plan.micro_batches), grid.groups(SPLIT_AXES), \
        grid.groups(GRAD_SYNC_AXES)


def vocab_relayout_s(cost_model: CostModel, model: ModelSpec, plan: Plan, world_size: int, layer_index: int,
                     strategy: LayerStrategy) -> float:
    """Per micro-batch, forward and backward: the relayout between the vocabulary's layout and
    layer ``layer_index`` (0: embedding -> first layer; the last: last layer -> head) run under
    ``strategy`` (the cost model's transition_time), where embedding and head run in their own
    layout (Plan.vocab_in_own_layout); else 0."""
    per_stage = world_size // plan.pp
    if not plan.vocab_in_own_layout(model, per_stage):
        return 0.0
    vocab = _vocab_strategy(plan.vocab_tp, per_stage // plan.vocab_tp, plan.vocab_sp if plan.vocab_tp > 1 else "none")
    first = layer_index == 0
    stage = 0 if first else plan.head_stage
    prev, nxt = (vocab, strategy) if first else (strategy, vocab)
    return cost_model.transition_time(model.layers[layer_index], prev, nxt,
                                      plan.global_batch // (prev.dp * plan.micro_batches),
                                      plan.stage_first_rank(stage, world_size))


@lru_cache(maxsize=256)
def _vocab_strategy(tp: int, dp: int, sp: str) -> LayerStrategy:
    """The vocabulary's layout as a layer strategy (what a relayout to or from it moves)."""
    return LayerStrategy(tp=tp, dp=dp, sp=sp)


def vocab_relayouts_s(cost_model: CostModel, model: ModelSpec, plan: Plan, stage: int) -> float:
    """The cost model's vocab_relayout_time of the plan's own first (stage 0) and last (last
    stage) layers."""
    last = len(plan.layers) - 1
    return ((cost_model.vocab_relayout_time(model, plan, 0, plan.layers[0]) if stage == 0 else 0.0)
            + (cost_model.vocab_relayout_time(model, plan, last, plan.layers[last]) if stage == plan.head_stage else 0.0))


def vocab_dp_type(plan: Plan, layer_index: int, dp: int) -> str:
    """ZeRO-3 when the plan says so (Galvatron's embed_sdp), else the neighbouring layer's type."""
    if dp <= 1:
        return DPType.DDP
    return DPType.ZERO3 if plan.vocab_zero3 else plan.layers[layer_index].dp_type


def padded_model(model: ModelSpec, plan: Plan) -> ModelSpec:
    """``model`` with the vocabulary padded as Megatron pads it at the plan's vocab tp."""
    emb, head = model.embedding, model.head
    if not emb.vocab_size and head.kind != "lm":
        return model
    vocab = plan.padded_vocab_size(emb.vocab_size) if emb.vocab_size else 0
    output = plan.padded_vocab_size(head.output_size) if head.kind == "lm" else 0
    return _with_vocab(hash_once(model), vocab, output)


@lru_cache(maxsize=256)
def _with_vocab(model: HashOnce, vocab: int, output: int) -> ModelSpec:
    """The model with these padded sizes (0: that end unchanged), built once per model and sizes."""
    spec, changes = model.value, {}
    if vocab:
        changes["embedding"] = replace(spec.embedding, vocab_size=vocab)
    if output:
        changes["head"] = replace(spec.head, output_size=output)
    return replace(spec, **changes)


def weight_split(plan: Plan, world_size: int) -> tuple[int, int]:
    """(ranks the embedding/head weights are split over, ranks their gradients sync over):
    Plan.vocab_degrees' tp and grad_sync (1 and the whole stage under Ulysses)."""
    d = plan.vocab_degrees(world_size // plan.pp)
    return d.tp, d.grad_sync


_COSTS: "weakref.WeakKeyDictionary[AnalyticalModel, dict]" = weakref.WeakKeyDictionary()
"""Per cost model: _cost_key -> vocab_cost's answer less the relayouts to the first/last layer."""


def vocab_cost(model_: "AnalyticalModel", model: ModelSpec, plan: Plan, stage: int,
               world_size: int) -> tuple[LayerTime, MemoryBreakdown]:
    """Time and memory of what the stage holds besides its Transformer layers: the part that
    does not depend on the first/last layer's layout worked out once per _cost_key (planners
    ask it for many plans alike: the same ends' dp types, or a ZeRO-3 vocabulary that
    ignores them), plus those relayouts."""
    costs = _COSTS.setdefault(model_, {})
    key = _cost_key(model, plan, stage, world_size)
    if key not in costs:
        costs[key] = _vocab_cost(model_, model, plan, stage, world_size)
    lt, memory = costs[key]
    relayouts = vocab_relayouts_s(model_, model, plan, stage)
    return (replace(lt, tp_comm_s=lt.tp_comm_s + relayouts) if relayouts else lt), memory


def _cost_key(model: ModelSpec, plan: Plan, stage: int, world_size: int) -> tuple:
    """Everything of the plan _vocab_cost reads: its pipeline and batch, its vocab fields, and
    the dp type each end the stage holds syncs under (vocab_dp_type), not its layers otherwise."""
    sync_dp = weight_split(plan, world_size)[1]
    held = ([0] if stage == 0 else []) + ([len(plan.layers) - 1] if stage == plan.head_stage else [])
    ends = tuple(vocab_dp_type(plan, i, sync_dp) for i in held)  # vocab_ends' layers
    return (hash_once(model), stage, world_size, plan.pp, plan.virtual_stages, plan.schedule, plan.global_batch,
            plan.micro_batches, plan.vocab_tp, plan.vocab_zero3, plan.vocab_sp, len(plan.layers), ends)


def _vocab_cost(model_: "AnalyticalModel", model: ModelSpec, plan: Plan, stage: int,
                world_size: int) -> tuple[LayerTime, MemoryBreakdown]:
    """vocab_cost without vocab_relayouts_s."""
    c = model_.constants
    model = padded_model(model, plan)
    tp, dp, mbs, tp_groups, dp_groups = layout_for(plan, world_size, stage)
    weight_tp, sync_dp = weight_split(plan, world_size)
    tokens = mbs * model.seq_len
    h = model.embedding.hidden_size
    fwd = c.micro_batch_overhead_s
    bwd = dp_comm = exposed = 0.0
    update = c.iteration_overhead_s
    memory = MemoryBreakdown()
    last = plan.head_stage
    if stage == 0:
        f = model_.ops_time(embedding_forward_ops(model.embedding, tokens, tp))
        b = model_.ops_time(embedding_backward_ops(model.embedding, tokens, tp))
        fwd, bwd = fwd + f, bwd + b
        params = model.embedding.param_count() / weight_tp
        d_sync, d_exposed, d_update, states = _states(model_, params, plan, 0, sync_dp, dp_groups, b)
        dp_comm, exposed, update = dp_comm + d_sync, exposed + d_exposed, update + d_update
        held = in_flight(plan.schedule, plan.pp, 0, plan.micro_batches, plan.virtual_stages)
        memory = memory + states + MemoryBreakdown(activations_bytes=held * tokens * h * mem.MASK_BYTES)
    if stage == last and model.head.kind != "none":
        head = model.head
        f = model_.ops_time(head_forward_ops(head, mbs, tp))
        b = model_.ops_time(head_backward_ops(head, mbs, tp))
        fwd, bwd = fwd + f, bwd + b
        head_tokens = mbs * head.seq_len
        params = head_params(model, plan) / weight_tp
        d_sync, d_exposed, d_update, states = _states(model_, params, plan, len(plan.layers) - 1, sync_dp,
                                                      dp_groups, b)
        dp_comm, exposed, update = dp_comm + d_sync, exposed + d_exposed, update + d_update
        # vocab-parallel cross-entropy: each rank holds logits / tp (its vocab shard, or its tokens)
        logits = head_tokens * head.output_size / tp
        head_input = head_tokens * head.hidden_size * BYTES_PER_ACTIVATION / (tp if plan.vocab_sp != "none" else 1)
        kept = logits * LOGIT_KEPT_BYTES + head_input
        memory = memory + states + MemoryBreakdown(activations_bytes=kept,
                                                   temporary_bytes=logits * (BYTES_PER_ACTIVATION + 4))
    if last != 0 and model.head.tied_lm and stage in (0, last):
        sync = _tied_embedding_sync_s(model_, model, plan, world_size)
        dp_comm, exposed = dp_comm + sync, exposed + sync
    tp_comm = vocab_tp_comm_s(model_, model, plan, stage, mbs, tp_groups)
    return (LayerTime(forward_s=fwd, backward_s=bwd, tp_comm_s=tp_comm, dp_comm_s=dp_comm,
                      exposed_dp_comm_s=exposed, update_s=update), memory)


def vocab_tp_comm_s(cost_model: CostModel, model: ModelSpec, plan: Plan, stage: int, mbs: float,
                    tp_groups: list) -> float:
    """The vocabulary's tensor-parallel collectives of one micro-batch on ``stage`` (none at tp 1
    or under Ulysses, whose group splits tokens): the embedding's partial lookups summed
    (forward), the head's input gradient summed (backward) and the vocab-parallel
    cross-entropy's three all-reduces of one fp32 per token."""
    tp = largest_group(tp_groups)
    if tp <= 1 or plan.vocab_sp == "ulysses":
        return 0.0
    comm_s = 0.0
    if stage == 0 and model.embedding.kind == "token":
        comm_s += _vocab_tp_comm(cost_model, mbs * model.seq_len * model.embedding.hidden_size * BYTES_PER_ACTIVATION,
                                 tp_groups, plan, "all_reduce")
    if stage == plan.head_stage and model.head.kind != "none":
        head_tokens = mbs * model.head.seq_len
        comm_s += _vocab_tp_comm(cost_model, head_tokens * model.head.hidden_size * BYTES_PER_ACTIVATION, tp_groups,
                                 plan, "all_reduce")
        comm_s += LOSS_ALLREDUCES * cost_model.collective_time("all_reduce", head_tokens * LOSS_ALLREDUCE_BYTES_PER_TOKEN,
                                                               tp_groups)
    return comm_s


def _vocab_tp_comm(model_: CostModel, nbytes: float, groups: list, plan: Plan, kind: str) -> float:
    """The vocab layers' TP collective: an all-reduce, or with Megatron-SP a reduce-scatter
    (embedding output into sequence shards) plus an all-gather (head input) of the same bytes."""
    if plan.vocab_sp == "megatron":
        return 0.5 * (model_.collective_time("reduce_scatter", nbytes, groups)
                      + model_.collective_time("all_gather", nbytes, groups))
    return model_.collective_time(kind, nbytes, groups)


def vocab_ends(model: ModelSpec, plan: Plan, stage: int) -> list[tuple[int, float]]:
    """(index of the layer whose dp type it follows, parameters) of the embedding on the first
    stage and of the head on the last: the ends ``stage`` holds."""
    return (([(0, float(model.embedding.param_count()))] if stage == 0 else [])
            + ([(len(plan.layers) - 1, head_params(model, plan))] if stage == plan.head_stage else []))


def head_params(model: ModelSpec, plan: Plan) -> float:
    """The head's parameters on its stage; a tied head on its own stage keeps a copy of the
    embedding matrix (Megatron), on the first stage (pp 1, or a V-shape) it shares it."""
    params = model.head.param_count()
    if model.head.tied_lm and plan.head_stage != 0:
        params += model.head.hidden_size * model.head.output_size
    return float(params)


def _states(model_: "AnalyticalModel", params: float, plan: Plan, layer_index: int, dp: int,
            dp_groups: list, backward_s: float) -> tuple[float, float, float, MemoryBreakdown]:
    dp_type = vocab_dp_type(plan, layer_index, dp)
    sync = model_.dp_sync_time(params, dp_type, dp_groups)
    exposed = model_.exposed_time(sync, backward_s)
    return sync, exposed, model_.update_time(params, dp_type, dp), mem.model_state_bytes(params, dp_type, dp)


@lru_cache(maxsize=4096)
def _pair_groups(first: int, last: int, count: int) -> RankGroups:
    """The groups {first + i, last + i}, i < count."""
    return rank_groups([(first + i, last + i) for i in range(count)])


def _tied_embedding_sync_s(model_: "AnalyticalModel", model: ModelSpec, plan: Plan, world_size: int) -> float:
    """All-reduce of the tied word-embedding gradient between the first and last stage."""
    per_stage = world_size // plan.pp
    first, last = plan.stage_first_rank(0, world_size), plan.stage_first_rank(plan.head_stage, world_size)
    groups = _pair_groups(first, last, per_stage)
    weight_tp = plan.vocab_degrees(per_stage).tp
    nbytes = model.head.hidden_size * plan.padded_vocab_size(model.head.output_size) / weight_tp * mem.GRAD_BYTES_PER_PARAM
    return model_.collective_time("all_reduce", nbytes, groups)
