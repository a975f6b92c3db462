"""What each pipeline stage does in one iteration: per-layer compute, collectives and memory.

Times and byte sizes come from a cost model (LayerTime compute, layer_memory categories);
communication volumes come from the layer shapes (Megatron tensor parallelism: two
all-reduces of the layer's activation per forward, two per backward, two more when the
forward is recomputed), so the simulator can play them out over the links itself.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models import CostModel, LayerTime, MemoryBreakdown
from cost_models import context, experts, fp8
from cost_models.memory import WEIGHT_BYTES_PER_PARAM
from cost_models.base import BYTES_PER_ACTIVATION, PipelineMessage
from cost_models.ops import tp_collectives_per_pass
from cost_models.sequence import forward_gather_bytes, sync_groups, ulysses_message_bytes
from cost_models.tp_overlap import OverlapPair
from specs import (ClusterSpec, CPLoadBalance, DPType, EPDispatcher, LayerSpec, LayerStrategy, ModelSpec, Plan, Recompute,
                   layer_grid, stage_grid)
from specs.precision import Precision
from specs.schedules import schedule_entry

GRAD_BYTES_PER_PARAM = 2
"""Gradients are reduced in 16-bit (the 2 of the ZeRO paper's 2 + 2 + 12)."""


@dataclass(frozen=True, kw_only=True)
class SyncWork:
    """States of a layer that one set of groups keeps in sync: the whole layer, or (with an
    expert split) its dense part over dp and its routed experts over the expert-dp groups."""

    name: str
    grad_bytes: float
    """TP-local (expert-local) 16-bit gradient the groups synchronise; 0 when not synced."""
    dp_groups: tuple[tuple[int, ...], ...]
    dp_type: DPType
    gathered_bytes: float = 0.0
    """ZeRO-3: this part's parameters while they are gathered."""


@dataclass(frozen=True, kw_only=True)
class LayerWork:
    """One layer on one stage, for one micro-batch (times) or the iteration (states)."""

    index: int
    """Layer index in the model."""
    forward_s: float
    backward_s: float
    """Includes the recomputed forward when checkpointed (as LayerTime has it)."""
    weight_grad_s: float
    """The weight-gradient part of backward_s: a W op under a schedule that splits the backward."""
    update_s: float
    strategy: LayerStrategy
    tp_groups: tuple[tuple[int, ...], ...]
    dp_groups: tuple[tuple[int, ...], ...]
    tp_calls: tuple[tuple[str, float, int], ...]
    """TP-group collectives of one forward pass as (kind, bytes on the wire, count): Megatron TP two
    all-reduces of the activation, Megatron-SP a reduce-scatter and an all-gather each instead,
    Ulysses the QKV and output all-to-alls."""
    tp_backward_calls: tuple[tuple[str, float, int], ...]
    """The backward pass's, as many: tp_calls' but for an FP8 layer's Megatron-SP all-gathers, which
    carry BF16 gradients there (sequence.forward_gather_bytes)."""
    tp_recompute_calls: tuple[tuple[str, float, int], ...]
    """A recomputed forward's, run in backward (tp_recompute_calls)."""
    states: MemoryBreakdown
    """Parameters, gradients, optimizer states held all iteration."""
    activation_bytes: float
    """Stashed per micro-batch until its backward."""
    kept_for_w_bytes: float
    """Under a split backward, what a micro-batch's B keeps until its W (the cost model's
    ``weight_wait_bytes``; 0 otherwise)."""
    recompute_bytes: float
    """Activations rebuilt during the backward of a recomputed layer (temporary): all of them
    under full recomputation, what it did not keep under selective and selective-op."""
    gathered_bytes: float
    """ZeRO-3: the layer's full (TP-local) parameters while they are gathered (all parts)."""
    temporary_bytes: float
    """Other buffers live while the layer runs (communication buckets)."""
    transition_s: float = 0.0
    """Re-layout after this layer when the next one differs (forward + backward), from the cost model."""
    parts: tuple[SyncWork, ...] = ()
    """What gradient sync and ZeRO gathers run over: one part (the layer), or the dense part and
    the routed experts under an expert split."""
    ep_groups: tuple[tuple[int, ...], ...] = ()
    ep_calls: tuple[tuple[str, float, int], ...] = ()
    """Expert all-to-alls of one forward pass (dispatch and combine; bytes on the wire) over ``ep_groups``; as many
    in backward, again in a recompute that re-runs the forward's collectives (full, selective-op)."""
    cp: "CPWork | None" = None
    """Context parallelism's attention, played block by block (None without cp)."""
    tp_overlap: tuple[OverlapPair, ...] = ()
    """Under the plan's tp_comm_overlap: the TP collectives played beside the chunks of the GEMMs
    they pair with (the cost model's LayerTime.tp_overlap; of ``tp_calls``, the rest stay on the
    critical path); empty otherwise."""

    @property
    def name(self) -> str:
        return f"L{self.index}"


@dataclass(frozen=True, kw_only=True)
class CPWork:
    """A layer's context-parallel attention: the K/V exchange beside the blockwise core."""

    comm: str
    """The K/V exchange (CPComm): p2p and a2a+p2p run the ring, all_gather gathers."""
    cp: int
    groups: tuple[tuple[int, ...], ...]
    """The stage's cp groups (ring order)."""
    block_bytes: float
    """One rank's K/V block on the wire (cost_models.context.kv_block_bytes, CostModel.wire_scale)."""
    core_fwd_s: float
    """The attention core's part of the layer's forward_s (each block plays 1 / cp of it)."""
    core_bwd_s: float
    """Its part of backward_s (a recomputed forward's core is core_fwd_s again)."""
    rerun: bool = False
    """Backward re-runs the core's forward, and its exchange (context.reruns_core)."""
    block_scale: float = 1.0
    """Each block's compute on the critical path over its balanced share: (2 cp - 1) / cp for a
    causal layer on contiguous chunks (cp_load_balance none), else 1."""

    @property
    def ring_pairs(self) -> tuple[tuple[int, int], ...]:
        """Every rank's send to the next rank of its ring, all groups at once."""
        return tuple((g[i], g[(i + 1) % len(g)]) for g in self.groups for i in range(len(g)))


@dataclass(frozen=True, kw_only=True)
class StageWork:
    """Everything one pipeline stage runs in an iteration."""

    stage: int
    ranks: tuple[int, ...]
    layers: tuple[LayerWork, ...]
    vocab: LayerTime
    """Embedding (first stage) and head + loss (last stage) compute, from the cost model."""
    vocab_memory: MemoryBreakdown
    vocab_groups: tuple[tuple[int, ...], ...]
    """Data-parallel groups of the vocabulary layers (replicas of the vocab_tp shards)."""
    chunks: tuple["ChunkWork", ...]
    """The stage's model chunks in order (one without interleaving)."""
    runtime_overhead_bytes: float
    vocab_grad_bytes: float = 0.0
    """Embedding/head gradient that data parallelism synchronises (16-bit, TP-local)."""
    tied_grad_bytes: float = 0.0
    """Tied word-embedding gradient all-reduced between the first and last stage (pp > 1)."""
    tied_groups: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, kw_only=True)
class ChunkWork:
    """One model chunk of a stage: which of its layers, and what crosses its two ends."""

    index: int
    """Global chunk index j (the schedule places it: stage j % pp, or V-shaped)."""
    positions: tuple[int, ...]
    """Positions in StageWork.layers."""
    output_message: PipelineMessage | None
    """How the chunk's output goes to chunk j + 1 per micro-batch, and its gradient comes back
    (the cost model's pipeline_message; None for the last chunk)."""
    input_message: PipelineMessage | None
    """How its input comes from chunk j - 1, and its gradient goes back (None for the first)."""


def build_stages(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost_model: CostModel) -> list[StageWork]:
    """One StageWork per pipeline stage of ``plan``."""
    world = cluster.world_size
    per_stage = world // plan.pp
    stages = []
    chunk_ranges = plan.chunk_ranges()
    for stage, layer_ids in enumerate(plan.stage_ranges()):
        layer_ids = list(layer_ids)
        first = plan.stage_first_rank(stage, world)
        ranks = tuple(range(first, first + per_stage))
        ends = {r[-1] for r in chunk_ranges if r}
        layers = tuple(_layer_work(model, plan, cost_model, i, first, i in ends) for i in layer_ids)
        vocab_time, vocab_mem = cost_model.vocab_cost(model, plan, stage, world)
        vocab_dp = per_stage // plan.vocab_tp
        vocab_groups = stage_grid(first, per_stage, plan.vocab_tp).groups("dp")
        tied_bytes, tied_groups = _tied(model, plan, stage, world, cost_model.wire_scale) if vocab_mem.gradients_bytes > 0 else (0.0, ())
        stages.append(StageWork(stage=stage, ranks=ranks, layers=layers, vocab=vocab_time,
                                vocab_memory=vocab_mem, vocab_groups=_tuples(vocab_groups),
                                chunks=_chunks(model, plan, cost_model, chunk_ranges, stage, layer_ids),
                                runtime_overhead_bytes=cost_model.runtime_overhead_bytes,
                                # sizes from the shapes; none if the cost model gives the vocab no gradients
                                vocab_grad_bytes=_vocab_params(model, plan, stage) / plan.vocab_tp * GRAD_BYTES_PER_PARAM
                                * cost_model.wire_scale if vocab_dp > 1 and vocab_mem.gradients_bytes > 0 else 0.0,
                                tied_grad_bytes=tied_bytes, tied_groups=tied_groups))
    return stages


def _chunks(model: ModelSpec, plan: Plan, cm: CostModel, chunk_ranges: list, stage: int, layer_ids: list[int]) -> tuple:
    """The stage's chunks (global indices, as the schedule places them) with their boundary messages."""
    last_chunk = len(chunk_ranges) - 1

    def message(j: int) -> PipelineMessage:  # what crosses from chunk j to chunk j + 1
        i = plan.boundary_layer(j)
        return _on_wire(cm.pipeline_message(model.layers[i], plan.layers[i], plan.micro_batch_size(i)), cm.wire_scale)
    out = []
    for j in plan.stage_chunks(stage):
        out.append(ChunkWork(index=j, positions=tuple(layer_ids.index(i) for i in chunk_ranges[j]),
                             output_message=message(j) if j < last_chunk else None,
                             input_message=message(j - 1) if j > 0 else None))
    return tuple(out)


def _on_wire(message: PipelineMessage, wire_scale: float) -> PipelineMessage:
    """``message`` in the bytes the links carry (CostModel.wire_scale: the formulas count 16-bit
    activations)."""
    return replace(message, send_bytes=message.send_bytes * wire_scale,
                   gather_bytes=message.gather_bytes * wire_scale)


def _vocab_params(model: ModelSpec, plan: Plan, stage: int) -> float:
    """Embedding parameters on the first stage, head parameters on the last (a tied head on
    its own stage keeps a copy of the embedding matrix, as Megatron does)."""
    params = model.embedding.param_count() if stage == 0 else 0
    if stage == plan.head_stage and model.head.kind != "none":
        params += model.head.param_count()
        if model.head.tied_lm and plan.head_stage != 0:
            params += model.head.hidden_size * model.head.output_size
    return float(params)


def _tied(model: ModelSpec, plan: Plan, stage: int, world: int, wire_scale: float) -> tuple[float, tuple]:
    """Bytes (on the wire: ``wire_scale``, CostModel.wire_scale) and rank pairs of the
    tied-embedding gradient all-reduce (first and last stage)."""
    if plan.head_stage == 0 or not model.head.tied_lm or stage not in (0, plan.head_stage):
        return 0.0, ()
    per_stage = world // plan.pp
    first, last = plan.stage_first_rank(0, world), plan.stage_first_rank(plan.head_stage, world)
    nbytes = model.head.hidden_size * model.head.output_size / plan.vocab_tp * GRAD_BYTES_PER_PARAM * wire_scale
    return float(nbytes), tuple((first + i, last + i) for i in range(per_stage))


def _kept_for_w_bytes(model: ModelSpec, plan: Plan, cm: CostModel, i: int) -> float:
    """What layer i's B keeps until its W: the cost model's weight_wait_bytes under a split
    backward, none in the pipeline's first chunk (its whole backward runs at W:
    PipelineSchedule.held_points) nor without a split backward."""
    if not schedule_entry(plan.schedule).splits_backward or i in plan.chunk_ranges()[0]:
        return 0.0
    return cm.weight_wait_bytes(model.layers[i], plan.layers[i], plan.micro_batch_size(i))


def _layer_work(model: ModelSpec, plan: Plan, cm: CostModel, i: int, first_rank: int, last_of_stage: bool) -> LayerWork:
    layer, s, mbs = model.layers[i], plan.layers[i], plan.micro_batch_size(i)
    lt = cm.layer_time(layer, s, mbs, plan.micro_batches, first_rank)
    one = cm.layer_memory(layer, s, mbs, 1)
    # the BF16 weights, unsharded: FP8 copies are not states to gather (fp8.weight_copy_bytes)
    unsharded = cm.layer_memory(layer, replace(s, dp_type=DPType.DDP, expert_dp_type=None,
                                               precision=Precision.BF16), mbs, 1)
    # the recomputed forward rebuilds what the layer did not keep while its backward runs
    # (everything under full recomputation, what it did not keep under the selective ones)
    full_act = 0.0
    if s.recompute != "none":
        full_act = cm.layer_memory(layer, replace(s, recompute="none"), mbs, 1).activations_bytes
        full_act -= 0.0 if s.checkpoint else one.activations_bytes
    tp_groups, dp_groups = sync_groups(first_rank, s)
    transition = 0.0
    if not last_of_stage:
        transition = cm.transition_time(layer, s, plan.layers[i + 1], mbs, first_rank)
    parts = _sync_parts(f"L{i}", layer, s, first_rank, dp_groups, unsharded)
    gathered = sum(p.gathered_bytes for p in parts)
    ep_groups, ep_calls = _expert_calls(cm, layer, s, mbs, first_rank, plan.ep_dispatcher)
    cp = None
    if s.cp > 1:
        scale = context.imbalance(layer, s.cp) if plan.cp_load_balance == CPLoadBalance.NONE else 1.0
        cp = CPWork(comm=s.cp_comm, cp=s.cp, groups=_tuples(context.cp_groups(first_rank, s)),
                    block_bytes=context.kv_block_bytes(layer, s, mbs) * cm.wire_scale, core_fwd_s=lt.cp_core_fwd_s,
                    core_bwd_s=lt.cp_core_bwd_s, rerun=context.reruns_core(layer, s), block_scale=scale)
    return LayerWork(
        index=i, forward_s=lt.forward_s, backward_s=lt.backward_s, weight_grad_s=lt.weight_grad_s, update_s=lt.update_s,
        strategy=s, cp=cp,
        tp_groups=_tuples(tp_groups), dp_groups=_tuples(dp_groups),
        tp_calls=_calls_on_wire(cm, tp_calls(layer, s, mbs)),
        tp_backward_calls=_calls_on_wire(cm, tp_calls(layer, s, mbs, backward=True)),
        tp_recompute_calls=_calls_on_wire(cm, tp_recompute_calls(layer, s, mbs)),
        states=MemoryBreakdown(parameters_bytes=one.parameters_bytes, gradients_bytes=one.gradients_bytes,
                               optimizer_bytes=one.optimizer_bytes),
        activation_bytes=one.activations_bytes, recompute_bytes=full_act,
        kept_for_w_bytes=_kept_for_w_bytes(model, plan, cm, i),
        gathered_bytes=gathered, temporary_bytes=max(0.0, one.temporary_bytes - gathered - full_act),
        transition_s=transition, parts=parts, ep_groups=ep_groups, ep_calls=ep_calls,
        tp_overlap=lt.tp_overlap if plan.tp_comm_overlap else ())


def _sync_parts(name: str, layer: LayerSpec, s: LayerStrategy, first_rank: int, dp_groups,
                unsharded: MemoryBreakdown) -> tuple[SyncWork, ...]:
    """The layer's sync parts (experts.sync_parts) with the cost model's unsharded gradient and
    parameter bytes shared out by their parameter counts."""
    parts = experts.sync_parts(layer, s, first_rank, dp_groups)
    total = sum(p.params for p in parts) or 1.0
    gather = fp8.gather_bytes_per_param(s.precision) / WEIGHT_BYTES_PER_PARAM  # FP8 layers gather FP8
    out = []
    for part, suffix in zip(parts, ("", " experts")):
        share = part.params / total
        synced = part.size > 1
        out.append(SyncWork(name=name + suffix, grad_bytes=unsharded.gradients_bytes * share if synced else 0.0,
                            dp_groups=_tuples(part.groups), dp_type=part.dp_type,
                            gathered_bytes=unsharded.parameters_bytes * share * gather
                            if part.dp_type == DPType.ZERO3 and synced else 0.0))
    return tuple(out)


def _expert_calls(cm: CostModel, layer: LayerSpec, s: LayerStrategy, mbs: int, first_rank: int,
                  dispatcher: EPDispatcher = EPDispatcher.ALL_TO_ALL):
    """(ep groups, forward all-to-alls) of a MoE layer whose experts are split over ep > 1 ranks;
    under DeepEP the leg the cost model finds binding (experts.deepep_leg: the rail groups' network
    all-to-all or the NVLink one inside each domain), the other running beneath it on other links."""
    if not experts.applies(layer, s) or s.ep == 1:
        return (), ()
    if dispatcher == EPDispatcher.DEEPEP:
        leg = experts.deepep_leg(lambda n, g: cm.collective_time("all_to_all", n, g), cm.cluster, layer, s, mbs,
                                 first_rank, cm.expert_imbalance)
        return leg.groups, (("all_to_all", leg.nbytes * cm.wire_scale, experts.ALL_TO_ALLS_PER_PASS),)
    nbytes = experts.all_to_all_bytes(layer, s, mbs, cm.expert_imbalance) * cm.wire_scale
    groups = layer_grid(first_rank, s.degrees).groups("ep")
    return groups, (("all_to_all", nbytes, experts.ALL_TO_ALLS_PER_PASS),)


def tp_calls(layer: LayerSpec, s: LayerStrategy, mbs: int, backward: bool = False) -> tuple[tuple[str, float, int], ...]:
    """The forward pass's TP-group collectives, or the backward's (see LayerWork.tp_calls)."""
    if s.tp * s.ulysses <= 1:
        return ()
    if s.ulysses > 1:
        qkv, out = ulysses_message_bytes(layer, s, mbs)
        return (("all_to_all", qkv, 1), ("all_to_all", out, 1))
    n, count = tp_allreduce_bytes(layer, mbs) / s.cp, tp_collectives_per_pass(layer)  # s / cp tokens a rank
    if s.megatron_sp:
        return (("reduce_scatter", n, count), ("all_gather", n if backward else forward_gather_bytes(n, s), count))
    return (("all_reduce", n, count),)


def tp_recompute_calls(layer: LayerSpec, s: LayerStrategy, mbs: int) -> tuple[tuple[str, float, int], ...]:
    """A recomputed forward's TP-group collectives: the forward's (full), the forward's but the
    reduce-scatters, whose results torchtitan keeps (selective-op), none (selective: the attention
    core has no collective inside)."""
    if not s.recompute.reruns_forward_collectives:
        return ()
    calls = tp_calls(layer, s, mbs)
    if s.recompute == Recompute.SELECTIVE_OP:
        return tuple(call for call in calls if call[0] != "reduce_scatter")
    return calls


def _calls_on_wire(cm: CostModel, calls: tuple[tuple[str, float, int], ...]) -> tuple[tuple[str, float, int], ...]:
    """``calls`` with their bytes as the cost model's wire carries them (cm.wire_scale)."""
    return tuple((kind, nbytes * cm.wire_scale, count) for kind, nbytes, count in calls)


def tp_allreduce_bytes(layer: LayerSpec, micro_batch_size: int) -> float:
    """One Megatron TP all-reduce: the block's hidden activation for one micro-batch."""
    return float(micro_batch_size * layer.seq_len * layer.hidden_size * BYTES_PER_ACTIVATION)


def _tuples(groups) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(g) for g in groups)
