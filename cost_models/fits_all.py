"""Plan under several cost models at once: time from the first, memory the largest any of them
predicts (its own allocator reserve and runtime overhead included), so a plan fits every one."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cost_models.base import CostModel, LayerTime, MemoryBreakdown, PlanCost
from specs import LayerSpec, LayerStrategy, ModelSpec, Plan, SpecError

INFEASIBLE = MemoryBreakdown(parameters_bytes=float("inf"))
"""What a model that cannot express a strategy or plan predicts for it."""


def _max(parts: Sequence[MemoryBreakdown]) -> MemoryBreakdown:
    """One breakdown at least as large as each of ``parts`` in persistent and in temporary bytes."""
    return MemoryBreakdown(parameters_bytes=max(m.states_bytes + m.activations_bytes for m in parts),
                           temporary_bytes=max(m.temporary_bytes for m in parts))


class FitsAll(CostModel):
    """``primary`` for time; for memory, each model's bytes in the primary's budget terms.

    A model's need is its stage peak plus its reserve at ``budget_bytes``; this model reports
    max(need) - primary's reserve, so ``peak <= budget - primary reserve`` means every model fits.
    Per-layer memory is the largest of the models' (a sum of maxima: never below any model's sum).
    """

    name = "fits_all"

    def __init__(self, primary: CostModel, others: Sequence[CostModel], budget_bytes: float) -> None:
        super().__init__(primary.cluster)
        if not others:
            raise SpecError("memory_models", "give at least one cost model besides the primary")
        for m in others:
            if m.cluster.world_size != primary.cluster.world_size:
                raise SpecError("memory_models", f"cluster of {m.name} has {m.cluster.world_size} GPUs, "
                                f"the primary's {primary.cluster.world_size}")
        self.primary, self.models = primary, (primary, *others)
        own = primary.allocator_reserve_bytes(budget_bytes)
        self.shift = [m.allocator_reserve_bytes(budget_bytes) - own for m in self.models]
        """Extra bytes each model needs beyond the primary's reserve."""
        self.runtime_overhead_bytes = max(m.runtime_overhead_bytes + s for m, s in zip(self.models, self.shift))
        self._reserve = own

    def allocator_reserve_bytes(self, budget_bytes: float) -> float:
        return self._reserve

    # -- time: the primary's ---------------------------------------------------------------------
    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0) -> LayerTime:
        return self.primary.layer_time(layer, strategy, micro_batch_size, micro_batches, first_rank)

    def transition_time(self, layer, prev, nxt, micro_batch_size, first_rank=0) -> float:
        return self.primary.transition_time(layer, prev, nxt, micro_batch_size, first_rank)

    def collective_time(self, kind, nbytes, groups) -> float:
        return self.primary.collective_time(kind, nbytes, groups)

    def p2p_time(self, nbytes, src, dst, senders=1) -> float:
        return self.primary.p2p_time(nbytes, src, dst, senders)

    def pipeline_message(self, layer, strategy, micro_batch_size):
        return self.primary.pipeline_message(layer, strategy, micro_batch_size)

    def link_calibration(self) -> dict[str, float]:
        return self.primary.link_calibration()

    def calibration_status(self) -> str:
        return self.primary.calibration_status()

    # -- memory: the largest ---------------------------------------------------------------------
    def layer_memory(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                     in_flight: int) -> MemoryBreakdown:
        return _max([m.layer_memory(layer, strategy, micro_batch_size, in_flight) for m in self.models])

    def layer_memory_in(self, layer, strategy, micro_batch_size, in_flight, micro_batches) -> MemoryBreakdown:
        return _max([m.layer_memory_in(layer, strategy, micro_batch_size, in_flight, micro_batches)
                     for m in self.models])

    def vocab_cost(self, model: ModelSpec, plan: Plan, stage: int, world_size: int
                   ) -> tuple[LayerTime, MemoryBreakdown]:
        time, _ = self.primary.vocab_cost(model, plan, stage, world_size)
        parts = []
        for m in self.models:
            try:
                parts.append(m.vocab_cost(model, plan, stage, world_size)[1])
            except SpecError:
                parts.append(INFEASIBLE)
        return time, _max(parts)

    def plan_cost(self, model: ModelSpec, plan: Plan) -> PlanCost:
        """The primary's cost with each stage's memory the largest need of any model."""
        cost = self.primary.plan_cost(model, plan)
        needs = [list(cost.stage_peak_bytes)]
        for m, shift in zip(self.models[1:], self.shift[1:]):
            try:
                needs.append([b + shift for b in m.plan_cost(model, plan).stage_peak_bytes])
            except SpecError:
                needs.append([float("inf")] * plan.pp)
        stage = tuple(MemoryBreakdown(parameters_bytes=max(col)) for col in zip(*needs))
        return replace(cost, stage_memory=stage, runtime_overhead_bytes=0.0)
