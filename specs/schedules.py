"""Pipeline schedules, each defined once: its op order per stage, in-flight activations, iteration
time, micro-batch rules and the torch.distributed.pipelining class that runs it (no torch import).
Cost models, planners, the simulator and the executor read them through ``schedule_entry``."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple, Sequence

from specs.errors import SpecError, one_of


class Schedule(StrEnum):
    """Pipeline schedule of the micro-batches (the JSON value)."""

    GPIPE = "gpipe"
    """All forwards, then all backwards."""
    ONE_F_ONE_B = "1f1b"
    """One forward, one backward in the steady state (PipeDream-flush)."""
    INTERLEAVED_1F1B = "interleaved_1f1b"
    """Megatron's interleaved 1F1B: ``virtual_stages`` model chunks per rank, layers round-robin."""


SCHEDULES = tuple(Schedule)


class OpKind(StrEnum):
    """What one op of a stage's program runs on one model chunk and micro-batch."""

    FORWARD = "F"
    BACKWARD = "B"
    """The whole backward, or its input-gradient half under a schedule that splits it."""
    WEIGHT = "W"
    """The weight-gradient half of a split backward (zero-bubble schedules)."""


class Op(NamedTuple):
    """One op of a stage's program."""

    kind: OpKind
    micro_batch: int
    chunk: int
    """Position of the model chunk on its stage: 0 .. virtual_stages - 1."""


@dataclass(frozen=True)
class PipelineFormula:
    """Iteration time from per-stage T_k (one micro-batch) and D_k (per-iteration tail):
    m max_k T_k + (sum_k T_k - max_k T_k) / v + max_k D_k, with v the fill divisor. Planners use
    its linear form ``fill * sum_k T_k + steady * max_k T_k + max_k D_k`` (same value, their
    rounding); one stage is m T_0 + D_0."""

    micro_batches: int
    fill_divisor: int
    """v: interleaving shrinks the fill and drain (sum T - max T) v-fold."""

    @property
    def fill(self) -> float:
        """Coefficient of sum_k T_k in the linear form: 1 / v."""
        return 1.0 / self.fill_divisor

    @property
    def steady(self) -> float:
        """Coefficient of max_k T_k in the linear form: m - 1 / v (m - 1 without interleaving)."""
        return self.micro_batches - 1.0 / self.fill_divisor

    def time_s(self, slowest_s: Any, total_s: Any, tail_s: Any) -> Any:
        """m max T + (sum T - max T) / v + max D from max T, sum T and max D (floats or arrays)."""
        return self.micro_batches * slowest_s + (total_s - slowest_s) / self.fill_divisor + tail_s

    def linear_s(self, total_s: Any, slowest_s: Any, tail_s: Any) -> Any:
        """fill * sum T + steady * max T + max D (floats or arrays)."""
        return self.fill * total_s + self.steady * slowest_s + tail_s


class PipelineSchedule:
    """One registered schedule. Subclasses set the class attributes and ``ops``/``in_flight``;
    chunks are placed round-robin (chunk j of pp * v on stage j % pp)."""

    name: ClassVar[Schedule]
    torch_class: ClassVar[str]
    """Class of torch.distributed.pipelining that runs it (the executor resolves it by name)."""
    min_virtual_stages: ClassVar[int] = 1
    max_virtual_stages: ClassVar[int] = 1
    """Model chunks per rank allowed (the schedule's parameter)."""

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        """The order of the stage's ops in one iteration."""
        raise NotImplementedError

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
        """Micro-batches whose activations ``stage`` holds at its peak, in units of the whole
        stage's activations."""
        raise NotImplementedError

    def formula(self, micro_batches: int, virtual_stages: int = 1) -> PipelineFormula:
        return PipelineFormula(micro_batches, virtual_stages)

    def micro_batch_error(self, pp: int, micro_batches: int) -> str | None:
        """Why ``micro_batches`` cannot run on ``pp`` stages under this schedule (None: they can)."""
        return None

    def check_virtual_stages(self, virtual_stages: int) -> None:
        """SpecError unless this schedule takes ``virtual_stages`` chunks per rank."""
        v = virtual_stages
        if self.min_virtual_stages <= v <= self.max_virtual_stages:
            return
        if self.max_virtual_stages == 1:
            raise SpecError("virtual_stages", f"virtual_stages {v} needs schedule {Schedule.INTERLEAVED_1F1B} "
                            f"({self.name} runs one model chunk per rank)")
        raise SpecError("virtual_stages", f"{self.name} needs virtual_stages >= {self.min_virtual_stages}, got {v}")

    def check(self, pp: int, micro_batches: int, virtual_stages: int) -> None:
        """SpecError naming the numbers unless a plan with these stages and micro-batches runs."""
        self.check_virtual_stages(virtual_stages)
        error = self.micro_batch_error(pp, micro_batches)
        if error is not None:
            raise SpecError("micro_batches", error)

    def allows(self, pp: int, micro_batches: int, virtual_stages: int) -> bool:
        """``check`` as a predicate (planners filter their grids with it)."""
        try:
            self.check(pp, micro_batches, virtual_stages)
        except SpecError:
            return False
        return True

    def stage_chunks(self, stage: int, pp: int, virtual_stages: int) -> list[int]:
        """Global chunk indices (of pp * v, in model order) that ``stage`` runs."""
        return [c * pp + stage for c in range(virtual_stages)]

    def chunk_sends(self, stage: int, pp: int, virtual_stages: int) -> tuple[list[int], list[int]]:
        """Chunks of ``stage`` that send their output forward (all but the model's last) and that
        send their input gradient back (all but the first), to the chunks j + 1 and j - 1."""
        chunks = self.stage_chunks(stage, pp, virtual_stages)
        total = pp * virtual_stages
        return [j for j in chunks if j < total - 1], [j for j in chunks if j > 0]


class GPipe(PipelineSchedule):
    name = Schedule.GPIPE
    torch_class = "ScheduleGPipe"

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        """All forwards, then all backwards (in the same micro-batch order)."""
        m = micro_batches
        return [Op(OpKind.FORWARD, i, 0) for i in range(m)] + [Op(OpKind.BACKWARD, i, 0) for i in range(m)]

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
        return micro_batches


class OneFOneB(PipelineSchedule):
    name = Schedule.ONE_F_ONE_B
    torch_class = "Schedule1F1B"

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        """PipeDream-flush / Megatron 1F1B: pp - stage - 1 warm-up forwards, then one forward and
        one backward in turn, then the remaining backwards."""
        warmup = min(pp - stage - 1, micro_batches)
        ops = [Op(OpKind.FORWARD, i, 0) for i in range(warmup)]
        for i in range(micro_batches - warmup):
            ops += [Op(OpKind.FORWARD, warmup + i, 0), Op(OpKind.BACKWARD, i, 0)]
        return ops + [Op(OpKind.BACKWARD, i, 0) for i in range(micro_batches - warmup, micro_batches)]

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
        return min(pp - stage, micro_batches)

    def micro_batch_error(self, pp: int, micro_batches: int) -> str | None:
        if micro_batches < pp:
            return f"{self.name} needs micro_batches({micro_batches}) >= pp({pp})"
        return None


class Interleaved1F1B(PipelineSchedule):
    name = Schedule.INTERLEAVED_1F1B
    torch_class = "ScheduleInterleaved1F1B"
    min_virtual_stages = 2
    max_virtual_stages = 1 << 20

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        """Megatron's order: the k-th forward runs chunk (k // pp) % v of micro-batch
        (k // (pp v)) pp + k % pp (groups of pp micro-batches go through chunk 0, then chunk 1...);
        backwards walk the chunks in reverse; warm-up 2 (pp - stage - 1) + (v - 1) pp forwards,
        then one forward and one backward in turn, then the remaining backwards (m % pp == 0)."""
        v, total = virtual_stages, micro_batches * virtual_stages

        def op(kind: OpKind, k: int) -> Op:
            chunk = (k // pp) % v
            return Op(kind, (k // (pp * v)) * pp + k % pp, (v - 1 - chunk) if kind == OpKind.BACKWARD else chunk)

        warmup = min(2 * (pp - stage - 1) + (v - 1) * pp, total)
        ops = [op(OpKind.FORWARD, k) for k in range(warmup)]
        for i in range(total - warmup):
            ops += [op(OpKind.FORWARD, warmup + i), op(OpKind.BACKWARD, i)]
        return ops + [op(OpKind.BACKWARD, k) for k in range(total - warmup, total)]

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
        """Megatron's warm-up (2 (pp - stage - 1) + (v - 1) pp + 1 chunk-micro-batches, at most
        m v), each 1/v of the stage's activations."""
        v = virtual_stages
        return min(2 * (pp - stage - 1) + (v - 1) * pp + 1, micro_batches * v) / v

    def micro_batch_error(self, pp: int, micro_batches: int) -> str | None:
        if micro_batches % pp:
            return f"interleaved 1F1B needs micro-batches a multiple of pp: micro_batches {micro_batches}, pp {pp}"
        return None

    def check(self, pp: int, micro_batches: int, virtual_stages: int) -> None:
        """pp > 1 and micro-batches a multiple of pp; chunks may hold any layer counts
        (``Plan.chunk_layers``)."""
        self.check_virtual_stages(virtual_stages)
        if pp == 1:
            raise SpecError("virtual_stages", f"virtual_stages {virtual_stages} needs pp > 1 (pp is 1)")
        super().check(pp, micro_batches, virtual_stages)


REGISTRY: dict[Schedule, PipelineSchedule] = {s.name: s for s in (GPipe(), OneFOneB(), Interleaved1F1B())}
"""Every schedule, by name."""


def schedule_entry(name: str) -> PipelineSchedule:
    """The registered schedule called ``name`` (SpecError naming the choices otherwise)."""
    entry = REGISTRY.get(name)  # type: ignore[call-overload]
    if entry is None:
        one_of(name, SCHEDULES, "schedule")
    return entry  # type: ignore[return-value]


def upgrade_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    """Plan files written before interleaving was its own schedule said ``"schedule": "1f1b"``
    (or nothing) with ``"virtual_stages": v > 1``: that is interleaved_1f1b (returns a copy)."""
    out = dict(raw)
    v = out.get("virtual_stages", 1)
    if isinstance(v, int) and v > 1 and out.get("schedule", Schedule.ONE_F_ONE_B) == Schedule.ONE_F_ONE_B:
        out["schedule"] = Schedule.INTERLEAVED_1F1B
    return out
