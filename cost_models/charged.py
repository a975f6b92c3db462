"""The collectives the analytical model charges for a plan, listed per rank and iteration, each
kind with its group, elements per call and calls per iteration; the executor's recorded
collectives are compared with them (--check).

Data parallelism: per layer and state part (dense, routed experts), in the schedule
``AnalyticalModel.dp_traffic`` times (DDP, Megatron's distributed optimizer, DeepSpeed ZeRO-2,
FSDP). Model parallelism, per layer: tensor-parallel all-reduces or Megatron-SP's reduce-scatters
and all-gathers (``sequence.tp_comm_time``), Ulysses' all-to-alls, context parallelism's K/V ring
sends or K/V all-gathers (``context.cp_time``), a MoE's expert all-to-alls
(``experts.dispatch_time_s``); per pipeline stage boundary: the sends and receives of
``AnalyticalModel.pipeline_message`` (and its receivers' tp all-gather); per layout change: the
relayout (``analytical.relayout_time``); the vocabulary-parallel embedding's, head's and loss's
collectives (``vocab.vocab_tp_comm_s``) and the tied embedding's sync between the pipeline's ends.

``expected_collectives`` is the same list as the executor runs it: the documented differences
(``ChargedCollective.difference``, docs/executor.md) replace or add rows explicitly."""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from cost_models import context, experts
from cost_models import sequence as seq
from cost_models.memory import GRAD_BYTES_PER_PARAM
from cost_models.ops import tp_collectives_per_pass
from cost_models.sequence import BYTES_PER_ACTIVATION
from cost_models.vocab import LOSS_ALLREDUCES
from specs import (CPComm, DPType, LayerSpec, LayerStrategy, ModelSpec, Plan, Recompute, SequenceParallel, split_ends,
                   stage_grid)


class Collective(StrEnum):
    """A collective kind (torch.distributed's names)."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"


class Part(StrEnum):
    """The share of a layer's states one sync group holds (cost_models.experts.sync_parts)."""

    DENSE = "dense"
    """Attention, norms, router and shared experts (the whole layer without an expert split)."""
    EXPERTS = "experts"
    """The routed experts, over their expert-data-parallel group."""
    MODEL_PARALLEL = "model_parallel"
    """Not states: the layer's activation traffic (tp, Megatron-SP, Ulysses, cp)."""
    PIPELINE = "pipeline"
    """Not states: the sends and receives across the stage boundary after the layer."""
    EXPERT_DISPATCH = "expert_dispatch"
    """Not states: a MoE layer's routed tokens, sent to their experts and back (all-to-alls over
    ep; as the executor runs them, its experts' tensor-parallel all-reduces too)."""
    RELAYOUT = "relayout"
    """Not states: the redistribution into the layer (the head's: index len(layers)) where the
    batch slices change between consecutive layers or the vocabulary's layout and a layer."""
    EMBEDDING = "embedding"
    """Not states: the vocabulary-parallel embedding's collectives (layer 0)."""
    HEAD = "head"
    """Not states: the vocabulary-parallel head's collectives (layer: the last)."""
    LOSS = "loss"
    """Not states: the vocabulary-parallel cross-entropy's all-reduces (layer: the last)."""
    TIED_EMBEDDING = "tied_embedding"
    """The tied word-embedding matrix's gradient, all-reduced between the first and the last
    stage (layer 0)."""


@dataclass(frozen=True, kw_only=True)
class ChargedCollective:
    """One kind of collective of one layer part, per rank and iteration."""

    layer: int
    part: Part
    op: Collective
    group_axes: tuple[str, ...]
    """The grid axes of the group (``dp``, ``cp``, ``ulysses``; ``edp`` for routed experts;
    ``tp``, ``ulysses``, ``cp`` or ``pp`` for model parallelism)."""
    group_size: int
    elements: float
    """Elements of the full buffer each call reduces or gathers on one rank (parameters of the
    part after tensor/expert parallelism; for model parallelism the activation: an all-reduce's
    or reduce-scatter's input, an all-gather's output, an all-to-all's send buffer, a send's or
    receive's tensor)."""
    calls: int
    """Calls per iteration."""
    difference: str = ""
    """Empty: the analytical model charges this row. Else (``expected_collectives``): which
    documented difference of the executor's (docs/executor.md) makes it run this row instead."""

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


# -- model parallelism (rows hold elements: the cost model's bytes / BYTES_PER_ACTIVATION) ------
def _row(i: int, op: Collective, axes: tuple[str, ...], size: int, elements: float, calls: int,
         part: "Part" = None, difference: str = "") -> ChargedCollective:
    return ChargedCollective(layer=i, part=part or Part.MODEL_PARALLEL, op=op, group_axes=axes, group_size=size,
                             elements=elements, calls=calls, difference=difference)


def tp_rows(i: int, layer: LayerSpec, s: LayerStrategy, micro_batches: int, mbs: int) -> list[ChargedCollective]:
    """Megatron tp: per pass (forward, backward, a recomputed forward that re-runs them) one
    all-reduce per sub-layer of the block's activation (its s / cp tokens); Megatron-SP a
    reduce-scatter and an all-gather instead, the reduce-scatters not re-run under selective-op
    (sequence.tp_comm_time). None under Ulysses (its all-to-alls replace them)."""
    if s.tp <= 1 or s.ulysses > 1:
        return []
    per_pass = tp_collectives_per_pass(layer) * micro_batches
    elements = seq.tp_message_bytes(layer, mbs) / BYTES_PER_ACTIVATION / s.cp
    if s.megatron_sp:
        return [_row(i, Collective.REDUCE_SCATTER, ("tp",), s.tp, elements, seq.reduce_scatter_passes(s) * per_pass),
                _row(i, Collective.ALL_GATHER, ("tp",), s.tp, elements, seq.forward_passes(s) * per_pass)]
    return [_row(i, Collective.ALL_REDUCE, ("tp",), s.tp, elements, seq.forward_passes(s) * per_pass)]


def ulysses_rows(i: int, layer: LayerSpec, s: LayerStrategy, micro_batches: int, mbs: int
                 ) -> list[ChargedCollective]:
    """Ulysses: per pass one all-to-all of Q, K and V and one of the attention output (the rank's
    s / (u cp) tokens; sequence.ulysses_message_bytes)."""
    if s.ulysses <= 1:
        return []
    calls = seq.forward_passes(s) * micro_batches
    return [_row(i, Collective.ALL_TO_ALL, ("ulysses",), s.ulysses, nbytes / BYTES_PER_ACTIVATION, calls)
            for nbytes in seq.ulysses_message_bytes(layer, s, mbs)]


def cp_sends(s: LayerStrategy, rerun: bool) -> int:
    """K/V-block sends of one rank per micro-batch on TransformerEngine's ring (context.cp_time):
    cp - 1 in forward (again in a recomputed core), two blocks (K/V and their gradients) on each
    of backward's cp - 1 steps, and the last dK/dV back to its owner."""
    return (s.cp - 1) * (2 if rerun else 1) + 2 * (s.cp - 1) + 1


def cp_rows(i: int, layer: LayerSpec, s: LayerStrategy, micro_batches: int, mbs: int) -> list[ChargedCollective]:
    """Context parallelism: the K/V ring's sends and receives of one K/V block
    (context.kv_block_bytes), or the all-gather variant's gathers of the whole sequence's K/V
    (forward, backward, a recomputed core) and the reduce-scatter of their gradients."""
    if s.cp <= 1:
        return []
    block = context.kv_block_bytes(layer, s, mbs) / BYTES_PER_ACTIVATION
    rerun = context.reruns_core(layer, s)
    if s.cp_comm == CPComm.ALL_GATHER:
        return [_row(i, Collective.ALL_GATHER, ("cp",), s.cp, s.cp * block, (3 if rerun else 2) * micro_batches),
                _row(i, Collective.REDUCE_SCATTER, ("cp",), s.cp, s.cp * block, micro_batches)]
    calls = cp_sends(s, rerun) * micro_batches
    return [_row(i, op, ("cp",), s.cp, block, calls) for op in (Collective.SEND, Collective.RECV)]


def pipeline_rows(model: ModelSpec, plan: Plan) -> list[ChargedCollective]:
    """Each stage boundary (after its last layer L, on every rank of both stages): per
    micro-batch one send and one receive (the activation forward, its gradient back; over the pp
    group, as cp's ring sends are over the cp group) of
    AnalyticalModel.pipeline_message: under tp or Ulysses each rank sends 1 / (tp u) of its s / cp
    tokens and the receivers all-gather the whole over tp (Megatron's scatter-gather; none under
    sequence parallelism). One model chunk per rank only (interleaved: none listed)."""
    if plan.pp <= 1 or plan.virtual_stages > 1:
        return []
    out = []
    for stage in plan.stage_ranges()[:-1]:
        i = stage[-1]
        layer, s = model.layers[i], plan.layers[i]
        m, mbs = plan.micro_batches, plan.micro_batch_size(i)
        whole = layer.output_elements(mbs) / s.cp
        split = s.tp * s.ulysses
        out += [_row(i, op, ("pp",), plan.pp, whole / split, m, Part.PIPELINE)
                for op in (Collective.SEND, Collective.RECV)]
        if split > 1 and not s.megatron_sp and s.ulysses == 1:
            out.append(_row(i, Collective.ALL_GATHER, ("tp",), s.tp, whole, 2 * m, Part.PIPELINE))
    return out


def expert_rows(i: int, layer: LayerSpec, s: LayerStrategy, micro_batches: int, mbs: int) -> list[ChargedCollective]:
    """A MoE layer split over ep > 1 ranks: per pass (forward, backward, a full recompute's
    forward) the dispatch and the combine all-to-all, each of the rank's send buffer
    (experts.dispatch_time_s: its tokens x the busiest rank's routed copies per token x hidden)."""
    if not experts.applies(layer, s) or s.ep <= 1:
        return []
    elements = experts.all_to_all_bytes(layer, s, mbs) / experts.BYTES_PER_ACTIVATION
    calls = experts.passes(s) * experts.ALL_TO_ALLS_PER_PASS * micro_batches
    return [_row(i, Collective.ALL_TO_ALL, ("ep",), s.ep, elements, calls, Part.EXPERT_DISPATCH)]


def _same_degrees(prev: LayerStrategy, nxt: LayerStrategy) -> bool:
    """Same sequence-and-tensor split and dp (the rank order may differ)."""
    return prev.degrees.split == nxt.degrees.split and prev.dp == nxt.dp


def relayout_rows(i: int, before: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy, micro_batches: int,
                  mbs: int) -> list[ChargedCollective]:
    """The relayout into layer ``i`` from a layer (``before``, micro-batch ``mbs`` per replica)
    run under ``prev`` (analytical.relayout_time, its batch-slice part): none where the slices
    stay; the same dp laid out otherwise a send and a receive of the activation per rank
    (forward and backward); a dp changed by r an all-gather over r ranks of the larger slice,
    in forward where dp shrinks, of the gradient in backward where it grows. (Its sequence
    part, a split that ends or starts there, is the layers' Difference.BLOCK_GATHER.)"""
    layout_matters = prev.degrees.split > 1 and prev.dp > 1
    if _same_degrees(prev, nxt) and (prev.tp_consecutive == nxt.tp_consecutive or not layout_matters):
        return []
    whole = before.output_elements(mbs)
    stage = ("stage",)
    if prev.dp == nxt.dp:
        gpus = prev.degrees.split * prev.dp
        return [_row(i, op, stage, gpus, whole, 2 * micro_batches, Part.RELAYOUT)
                for op in (Collective.SEND, Collective.RECV)]
    ratio = max(prev.dp, nxt.dp) // min(prev.dp, nxt.dp)
    gathered = whole * ratio if prev.dp > nxt.dp else whole
    return [_row(i, Collective.ALL_GATHER, stage, ratio, gathered, micro_batches, Part.RELAYOUT)]


def vocab_strategy(plan: Plan, per_stage: int) -> LayerStrategy:
    """The vocabulary's layout as a layer strategy (vocab.vocab_relayout_s's)."""
    return LayerStrategy(tp=plan.vocab_tp, dp=per_stage // plan.vocab_tp,
                         sp=plan.vocab_sp if plan.vocab_tp > 1 else SequenceParallel.NONE)


def _vocab_micro_batch(plan: Plan, per_stage: int) -> int:
    """Samples of one micro-batch on one rank of the vocabulary's layout (its vocab_tp ranks
    share a replica's samples; the stage's other ranks are its replicas)."""
    return plan.global_batch // (per_stage // plan.vocab_tp * plan.micro_batches)


def relayouts(model: ModelSpec, plan: Plan, world_size: int, *, chunk_starts: bool = False
              ) -> list[tuple[int, LayerSpec, LayerStrategy, LayerStrategy, int, int]]:
    """Every place the layout may change, as (index of the layer it feeds, the layer before,
    the strategy before, the one after, micro-batch per replica before and after): between
    consecutive layers of a chunk (``chunk_starts``: into each later chunk's first layer too),
    and where embedding and head run in the vocabulary's layout (Plan.vocab_in_own_layout) from
    the embedding and into the head."""
    starts = plan.chunk_starts() - ({0} if chunk_starts else set(range(len(plan.layers))))
    out = [(i, model.layers[i - 1], plan.layers[i - 1], plan.layers[i], plan.micro_batch_size(i - 1),
            plan.micro_batch_size(i)) for i in range(1, len(plan.layers)) if i not in starts]
    per_stage = world_size // plan.pp
    if plan.vocab_in_own_layout(model, per_stage):
        vocab, last = vocab_strategy(plan, per_stage), len(plan.layers) - 1
        mbs = _vocab_micro_batch(plan, per_stage)
        out = [(0, model.layers[0], vocab, plan.layers[0], mbs, plan.micro_batch_size(0))] + out \
            + [(last + 1, model.layers[last], plan.layers[last], vocab, plan.micro_batch_size(last), mbs)]
    return out


def vocab_rows(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """The vocabulary's tensor-parallel collectives (vocab.vocab_tp_comm_s; none at vocab_tp 1 or
    under Ulysses, whose group splits tokens), per micro-batch: the embedding's partial lookups
    all-reduced in forward, the head's input gradient all-reduced in backward (vocab_sp
    megatron: half a reduce-scatter and half an all-gather each, listed as the embedding's
    reduce-scatter and the head's all-gather) and the cross-entropy's three all-reduces of one
    fp32 per token."""
    per_stage = world_size // plan.pp
    if (plan.vocab_tp <= 1 or plan.vocab_sp == SequenceParallel.ULYSSES
            or not plan.vocab_in_own_layout(model, per_stage)):
        return []
    m, last = plan.micro_batches, len(plan.layers) - 1
    mbs = _vocab_micro_batch(plan, per_stage)
    tp, axes = plan.vocab_tp, ("vocab_tp",)
    megatron = plan.vocab_sp == SequenceParallel.MEGATRON
    out = []
    if model.embedding.kind == "token":
        op = Collective.REDUCE_SCATTER if megatron else Collective.ALL_REDUCE
        out.append(_row(0, op, axes, tp, mbs * model.seq_len * model.embedding.hidden_size, m, Part.EMBEDDING))
    if model.head.kind != "none":
        tokens = mbs * model.head.seq_len
        op = Collective.ALL_GATHER if megatron else Collective.ALL_REDUCE
        out += [_row(last, op, axes, tp, tokens * model.head.hidden_size, m, Part.HEAD),
                _row(last, Collective.ALL_REDUCE, axes, tp, tokens, LOSS_ALLREDUCES * m, Part.LOSS)]
    return out


def tied_embedding_rows(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """A tied head on a stage of its own: one all-reduce per iteration of the word-embedding
    gradient (its vocabulary rows on the rank) over each pair of first- and last-stage ranks
    (vocab._tied_embedding_sync_s)."""
    if not model.head.tied_lm or plan.head_stage == 0:
        return []
    per_stage = world_size // plan.pp
    rows = plan.padded_vocab_size(model.head.output_size) / plan.vocab_degrees(per_stage).tp
    return [ChargedCollective(layer=0, part=Part.TIED_EMBEDDING, op=Collective.ALL_REDUCE, group_axes=("pp",),
                              group_size=2, elements=rows * model.head.hidden_size, calls=1)]


def charged_mp_collectives(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """Every layer's charged model-parallel collectives (its expert all-to-alls too), every
    relayout's, the vocabulary's and every stage boundary's sends."""
    out = []
    for i, (layer, s) in enumerate(zip(model.layers, plan.layers)):
        for rows in (tp_rows, ulysses_rows, cp_rows, expert_rows):
            out += rows(i, layer, s, plan.micro_batches, plan.micro_batch_size(i))
    for i, before, prev, nxt, mbs, _ in relayouts(model, plan, world_size):
        out += relayout_rows(i, before, prev, nxt, plan.micro_batches, mbs)
    return out + vocab_rows(model, plan, world_size) + pipeline_rows(model, plan)


def charged_collectives(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """Every collective the analytical model charges: data-parallel rows (the tied embedding's
    sync too) and model-parallel rows."""
    return (charged_dp_collectives(model, plan, world_size) + tied_embedding_rows(model, plan, world_size)
            + charged_mp_collectives(model, plan, world_size))


# -- the executor's documented differences (docs/executor.md, "Collectives") -----------------
class Difference(StrEnum):
    """Why the executor runs a row the cost model charges otherwise."""

    BLOCK_GATHER = "sequence gathered where the split ends"
    """A Megatron-SP, Ulysses or cp block hands its output on split into a next block of the
    same chunk that splits the same way (specs.keeps_sequence_split), as Megatron keeps the
    residual stream; elsewhere (before the head, a relayout, another split, a pipeline send) it
    all-gathers its output over the split group in forward (again in a full recompute's under cp),
    and where it does not take its input split it all-gathers that input's gradient in backward.
    The cost model charges a gather only where the split changes (relayout_time), not these."""
    SP_NORM_GRADS = "SP norm gradients all-reduced"
    """Megatron-SP's replicated norm weights get partial gradients: the executor (DTensor)
    all-reduces each norm parameter's gradient over tp once per iteration, as Megatron does
    (finalize_model_grads); the cost model does not charge it."""
    CP_RING_KEEPS_KV = "cp ring keeps the K/V blocks"
    """The executor's ring keeps every K/V block it received for backward (autograd saves them),
    so backward sends only the dK/dV blocks back, cp - 1 per micro-batch; TransformerEngine's
    ring (charged) sends K/V again with them and returns the last dK/dV: 3 (cp - 1) + 1. The
    executor's ring is the attention core, so selective recomputation re-runs it whether or not
    the model's core is fused (the cost model: unfused only)."""
    CP_GATHER_KEEPS_KV = "cp all-gather keeps the gathered K/V"
    """The all-gather variant's gathered K/V are saved for backward, not gathered again."""
    GQA_REPEATED = "K/V repeated to the query heads"
    """Grouped-query attention: the executor repeats K and V to the query heads before the
    attention core, so Ulysses' QKV all-to-all and cp's K/V blocks carry q_width-wide K and V
    (the cost model: kv_width)."""
    RECOMPUTE_EARLY_STOP = "full recompute stops at the last saved tensor"
    """torch's non-reentrant checkpoint stops the recomputed forward once backward has every
    tensor it saved: the block's trailing collectives (tp's last all-reduce or Megatron-SP's
    last reduce-scatter, and the block's output gather) do not run again; Megatron (charged)
    re-runs the whole forward. One call fewer per micro-batch each. The same cut applies to
    selective-op's recomputed forward (its last all-reduce; it re-runs no reduce-scatter)."""
    EXPERTS_ROUTED_ROWS = "the experts all-reduce their routed rows over tp"
    """A MoE layer under tp: its experts' f and g all-reduce the rows routed to them (top_k
    copies of each token; under ep the rows received, which vary with the routing: compared as
    the ranks' total) in forward (again in a full recompute) and backward, on the layer's
    experts part; the layer's tp rows keep the attention sub-layer's half. The cost model
    charges the MLP's half as a dense MLP's (one copy per token)."""
    EXPERTS_KEPT_ROWS = "the dispatch sends the kept rows"
    """The executor's all-to-alls send the routed rows as they are (the ranks' total is the
    tokens' top_k copies), not padded to the busiest expert's capacity."""
    EXPERT_BUCKET = "routed experts reduced in their own bucket"
    """A MoE layer without an expert split: the executor keeps its routed experts in their own
    data-parallel bucket (as Megatron-Core's expert-data-parallel buffers do at ep 1 too), so the
    layer's collectives run twice, once per part, over the same group; the cost model charges
    them once for the whole layer (the same elements, one launch fewer)."""
    RELAYOUT_WHOLE_STAGE = "relayout gathers every slice over the stage"
    """Where the batch slices change, the executor's relayout (executor.parallel.relayout)
    all-gathers every rank's slice over the whole stage and keeps its own, in forward (the
    activation) and backward (its gradient), one each per micro-batch, also into the next
    chunk's first layer before the pipeline send; the cost model charges one all-gather over
    the ratio's ranks in one direction (or a send and a receive), and none at a chunk start."""
    VOCAB_SP_BOTH_PASSES = "vocabulary Megatron-SP collectives in both passes"
    """vocab_sp megatron: the embedding reduce-scatters its partial lookups (all-gathers their
    gradient in backward) and gathers the sequence back for the first layer; the head scatters
    it (gathering the gradient in backward) and all-gathers before its vocabulary-parallel
    matmul (reduce-scattering the gradient). The cost model charges half a reduce-scatter and
    half an all-gather at each end."""
    VOCAB_ULYSSES_GATHERS = "vocabulary Ulysses gathers the sequence"
    """vocab_sp ulysses: the embedding's token shares are all-gathered for the first layer, the
    head's input gradient shares in backward (the layers take whole sequences); not charged."""
    TIED_ONE_GROUP = "the tied matrix is reduced once over every holder"
    """The executor keeps the tied matrix in its own bucket and all-reduces its gradient once
    per iteration over every rank of both ends holding the same rows (the ends' data-parallel
    replicas and tp copies in one group); the cost model charges the all-reduce between rank
    pairs of the two ends and the matrix's data-parallel sync on each end (in its dp type,
    as part of the embedding's and head's states). On one stage it is the embedding's
    data-parallel sync of the matrix."""
    PIPELINE_WHOLE = "pipeline sends the whole activation"
    """Every rank of a stage sends its whole (replicated, whole-sequence) activation to its peer;
    no scatter-gather over tp, no sequence split at the boundary."""


def _norm_params(layer: LayerSpec) -> int:
    """Norm parameter tensors of one block (weight, and bias under layernorm; four norms with
    Gemma-2's sandwich norms)."""
    return (4 if layer.sandwich_norm else 2) * (2 if layer.norm == "layernorm" else 1)


def executed_mp_rows(i: int, layer: LayerSpec, s: LayerStrategy, micro_batches: int, mbs: int, *,
                     split_in: bool = False, split_out: bool = False) -> list[ChargedCollective]:
    """Layer ``i``'s model-parallel rows as the executor runs them; ``split_in``/``split_out``: its
    input arrives, its output leaves sequence-split (specs.keeps_sequence_split: no gathers)."""
    full = s.recompute == Recompute.FULL
    if layer.moe is not None:  # the attention's half; the MoE's last collective re-runs
        rows = [replace(row, calls=row.calls // 2, difference=Difference.EXPERTS_ROUTED_ROWS)
                for row in tp_rows(i, layer, s, micro_batches, mbs)]
    else:
        rows = [_early_stopped(row, micro_batches) if _stops_early(row, s) else row
                for row in tp_rows(i, layer, s, micro_batches, mbs)]
    rows += _repeated_kv(ulysses_rows(i, layer, s, micro_batches, mbs), layer)
    whole = layer.output_elements(mbs)
    for axis, size in (("tp", s.tp if s.megatron_sp else 1), ("ulysses", s.ulysses), ("cp", s.cp)):
        # forward's output and backward's input gradient, where not handed on split; a full
        # recompute stops before the output's gather, except cp's (a saved index of its
        # reordering comes after it)
        gathers = (0 if split_out else 2 if full and axis == "cp" else 1) + (0 if split_in else 1)
        if size > 1 and gathers:
            inner = whole / s.cp if axis != "cp" else whole
            rows.append(_row(i, Collective.ALL_GATHER, (axis,), size, inner, gathers * micro_batches,
                             difference=Difference.BLOCK_GATHER))
    if s.megatron_sp and s.tp > 1 and s.ulysses == 1:
        rows.append(_row(i, Collective.ALL_REDUCE, ("tp",), s.tp, layer.hidden_size,
                         _norm_params(layer), difference=Difference.SP_NORM_GRADS))
    if s.cp > 1:
        block = 2 * mbs * layer.seq_len / s.cp * layer.q_width / (s.tp * s.ulysses)  # K and V as wide as Q
        charged = context.kv_block_bytes(layer, s, mbs) / BYTES_PER_ACTIVATION
        gqa = "" if block == charged else f" ({Difference.GQA_REPEATED})"
        forwards = 1 if s.recompute == Recompute.NONE else 2  # a recomputed core re-runs the ring
        if s.cp_comm == CPComm.ALL_GATHER:
            rows += [_row(i, Collective.ALL_GATHER, ("cp",), s.cp, s.cp * block, forwards * micro_batches,
                          difference=Difference.CP_GATHER_KEEPS_KV + gqa),
                     _row(i, Collective.REDUCE_SCATTER, ("cp",), s.cp, s.cp * block, micro_batches,
                          difference=gqa.strip(" ()"))]
        else:
            calls = (s.cp - 1) * (forwards + 1) * micro_batches
            rows += [_row(i, op, ("cp",), s.cp, block, calls, difference=Difference.CP_RING_KEEPS_KV + gqa)
                     for op in (Collective.SEND, Collective.RECV)]
    return rows


def executed_expert_rows(i: int, layer: LayerSpec, s: LayerStrategy, micro_batches: int, mbs: int
                         ) -> list[ChargedCollective]:
    """A MoE layer's experts part as the executor runs it: the dispatch and combine all-to-alls
    of the routed rows (Difference.EXPERTS_KEPT_ROWS), and under tp its experts' all-reduces of
    them (Difference.EXPERTS_ROUTED_ROWS). Routed rows are compared as the ranks' total."""
    if layer.moe is None:
        return []
    routed = experts.dispatch_tokens(layer, s, mbs) * layer.moe.top_k * layer.hidden_size
    rows = [row if row.elements == routed else replace(row, elements=routed, difference=Difference.EXPERTS_KEPT_ROWS)
            for row in expert_rows(i, layer, s, micro_batches, mbs)]
    if s.tp > 1:
        rows.append(_row(i, Collective.ALL_REDUCE, ("tp",), s.tp, routed, seq.forward_passes(s) * micro_batches,
                         Part.EXPERT_DISPATCH, Difference.EXPERTS_ROUTED_ROWS))
    return rows


def _slices(s: LayerStrategy) -> tuple[int, ...]:
    """The batch slice of each rank of a stage laid out as ``s`` (executor.parallel.layout.Layout)."""
    gpus = s.degrees.split * s.dp
    grid = stage_grid(0, gpus, s.degrees.split, s.tp_consecutive)
    return tuple(grid.coords(j)["dp"] for j in range(gpus))


def executed_relayout_rows(i: int, before: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy, micro_batches: int,
                           mbs_prev: int, mbs_next: int) -> list[ChargedCollective]:
    """The executor's relayout into layer ``i`` where the slices change
    (Difference.RELAYOUT_WHOLE_STAGE): per micro-batch an all-gather over the stage of the
    activation in forward and of its gradient in backward."""
    if prev.dp == nxt.dp and _slices(prev) == _slices(nxt):
        return []
    gpus = prev.degrees.split * prev.dp
    return [_row(i, Collective.ALL_GATHER, ("stage",), gpus, gpus * before.output_elements(mbs), micro_batches,
                 Part.RELAYOUT, Difference.RELAYOUT_WHOLE_STAGE) for mbs in (mbs_prev, mbs_next)]


def executed_vocab_rows(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """The vocabulary's collectives as the executor runs them (executor.parallel.vocab): as
    charged without sequence parallelism; Difference.VOCAB_SP_BOTH_PASSES and
    VOCAB_ULYSSES_GATHERS under vocab_sp."""
    per_stage = world_size // plan.pp
    if plan.vocab_tp <= 1 or not plan.vocab_relaid_out(model, per_stage) or plan.vocab_sp == SequenceParallel.NONE:
        return vocab_rows(model, plan, world_size)
    m, last = plan.micro_batches, len(plan.layers) - 1
    mbs = _vocab_micro_batch(plan, per_stage)
    embedded = mbs * model.seq_len * model.embedding.hidden_size
    headed = mbs * model.head.seq_len * model.head.hidden_size
    tp, axes = plan.vocab_tp, ("vocab_tp",)
    if plan.vocab_sp == SequenceParallel.ULYSSES:
        return [_row(j, Collective.ALL_GATHER, axes, tp, elements, m, part, Difference.VOCAB_ULYSSES_GATHERS)
                for j, elements, part in ((0, embedded, Part.EMBEDDING), (last, headed, Part.HEAD))]
    why = Difference.VOCAB_SP_BOTH_PASSES
    return [_row(0, Collective.REDUCE_SCATTER, axes, tp, embedded, m, Part.EMBEDDING, why),
            _row(0, Collective.ALL_GATHER, axes, tp, embedded, 2 * m, Part.EMBEDDING, why),
            _row(last, Collective.ALL_GATHER, axes, tp, headed, 2 * m, Part.HEAD, why),
            _row(last, Collective.REDUCE_SCATTER, axes, tp, headed, m, Part.HEAD, why)] \
        + [row for row in vocab_rows(model, plan, world_size) if row.part == Part.LOSS]


def executed_tied_rows(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """The executor's tied-matrix all-reduce (Difference.TIED_ONE_GROUP where it differs): over
    every rank of both ends holding the same rows, of the rows it holds, once per iteration."""
    if not (model.head.tied_lm and model.embedding.kind == "token"
            and model.embedding.vocab_size == model.head.output_size):
        return []
    per_stage = world_size // plan.pp
    holders, rows = len({0, plan.head_stage}) * per_stage, model.embedding.vocab_size
    if plan.vocab_relaid_out(model, per_stage):
        rows = plan.padded_vocab_size(rows)
        if plan.vocab_tp > 1 and plan.vocab_sp != SequenceParallel.ULYSSES:
            holders, rows = holders // plan.vocab_tp, rows // plan.vocab_tp
    if holders <= 1:
        return []
    row = ChargedCollective(layer=0, part=Part.TIED_EMBEDDING, op=Collective.ALL_REDUCE, group_axes=("pp", "dp"),
                            group_size=holders, elements=rows * model.head.hidden_size, calls=1)
    charged = tied_embedding_rows(model, plan, world_size)
    same = charged and (charged[0].group_size, charged[0].elements) == (row.group_size, row.elements)
    return [row if same else replace(row, difference=Difference.TIED_ONE_GROUP)]


def _stops_early(row: ChargedCollective, s: LayerStrategy) -> bool:
    """Whether torch's early stop cuts the recomputed forward's last call of the tp ``row``: the
    block's last all-reduce (full, selective-op) or reduce-scatter (full; selective-op keeps the
    reduce-scatters' results, so none is re-run)."""
    if not s.recompute.reruns_forward_collectives:
        return False
    return row.op == Collective.ALL_REDUCE or (s.recompute == Recompute.FULL and row.op == Collective.REDUCE_SCATTER)


def _early_stopped(row: ChargedCollective, micro_batches: int) -> ChargedCollective:
    """A tp row without the recomputed forward's last call per micro-batch."""
    return replace(row, calls=row.calls - micro_batches, difference=Difference.RECOMPUTE_EARLY_STOP)


def _repeated_kv(rows: list[ChargedCollective], layer: LayerSpec) -> list[ChargedCollective]:
    """Ulysses' rows (QKV all-to-all, output all-to-all) with K and V as wide as Q."""
    if not rows or layer.kv_width == layer.q_width:
        return rows
    qkv, out = rows
    return [replace(qkv, elements=3 * out.elements, difference=Difference.GQA_REPEATED), out]


def _executed_pipeline(model: ModelSpec, plan: Plan) -> list[ChargedCollective]:
    out = []
    for row in pipeline_rows(model, plan):
        if row.op == Collective.ALL_GATHER:
            continue
        whole = model.layers[row.layer].output_elements(plan.micro_batch_size(row.layer))
        out.append(row if whole == row.elements else
                   replace(row, elements=whole, difference=Difference.PIPELINE_WHOLE))
    return out


def expected_collectives(model: ModelSpec, plan: Plan, world_size: int) -> list[ChargedCollective]:
    """``charged_collectives`` as the executor runs them: the rows of its documented differences
    (``difference`` set) in place of the charged ones they replace, and added where it runs
    what the cost model does not charge."""
    out = [row for dp_row in charged_dp_collectives(model, plan, world_size)
           for row in _executed_dp_rows(dp_row, model.layers[dp_row.layer], plan.layers[dp_row.layer])]
    out += executed_tied_rows(model, plan, world_size)
    m = plan.micro_batches
    for i, (layer, s, (split_in, split_out)) in enumerate(zip(model.layers, plan.layers, split_ends(model, plan))):
        out += executed_mp_rows(i, layer, s, m, plan.micro_batch_size(i), split_in=split_in, split_out=split_out)
        out += executed_expert_rows(i, layer, s, m, plan.micro_batch_size(i))
    per_stage = world_size // plan.pp
    for i, before, prev, nxt, mbs_prev, mbs_next in relayouts(model, plan, world_size, chunk_starts=True):
        if (i == 0 or i == len(plan.layers)) and not plan.vocab_relaid_out(model, per_stage):
            continue
        out += executed_relayout_rows(i, before, prev, nxt, m, mbs_prev, mbs_next)
    return out + executed_vocab_rows(model, plan, world_size) + _executed_pipeline(model, plan)


def _executed_dp_rows(row: ChargedCollective, layer: LayerSpec, s: LayerStrategy) -> list[ChargedCollective]:
    """A data-parallel row as the executor runs it: split into its dense and routed-expert parts
    for a MoE layer without an expert split (Difference.EXPERT_BUCKET), else itself."""
    if layer.moe is None or experts.applies(layer, s):
        return [row]
    expert = row.elements * experts.expert_params(layer) / layer.param_count()
    return [replace(row, elements=row.elements - expert, difference=Difference.EXPERT_BUCKET),
            replace(row, part=Part.EXPERTS, group_axes=("edp",), elements=expert, difference=Difference.EXPERT_BUCKET)]
