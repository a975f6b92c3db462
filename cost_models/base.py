"""The cost-model interface: time and memory of a layer under a strategy, and of a whole plan.

A cost model is built for one cluster. Implementations answer the per-layer questions
(``layer_time``, ``layer_memory``, ``transition_time``, ``p2p_time``, ``collective_time``,
``vocab_cost``); ``plan_cost`` composes them into an iteration time and per-stage memory
with one formula that every planner optimises and every test checks:

    T_k   = per-micro-batch time of stage k (forward + backward + TP comms + exposed CP traffic
            + relayouts + pipeline sends + embedding/head on the first/last stage)
    D_k   = per-iteration tail of stage k (gradient sync not hidden behind backward,
            optimizer step)
    time  = the schedule's formula (specs.schedules): m * max_k T_k + (sum_k T_k - max_k T_k) / v
            + max_k D_k (v = 1 but under interleaved 1F1B)
    mem_k = sum_l (states_l + in_flight_k * activations_l) + max_l temporary_l
            + vocab states/activations on the first/last stage + runtime overhead

with in_flight_k the schedule's (specs.schedules): min(pp - k, m) under 1F1B, m under GPipe.
Under a split backward the layers' activations term is instead the largest, over the program
points of the stage (``held_points``), of held * sum_l activations_l + waiting * sum_l
kept_for_w_l: micro-batches past their B keep what their W needs (``weight_wait_bytes``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import ClassVar, Sequence

from specs import ClusterSpec, CPLoadBalance, EPDispatcher, LayerSpec, LayerStrategy, ModelSpec, Plan, stage_grid
from cost_models.reserve import DEFAULT_RESERVE, AllocatorReserve
from cost_models.tp_overlap import OverlapPair
from specs.capabilities import EVERYTHING, Capabilities, check_supported
from specs.stack import SoftwareStack
from specs.schedule_play import StageWork, played_s
from specs.schedules import DEFAULT_WEIGHT_SHARE, schedule_entry, weighted_in_flight
from specs.units import GIB  # noqa: F401  (re-exported as cost_models.GIB)

PLAN_COST_CACHE = 1 << 14
"""Plans whose cost a cost model instance keeps (least recently used go first)."""
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True)
class LayerTime:
    """Time of one layer under one strategy (seconds)."""

    forward_s: float
    """Compute of one micro-batch forward on one GPU."""
    backward_s: float
    """Compute of one micro-batch backward, including the recomputed forward if checkpointed."""
    weight_grad_s: float = 0.0
    """The weight-gradient part of ``backward_s`` (W of a split backward; B is the rest)."""
    tp_comm_s: float = 0.0
    """TP collectives of one micro-batch (forward and backward), on the critical path."""
    dp_comm_s: float = 0.0
    """All data-parallel traffic of one iteration (every micro-batch's ZeRO-2/3 collectives,
    the once-per-iteration gradient all-reduce or ZeRO-1 reduce-scatter and parameter
    all-gather) if it ran alone."""
    exposed_dp_comm_s: float = 0.0
    """The once-per-iteration part of it not hidden behind the last backward (overlap model)."""
    update_s: float = 0.0
    """Optimizer step of this layer's (local shard of) parameters, once per iteration."""
    exposed_micro_batch_dp_s: float = 0.0
    """Per-micro-batch data-parallel traffic (ZeRO-2/3 gradient reduce-scatter, ZeRO-3
    parameter all-gathers) not hidden behind that micro-batch's compute."""
    ep_comm_s: float = 0.0
    """Expert-parallel all-to-alls (dispatch and combine) of one micro-batch, forward and
    backward, on the critical path (cost_models/experts.py)."""
    ep_deepep_s: float = 0.0
    """The same dispatches and combines by DeepEP (cost_models/ep_dispatch.py): what stands for
    ``ep_comm_s`` in a plan whose ep_dispatcher is deepep; 0 where the model prices none."""
    cp_comm_s: float = 0.0
    """Context-parallel K/V traffic of one micro-batch not hidden behind the attention core
    (cost_models/context.py)."""
    cp_unbalanced_s: float = 0.0
    """Attention-core time a plan with ``cp_load_balance`` none adds per micro-batch (causal
    masks on contiguous chunks); not in ``micro_batch_s``: plan_cost adds it for such plans."""
    cp_core_fwd_s: float = 0.0
    """Under cp > 1: the attention core's part of ``forward_s`` (load-balanced), what the K/V
    ring overlaps block by block (the simulator plays it so); 0 without cp."""
    cp_core_bwd_s: float = 0.0
    """The same of ``backward_s``, a recomputed forward's core excluded."""
    tp_overlap: tuple[OverlapPair, ...] = ()
    """Megatron-SP's collectives of one micro-batch (counted in ``tp_comm_s``) beside the GEMMs
    of ``forward_s`` and ``backward_s`` they pair with (cost_models/tp_overlap.py): what a plan with
    tp_comm_overlap hides; empty where the model pairs none."""

    @property
    def micro_batch_s(self) -> float:
        """What this layer adds to its stage's per-micro-batch time (load-balanced cp tokens)."""
        return (self.forward_s + self.backward_s + self.tp_comm_s + self.exposed_micro_batch_dp_s + self.ep_comm_s
                + self.cp_comm_s)

    @property
    def tp_hidden_s(self) -> float:
        """What of ``tp_comm_s`` the paired GEMMs cover under TP communication overlap."""
        return sum(p.hidden_s for p in self.tp_overlap)

    def overlapped_micro_batch_s(self, tp_comm_overlap: bool,
                                 ep_dispatcher: EPDispatcher = EPDispatcher.ALL_TO_ALL) -> float:
        """``micro_batch_s``, less ``tp_hidden_s`` under TP communication overlap, with the expert
        dispatch of ``ep_dispatcher`` (``ep_deepep_s`` for ``ep_comm_s`` under deepep)."""
        out = self.micro_batch_s - self.tp_hidden_s if tp_comm_overlap else self.micro_batch_s
        return out + self.ep_deepep_s - self.ep_comm_s if ep_dispatcher == EPDispatcher.DEEPEP else out

    def micro_batch_s_of(self, plan: Plan) -> float:
        """``micro_batch_s`` in ``plan``: less ``tp_hidden_s`` under its tp_comm_overlap, its
        ep_dispatcher's expert dispatch, plus the causal imbalance under its cp_load_balance none."""
        return (self.overlapped_micro_batch_s(plan.tp_comm_overlap, plan.ep_dispatcher)
                + (self.cp_unbalanced_s if plan.cp_load_balance == CPLoadBalance.NONE else 0.0))

    @property
    def tail_s(self) -> float:
        """What this layer adds to its stage's per-iteration tail."""
        return self.exposed_dp_comm_s + self.update_s


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU by category."""

    parameters_bytes: float = 0.0
    gradients_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    activations_bytes: float = 0.0
    """Activations kept for backward, for all in-flight micro-batches."""
    temporary_bytes: float = 0.0
    """Buffers live only while the layer runs (gathered ZeRO-3 parameters, comm buckets);
    a stage's peak counts the largest of its layers, not the sum."""

    @property
    def states_bytes(self) -> float:
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + self.activations_bytes + self.temporary_bytes

    def __add__(self, other: "MemoryBreakdown") -> "MemoryBreakdown":
        """Sum of persistent categories; temporaries take the max (they are not live together)."""
        # Spelled out rather than looped over fields(): planners add these in their hot loops.
        return MemoryBreakdown(parameters_bytes=self.parameters_bytes + other.parameters_bytes,
                               gradients_bytes=self.gradients_bytes + other.gradients_bytes,
                               optimizer_bytes=self.optimizer_bytes + other.optimizer_bytes,
                               activations_bytes=self.activations_bytes + other.activations_bytes,
                               temporary_bytes=max(self.temporary_bytes, other.temporary_bytes))


@dataclass(frozen=True)
class PlanCost:
    """What a cost model predicts for a whole plan."""

    iteration_time_s: float
    throughput_samples_per_s: float
    stage_time_s: tuple[float, ...]
    """T_k: per-micro-batch time of each stage."""
    stage_tail_s: tuple[float, ...]
    """D_k: per-iteration tail of each stage."""
    stage_memory: tuple[MemoryBreakdown, ...]
    """Peak memory of one GPU of each stage (runtime overhead included in the total)."""
    runtime_overhead_bytes: float = 0.0
    bubble_fraction: float = 0.0

    @property
    def stage_peak_bytes(self) -> tuple[float, ...]:
        return tuple(m.total_bytes + self.runtime_overhead_bytes for m in self.stage_memory)

    @property
    def peak_memory_bytes(self) -> float:
        return max(self.stage_peak_bytes)


def in_flight(schedule: str, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the whole
    stage's activations (interleaving holds chunk-micro-batches: 1/v of a stage each)."""
    return schedule_entry(schedule).in_flight(pp, stage, micro_batches, virtual_stages)


def stage_in_flight(plan: Plan, stage: int) -> float:
    """``in_flight`` of ``stage`` under ``plan``, its chunks weighted by their layers where they
    differ (Megatron's lighter end chunks, the embedding's and the loss's chunks of no layer):
    each chunk-micro-batch holds its chunk's share of the stage's activations, as the simulator
    holds them chunk by chunk. A split backward keeps counting chunk-micro-batches (its
    held_points do)."""
    counts: list[int] = []
    if plan.virtual_stages > 1 and not schedule_entry(plan.schedule).splits_backward:
        per_chunk = plan.layers_per_chunk()
        counts = [per_chunk[j] for j in plan.stage_chunks(stage)]
    if len(set(counts)) <= 1:  # one chunk a stage (no counts asked), or equal chunks
        return in_flight(plan.schedule, plan.pp, stage, plan.micro_batches, plan.virtual_stages)
    shares = tuple(n / sum(counts) for n in counts)
    return weighted_in_flight(plan.schedule, plan.pp, stage, plan.micro_batches, plan.virtual_stages, shares)


def pipeline_time(stage_time_s: Sequence[float], stage_tail_s: Sequence[float], micro_batches: int,
                  schedule: str, virtual_stages: int = 1, stage_work: Sequence[StageWork] | None = None) -> float:
    """The schedule's iteration time. A whole-backward schedule: its formula, m max_k T_k +
    (sum_k T_k - max_k T_k) / v + max_k D_k. A split-backward one (zero-bubble, V-shaped): its
    programs played op by op on the stages' F, B and W (``stage_work``; default T_k split
    F = B = W) plus max_k D_k, the bubble no closed form gives at every micro-batch count."""
    entry = schedule_entry(schedule)
    if not entry.splits_backward:
        formula = entry.formula(micro_batches, virtual_stages)
        return formula.time_s(max(stage_time_s), sum(stage_time_s), max(stage_tail_s))
    if stage_work is None:
        stage_work = [StageWork.split(t, DEFAULT_WEIGHT_SHARE, DEFAULT_WEIGHT_SHARE) for t in stage_time_s]
    return played_s(entry, stage_work, micro_batches, virtual_stages) + max(stage_tail_s)


class CostModel(ABC):
    """Time and memory of layers, collectives and plans on one cluster."""

    name: ClassVar[str] = ""
    rank_symmetric: ClassVar[bool] = False
    """True when answers depend on ranks only through the cluster's topology (which node, which
    PCIe switch): planners may then ask a stage's layer questions at an equivalent first rank,
    and ``vocab_cost`` is the same on every stage that holds neither the embedding nor the head."""
    objective_is_plan_cost: ClassVar[bool] = True
    """True when ``plan_cost``'s iteration time is what the planners add up from the per-layer
    answers (sum_k T_k + (m - 1) max_k T_k + max_k D_k of 1F1B): their lower bounds, pruning and
    "optimal" then hold for ``plan_cost``. A model with its own pipeline formula sets False; the
    planners then search every group without pruning and call their plans heuristic."""
    capabilities: Capabilities = EVERYTHING
    """The axes and values ``plan_cost`` scores (specs.capabilities): it refuses the rest with ``check_supported``'s one line, and planners
    leave the rest out of their search (SearchSpace.within). A class's record; an instance built
    for one software stack narrows its ``stack``."""
    stack: SoftwareStack | None = None
    """The software stack whose kernels it times (specs.stack), which planners write into their
    plans; None: it assumes none (a profile times what ran)."""
    linear_in_flight: ClassVar[bool] = False
    """True when ``layer_memory_in`` is states and temporaries that do not depend on ``in_flight``
    plus ``in_flight`` times one micro-batch's activations: planners then ask once per group."""
    lazy_gradients: ClassVar[bool] = False
    """True when a layer's gradients take memory from the first backward that makes them
    (PyTorch's ``.grad``, as our executor runs), False when they are held all iteration
    (Megatron's contiguous gradient buffer); a simulator allocates them accordingly."""
    sync_bucket_bytes: ClassVar[float] = 25 * 2**20
    """Gradient bytes synced together over the data-parallel group: PyTorch DDP's and Megatron's
    25 MiB buckets, whose sync starts once the backward has filled them; 0: every layer's own
    (our executor's per-module reduction). A simulator buckets the sync accordingly."""
    runtime_overhead_bytes: float = 1.0 * GIB
    """Per-GPU memory outside the model (CUDA context, allocator slack); set per instance."""

    reserve: AllocatorReserve = DEFAULT_RESERVE
    """The allocator reserve kept out of every budget (cost_models/reserve.py); set per instance
    (``cost_models.get(..., reserve_gib=4)``, ``reserve_fraction=0.1``, ``allocator_reserve=False``)."""

    expert_imbalance: float | None = None
    """Busiest expert-parallel rank's routed load over the even share; None = the default from
    the capacity factor (experts.imbalance); set per instance."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self._plan_costs = lru_cache(maxsize=PLAN_COST_CACHE)(self._compute_plan_cost)

    def allocator_reserve_bytes(self, budget_bytes: float) -> float:
        """Bytes of a ``budget_bytes`` budget a plan may not use: the allocator's cache (a budget term;
        plan_cost's peaks do not include it, planners take it off the budget)."""
        return self.reserve.bytes_of(budget_bytes)

    def layer_memory_in(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                        in_flight: int, micro_batches: int) -> MemoryBreakdown:
        """``layer_memory`` for a plan of ``micro_batches`` micro-batches (models whose states
        depend on it, like Galvatron's, override this)."""
        return self.layer_memory(layer, strategy, micro_batch_size, in_flight)

    # -- per layer --------------------------------------------------------------------
    @abstractmethod
    def layer_time(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                   micro_batches: int, first_rank: int = 0) -> LayerTime:
        """Time of ``layer`` under ``strategy`` for micro-batches of ``micro_batch_size``
        samples per replica; the layer's ranks start at ``first_rank`` (its stage)."""

    @abstractmethod
    def layer_memory(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                     in_flight: int) -> MemoryBreakdown:
        """Bytes per GPU of ``layer`` with ``in_flight`` micro-batches' activations stashed."""

    @abstractmethod
    def transition_time(self, layer: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy,
                        micro_batch_size: int, first_rank: int = 0) -> float:
        """Re-layout of ``layer``'s output (one micro-batch, forward + backward) when the next
        layer's strategy differs in tp, dp or rank layout; 0 when they match.
        ``micro_batch_size`` is the producing layer's."""

    # -- communication ----------------------------------------------------------------
    @abstractmethod
    def collective_time(self, kind: str, nbytes: float, groups: Sequence[Sequence[int]]) -> float:
        """One collective of ``kind`` (see COLLECTIVES) over each group at once; ``nbytes`` is
        the full buffer per rank (all-reduce) or the gathered result (all-gather)."""

    @abstractmethod
    def p2p_time(self, nbytes: float, src: int, dst: int, senders: int = 1) -> float:
        """A point-to-point send of ``nbytes`` from rank src to rank dst, while ranks src + i
        send as much to dst + i for i < ``senders`` (a pipeline boundary: every rank of a
        stage sends to its peer in the next stage at once)."""

    # -- embedding and head -------------------------------------------------------------
    @abstractmethod
    def vocab_cost(self, model: ModelSpec, plan: Plan, stage: int, world_size: int
                   ) -> tuple[LayerTime, MemoryBreakdown]:
        """Embedding (stage 0) and head + loss (last stage) of ``model`` on ``stage``: their
        time and memory (zero on stages that hold neither), the plan's vocab_relayout_time of
        its first and last layers included."""

    def vocab_relayout_time(self, model: ModelSpec, plan: Plan, layer_index: int, strategy: LayerStrategy) -> float:
        """Per micro-batch: the relayout between the embedding's/head's layout and layer
        ``layer_index`` (0, or the last) run under ``strategy``. Planners add it to that layer's
        strategy choice; 0 where the model charges none. Of the plan's vocab fields it depends on
        vocab_tp, vocab_sp and Plan.vocab_in_own_layout only (not on vocab_zero3 otherwise):
        planners share it between vocab choices that differ in ZeRO-3 alone."""
        return 0.0

    # -- uncertainty -----------------------------------------------------------------------
    def error_band(self) -> tuple[float, float]:
        """(p10, p90) of this model's relative time error, (p - m) / m, on runs like the ones
        it was validated on; (0, 0) when not known."""
        return 0.0, 0.0

    def time_interval_s(self, predicted_s: float) -> tuple[float, float]:
        """Measured times that 80% of the validation runs' errors allow for a prediction."""
        p10, p90 = self.error_band()
        return predicted_s / (1 + p90), predicted_s / (1 + p10)

    def calibration_status(self) -> str:
        """One line: were the constants this model applies fitted on the cluster's GPU
        ('calibrated: a100 (vtrain)', 'uncalibrated: A100-fitted constants on H100', 'defaults: ...')."""
        return f"not stated by the {self.name} cost model"

    # -- links ----------------------------------------------------------------------------
    @property
    def wire_scale(self) -> float:
        """Bytes a message moves per byte the formulas count: they count 16-bit activations and
        gradients (BYTES_PER_ACTIVATION), so 1 for a 16-bit run. This model's collective and send
        times include it; a simulator that plays the formulas' messages over the links scales
        their bytes by it."""
        return 1.0

    def link_calibration(self) -> dict[str, float]:
        """How this model's collectives and sends relate to the cluster's link figures, for a
        simulator that plays them over the links (empty: at the data sheet): any of
        ``bus_efficiency`` / ``network_efficiency`` / ``p2p_efficiency`` (achieved over
        data-sheet bandwidth: collectives inside a node, across nodes, pipeline sends),
        ``base_latency_s`` (per collective), ``step_latency_factor`` (times the cluster's
        per-hop latency, per ring step), ``collective_slowdown`` (per kind: the all-reduce's
        bus bandwidth over that kind's, when the backend runs it slower than its ring) and
        ``overlap_coefficient`` (the gamma of the model's overlap formula)."""
        return {}

    # -- whole plan -----------------------------------------------------------------------
    def plan_cost(self, model: ModelSpec, plan: Plan) -> PlanCost:
        """Iteration time and per-stage peak memory of ``plan`` (the formula in the module doc);
        cached per instance, as planners score the same plan for several budgets."""
        return self._plan_costs(model, plan)

    def _compute_plan_cost(self, model: ModelSpec, plan: Plan) -> PlanCost:
        world = self.cluster.world_size
        plan.validate(model, self.cluster)
        check_supported(plan, model, self.capabilities, f"{self.name} cost model")
        times, tails, memories = [], [], []
        for stage, layer_ids in enumerate(plan.stage_ranges()):
            t, d, mem = self._stage_cost(model, plan, stage, list(layer_ids), world)
            times.append(t)
            tails.append(d)
            memories.append(mem)
        work = self.stage_work(model, plan, times) if schedule_entry(plan.schedule).splits_backward else None
        total = pipeline_time(times, tails, plan.micro_batches, plan.schedule, plan.virtual_stages, work)
        busy = sum(times) * plan.micro_batches / plan.pp
        return PlanCost(iteration_time_s=total, throughput_samples_per_s=plan.global_batch / total,
                        stage_time_s=tuple(times), stage_tail_s=tuple(tails),
                        stage_memory=tuple(memories), runtime_overhead_bytes=self.runtime_overhead_bytes,
                        bubble_fraction=max(0.0, 1.0 - busy / total))

    def _stage_cost(self, model: ModelSpec, plan: Plan, stage: int, layer_ids: list[int],
                    world: int) -> tuple[float, float, MemoryBreakdown]:
        first_rank = plan.stage_first_rank(stage, world)
        held = stage_in_flight(plan, stage)
        vocab_time, memory = self.vocab_cost(model, plan, stage, world)
        time_s, tail_s = vocab_time.micro_batch_s, vocab_time.tail_s
        chunk_starts = plan.chunk_starts()
        splits = schedule_entry(plan.schedule).splits_backward
        first_chunk = plan.chunk_ranges()[0]  # keeps nothing for W (PipelineSchedule.held_points)
        layers_memory, kept_for_w = MemoryBreakdown(), 0.0
        # (layer, strategy) objects -> the layer's terms, (layer, strategy, next strategy) -> the
        # relayout between them: a stage repeats a few layers and strategies, each asked once
        answers: dict[tuple[int, ...], tuple | float] = {}
        for i in layer_ids:
            layer, strategy = model.layers[i], plan.layers[i]
            key = (id(layer), id(strategy))
            if key not in answers:
                mbs = plan.micro_batch_size(i)
                lt = self.layer_time(layer, strategy, mbs, plan.micro_batches, first_rank)
                answers[key] = (lt.micro_batch_s_of(plan), lt.tail_s,
                                self.layer_memory_in(layer, strategy, mbs, held, plan.micro_batches),
                                self.weight_wait_bytes(layer, strategy, mbs) if splits else 0.0)
            layer_s, layer_tail_s, layer_memory, layer_kept_for_w = answers[key]
            time_s += layer_s
            tail_s += layer_tail_s
            layers_memory = layers_memory + layer_memory
            kept_for_w += 0.0 if i in first_chunk else layer_kept_for_w
            if i not in chunk_starts:  # a chunk's first layer gets its input by p2p, not a re-layout
                prev = i - 1
                key = (id(model.layers[prev]), id(plan.layers[prev]), id(strategy))
                if key not in answers:
                    answers[key] = self.transition_time(model.layers[prev], plan.layers[prev], strategy,
                                                        plan.micro_batch_size(prev), first_rank)
                time_s += answers[key]
        if splits:
            layers_memory = self._with_kept_for_w(layers_memory, kept_for_w, held, plan, stage)
        time_s += self._pipeline_send_s(model, plan, stage, layer_ids, world)
        return time_s, tail_s, memory + layers_memory

    @staticmethod
    def _with_kept_for_w(memory: MemoryBreakdown, kept_for_w: float, held: float, plan: Plan,
                         stage: int) -> MemoryBreakdown:
        """The stage's layers' ``memory`` (``held`` micro-batches' activations) at the program
        point of a split-backward schedule where activations plus what B keeps for W
        (``kept_for_w`` bytes a micro-batch of the stage's layers outside the pipeline's first
        chunk) are largest."""
        per_micro_batch = memory.activations_bytes / held if held > 0 else 0.0
        points = schedule_entry(plan.schedule).held_points(plan.pp, stage, plan.micro_batches, plan.virtual_stages)
        extra = max((h - held) * per_micro_batch + waiting * kept_for_w for h, waiting in points)
        return replace(memory, activations_bytes=memory.activations_bytes + max(0.0, extra))

    def weight_wait_bytes(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int) -> float:
        """Bytes one micro-batch of ``layer`` keeps on one GPU from its B to its W under a split
        backward, beyond its activations (cost_models.memory.weight_wait_bytes, 16-bit)."""
        from cost_models import memory  # memory builds on this module
        return memory.weight_wait_bytes(layer, strategy, micro_batch_size)

    def stage_work(self, model: ModelSpec, plan: Plan, stage_time_s: Sequence[float]) -> list[StageWork]:
        """Each stage's T_k as a split-backward schedule runs it: W its layers' weight-gradient
        compute, the rest (communication, sends and the vocabulary's work included) shared
        between F and B as the layers' forward and input-gradient compute are. Each of F, B and
        W grows with T_k (planners bound a plan's played time from smaller T_k)."""
        world, work = self.cluster.world_size, []
        for stage, (ids, total_s) in enumerate(zip(plan.stage_ranges(), stage_time_s)):
            first_rank = plan.stage_first_rank(stage, world)
            times = [self.layer_time(model.layers[i], plan.layers[i], plan.micro_batch_size(i), plan.micro_batches,
                                     first_rank) for i in ids]
            weight_s = min(sum(t.weight_grad_s for t in times), total_s)
            forward_s = sum(t.forward_s for t in times)
            input_s = sum(t.backward_s - t.weight_grad_s for t in times)
            forward_share = forward_s / (forward_s + input_s) if forward_s + input_s > 0 else 0.5
            rest_s = total_s - weight_s
            work.append(StageWork(rest_s * forward_share, rest_s * (1.0 - forward_share), weight_s))
        return work

    def _pipeline_send_s(self, model: ModelSpec, plan: Plan, stage: int, layer_ids: list[int],
                         world: int) -> float:
        """Activations sent forward and gradients sent back at every chunk boundary of the
        stage (one each way per stage without interleaving, v each way with it)."""
        per_stage = world // plan.pp
        forward, backward = schedule_entry(plan.schedule).chunk_sends(stage, plan.pp, plan.virtual_stages)
        sends = [(plan.boundary_layer(j), j + 1) for j in forward] + [(plan.boundary_layer(j - 1), j - 1) for j in backward]
        total = 0.0
        for i, peer in sends:
            total += self.pipeline_send_time(model.layers[i], plan.layers[i], plan.micro_batch_size(i),
                                             stage * per_stage, plan.chunk_stage(peer) * per_stage, per_stage)
        return total

    # -- pipeline messages ------------------------------------------------------------------
    def pipeline_message(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int) -> "PipelineMessage":
        """How a stage boundary after ``layer`` moves one micro-batch's output (or its gradient):
        here every rank of the stage sends the whole activation to its peer (our executor's
        pipeline stages)."""
        return PipelineMessage(send_bytes=layer.output_elements(micro_batch_size) * BYTES_PER_ACTIVATION)

    def pipeline_send_time(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                           src: int, dst: int, senders: int) -> float:
        """One pipeline_message from the stage whose first rank is ``src`` to the one at ``dst``,
        its ``senders`` ranks sending at once; then the receivers' all-gather, if any."""
        msg = self.pipeline_message(layer, strategy, micro_batch_size)
        time_s = self.p2p_time(msg.send_bytes, src, dst, senders)
        if msg.gather_tp > 1:
            time_s += self.collective_time("all_gather", msg.gather_bytes, msg.gather_groups(dst, senders))
        return time_s


@dataclass(frozen=True)
class PipelineMessage:
    """What crosses a stage boundary per micro-batch: each rank of the stage sends
    ``send_bytes`` to its peer; with ``gather_tp`` > 1 the receiving ranks then all-gather the
    ``gather_bytes`` whole over consecutive groups of that many ranks (Megatron's scatter-gather)."""

    send_bytes: float
    gather_tp: int = 1
    gather_bytes: float = 0.0

    def gather_groups(self, first_rank: int, ranks: int) -> tuple[tuple[int, ...], ...]:
        """The receiving stage's all-gather groups (its first rank, its number of ranks): its
        consecutive tp groups of gather_tp ranks."""
        return stage_grid(first_rank, ranks, self.gather_tp).groups("tp")


BYTES_PER_ACTIVATION = 2
"""Activations and the messages that carry them are 16-bit (fp16/bf16 mixed precision)."""


