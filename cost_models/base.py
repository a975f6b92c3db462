"""The cost-model interface: time and memory of a layer under a strategy, and of a whole plan.

A cost model is built for one cluster. Implementations answer the per-layer questions
(``layer_time``, ``layer_memory``, ``transition_time``, ``p2p_time``, ``collective_time``,
``vocab_cost``); ``plan_cost`` composes them into an iteration time and per-stage memory
with one formula that every planner optimises and every test checks:

    T_k   = per-micro-batch time of stage k (forward + backward + TP comms + relayouts
            + pipeline sends + embedding/head on the first/last stage)
    D_k   = per-iteration tail of stage k (gradient sync not hidden behind backward,
            optimizer step)
    time  = sum_k T_k + (m - 1) * max_k T_k + max_k D_k          (GPipe and 1F1B alike)
    mem_k = sum_l (states_l + in_flight_k * activations_l) + max_l temporary_l
            + vocab states/activations on the first/last stage + runtime overhead

with in_flight_k = min(pp - k, m) under 1F1B and m under GPipe.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence

from specs import ClusterSpec, LayerSpec, LayerStrategy, ModelSpec, Plan, Schedule
from specs.units import GIB  # noqa: F401  (re-exported as cost_models.GIB)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True)
class LayerTime:
    """Time of one layer under one strategy (seconds)."""

    forward_s: float
    """Compute of one micro-batch forward on one GPU."""
    backward_s: float
    """Compute of one micro-batch backward, including the recomputed forward if checkpointed."""
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

    @property
    def micro_batch_s(self) -> float:
        """What this layer adds to its stage's per-micro-batch time."""
        return self.forward_s + self.backward_s + self.tp_comm_s + self.exposed_micro_batch_dp_s

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


def in_flight(schedule: str, pp: int, stage: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak."""
    if schedule == Schedule.GPIPE:
        return micro_batches
    return min(pp - stage, micro_batches)


def pipeline_time(stage_time_s: Sequence[float], stage_tail_s: Sequence[float], micro_batches: int) -> float:
    """sum_k T_k + (m - 1) max_k T_k + max_k D_k."""
    return sum(stage_time_s) + (micro_batches - 1) * max(stage_time_s) + max(stage_tail_s)


class CostModel(ABC):
    """Time and memory of layers, collectives and plans on one cluster."""

    name: ClassVar[str] = ""
    runtime_overhead_bytes: float = 1.0 * GIB
    """Per-GPU memory outside the model (CUDA context, allocator slack); set per instance."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster

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
    def p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        """A point-to-point send of ``nbytes`` from rank src to rank dst."""

    # -- embedding and head -------------------------------------------------------------
    @abstractmethod
    def vocab_cost(self, model: ModelSpec, plan: Plan, stage: int, world_size: int
                   ) -> tuple[LayerTime, MemoryBreakdown]:
        """Embedding (stage 0) and head + loss (last stage) of ``model`` on ``stage``: their
        time and memory (zero on stages that hold neither)."""

    # -- whole plan -----------------------------------------------------------------------
    def plan_cost(self, model: ModelSpec, plan: Plan) -> PlanCost:
        """Iteration time and per-stage peak memory of ``plan`` (the formula in the module doc)."""
        world = self.cluster.world_size
        plan.validate(model, self.cluster)
        times, tails, memories = [], [], []
        for stage, layer_ids in enumerate(plan.stage_ranges()):
            t, d, mem = self._stage_cost(model, plan, stage, list(layer_ids), world)
            times.append(t)
            tails.append(d)
            memories.append(mem)
        total = pipeline_time(times, tails, plan.micro_batches)
        busy = sum(times) * plan.micro_batches / plan.pp
        return PlanCost(iteration_time_s=total, throughput_samples_per_s=plan.global_batch / total,
                        stage_time_s=tuple(times), stage_tail_s=tuple(tails),
                        stage_memory=tuple(memories), runtime_overhead_bytes=self.runtime_overhead_bytes,
                        bubble_fraction=max(0.0, 1.0 - busy / total))

    def _stage_cost(self, model: ModelSpec, plan: Plan, stage: int, layer_ids: list[int],
                    world: int) -> tuple[float, float, MemoryBreakdown]:
        first_rank = plan.stage_first_rank(stage, world)
        held = in_flight(plan.schedule, plan.pp, stage, plan.micro_batches)
        vocab_time, memory = self.vocab_cost(model, plan, stage, world)
        time_s, tail_s = vocab_time.micro_batch_s, vocab_time.tail_s
        for pos, i in enumerate(layer_ids):
            layer, strategy, mbs = model.layers[i], plan.layers[i], plan.micro_batch_size(i)
            lt = self.layer_time(layer, strategy, mbs, plan.micro_batches, first_rank)
            time_s += lt.micro_batch_s
            tail_s += lt.tail_s
            memory = memory + self.layer_memory(layer, strategy, mbs, held)
            if pos > 0:
                prev = i - 1
                time_s += self.transition_time(model.layers[prev], plan.layers[prev], strategy,
                                               plan.micro_batch_size(prev), first_rank)
        time_s += self._pipeline_send_s(model, plan, stage, layer_ids, world)
        return time_s, tail_s, memory

    def _pipeline_send_s(self, model: ModelSpec, plan: Plan, stage: int, layer_ids: list[int],
                         world: int) -> float:
        """Activation sent forward to the next stage and gradient sent back to the previous one."""
        per_stage = world // plan.pp
        total = 0.0
        if stage < plan.pp - 1:
            last = layer_ids[-1]
            nbytes = activation_message_bytes(model.layers[last], plan, last)
            total += self.p2p_time(nbytes, stage * per_stage, (stage + 1) * per_stage)
        if stage > 0:
            first = layer_ids[0]
            nbytes = activation_message_bytes(model.layers[first - 1], plan, first - 1)
            total += self.p2p_time(nbytes, stage * per_stage, (stage - 1) * per_stage)
        return total


BYTES_PER_ACTIVATION = 2
"""Activations and the messages that carry them are 16-bit (fp16/bf16 mixed precision)."""


def activation_message_bytes(layer: LayerSpec, plan: Plan, index: int) -> float:
    """Bytes of ``layer``'s output for one micro-batch of one replica (a pipeline message)."""
    return layer.output_elements(plan.micro_batch_size(index)) * BYTES_PER_ACTIVATION

