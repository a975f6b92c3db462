"""Pipeline schedules, each defined once: its op order per stage, in-flight activations, iteration
time, micro-batch rules and the torch.distributed.pipelining class that runs it (no torch import).
Cost models, planners, the simulator and the executor read them through ``schedule_entry``."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple

from specs.errors import SpecError, one_of


class Schedule(StrEnum):
    """Pipeline schedule of the micro-batches (the JSON value)."""

    GPIPE = "gpipe"
    """All forwards, then all backwards."""
    ONE_F_ONE_B = "1f1b"
    """One forward, one backward in the steady state (PipeDream-flush)."""
    INTERLEAVED_1F1B = "interleaved_1f1b"
    """Megatron's interleaved 1F1B: ``virtual_stages`` model chunks per rank, layers round-robin."""
    ZB_H1 = "zb_h1"
    """Zero-bubble H1: 1F1B with the backward split into B (input gradient) and W (weight
    gradient), stage k deferring k W ops into the drain (one chunk per rank)."""
    ZBV = "zbv"
    """Zero-bubble V: two chunks per rank placed as a V (stage k runs chunks k and 2 pp - 1 - k),
    split backward."""
    DUALPIPE_V = "dualpipev"
    """DeepSeek's DualPipeV: the V placement, a forward of one chunk paired with a backward of the
    other in the steady state, W deferred at both ends."""
    LOOPED_BFS = "looped_bfs"
    """Breadth-first looping: every micro-batch through chunk 0, then chunk 1, ...; backwards in
    reverse (``virtual_stages`` >= 2 chunks per rank, round-robin)."""


SCHEDULES = tuple(Schedule)


class OpKind(StrEnum):
    """What one op of a stage's program runs on one model chunk and micro-batch."""

    FORWARD = "F"
    BACKWARD = "B"
    """The whole backward, or its input-gradient half under a schedule that splits it."""
    WEIGHT = "W"
    """The weight-gradient half of a split backward (zero-bubble schedules)."""


DEFAULT_WEIGHT_SHARE = 1.0 / 3.0
"""W's share of a stage's F + B + W when no split is known: a GEMM's backward is two GEMMs of its
forward's size, one for the input gradient, one for the weight gradient (F = B = W)."""


class Op(NamedTuple):
    """One op of a stage's program."""

    kind: OpKind
    micro_batch: int
    chunk: int
    """Position of the model chunk on its stage: 0 .. virtual_stages - 1."""


@dataclass(frozen=True)
class PipelineFormula:
    """Iteration time from per-stage T_k (one micro-batch) and D_k (per-iteration tail):
    m max_k T_k + bubble (sum_k T_k - max_k T_k) / v + max_k D_k, with v the fill divisor and
    ``bubble`` the share of the fill and drain left idle (1; 0 in a split-backward schedule's bound).
    Planners use its linear form ``fill * sum_k T_k + steady * max_k T_k + max_k D_k`` (same
    value, their rounding); one stage is m T_0 + D_0."""

    micro_batches: int
    fill_divisor: int
    """v: interleaving shrinks the fill and drain (sum T - max T) v-fold."""
    bubble: float = 1.0
    """Share of the fill and drain left idle: 1, or 0 in the bound of a split-backward schedule
    (whose time is played, not given by this formula)."""

    @property
    def fill(self) -> float:
        """Coefficient of sum_k T_k in the linear form: bubble / v."""
        return self.bubble / self.fill_divisor

    @property
    def steady(self) -> float:
        """Coefficient of max_k T_k in the linear form: m - bubble / v (m - 1 for 1F1B)."""
        return self.micro_batches - self.fill

    def time_s(self, slowest_s: Any, total_s: Any, tail_s: Any) -> Any:
        """m max T + bubble (sum T - max T) / v + max D from max T, sum T and max D (floats or arrays)."""
        return self.micro_batches * slowest_s + (total_s - slowest_s) * self.fill + tail_s

    def linear_s(self, total_s: Any, slowest_s: Any, tail_s: Any) -> Any:
        """fill * sum T + steady * max T + max D (floats or arrays)."""
        return self.fill * total_s + self.steady * slowest_s + tail_s


class PipelineSchedule(ABC):
    """One registered schedule. Subclasses set the class attributes and ``ops``/``in_flight``;
    chunks are placed round-robin (chunk j of pp * v on stage j % pp)."""

    name: ClassVar[Schedule]
    torch_class: ClassVar[str]
    """Class of torch.distributed.pipelining that runs it (the executor resolves it by name)."""
    min_virtual_stages: ClassVar[int] = 1
    max_virtual_stages: ClassVar[int] = 1
    """Model chunks per rank allowed (the schedule's parameter)."""

    @abstractmethod
    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        """The order of the stage's ops in one iteration."""

    @abstractmethod
    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
        """Micro-batches whose activations ``stage`` holds at its peak, in units of the whole
        stage's activations."""

    splits_backward: ClassVar[bool] = False
    """Its programs run W ops (the backward split into B and W)."""

    def held_points(self, pp: int, stage: int, micro_batches: int,
                    virtual_stages: int = 1) -> tuple[tuple[float, float], ...]:
        """(micro-batches whose activations the stage holds, micro-batches past their B and
        before their W) at the program points where the stage's memory can peak. The first in
        units of the whole stage as ``in_flight``; the second of the stage's chunks that keep
        something for W: all but the pipeline's first (stage 0's chunk 0), whose input, the
        tokens, needs no gradient, so torch's pipelining runs its whole backward at W and its B
        keeps nothing. Without a split backward, the one point ``in_flight`` gives, none past B;
        with one, every point of the program no other point holds at least as many of both."""
        if not self.splits_backward:
            return ((self.in_flight(pp, stage, micro_batches, virtual_stages), 0.0),)
        v = virtual_stages
        keeping = v - 1 if stage == 0 else v
        return tuple((held / v, waiting / keeping if keeping else 0.0)
                     for held, waiting in _held_points(self.name, pp, stage, micro_batches, v))

    def formula(self, micro_batches: int, virtual_stages: int = 1) -> PipelineFormula:
        """The iteration time's formula (a lower bound for a split-backward schedule, whose time
        plan_cost plays op by op: specs.schedule_play)."""
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
        if self.min_virtual_stages == self.max_virtual_stages:
            raise SpecError("virtual_stages", f"{self.name} needs virtual_stages {self.min_virtual_stages}, got {v}")
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


class SplitBackward(PipelineSchedule):
    """A schedule whose backward runs as B then W: a micro-batch's activations stay until its W
    (an upper bound: only W's inputs and output gradients are needed after B). Each one's
    ``in_flight`` is the peak of its own program in closed form, equal to the program played op
    by op on every pp, micro-batch count and stage (tests/specs/test_schedules.py): planners ask
    it for thousands of micro-batches, where playing the program took a quarter of a second."""

    splits_backward = True

    def formula(self, micro_batches: int, virtual_stages: int = 1) -> PipelineFormula:
        """No bubble: the bound planners prune with (every stage runs its m micro-batches at
        least). The bubble left depends on F, B and W and, below about 2 pp micro-batches, on the
        micro-batch count: plan_cost plays the program (specs.schedule_play)."""
        return PipelineFormula(micro_batches, 1, 0.0)


class ZeroBubbleH1(SplitBackward):
    name = Schedule.ZB_H1
    torch_class = "ScheduleInterleavedZeroBubble"
    """torch's ZB1P with one stage per rank is ZB-H1."""

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        """1F1B's order with B the input gradient; stage k runs W of micro-batch i - k after B of
        i (its first k steady steps without one), the k left over at the end: the later stages
        hold W work to fill the drain while staying within stage 0's pp micro-batches."""
        m, warmup = micro_batches, min(pp - stage - 1, micro_batches)
        out = [Op(OpKind.FORWARD, i, 0) for i in range(warmup)]
        for i in range(m):
            out += [Op(OpKind.FORWARD, warmup + i, 0)] if warmup + i < m else []
            out += [Op(OpKind.BACKWARD, i, 0)] + ([Op(OpKind.WEIGHT, i - stage, 0)] if i >= stage else [])
        return out + [Op(OpKind.WEIGHT, i, 0) for i in range(max(m - stage, 0), m)]

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
        """min(pp, m) on every stage: after its pp - k - 1 warm-up forwards, step i adds a forward
        and, from step k on, a W, so the forwards not yet through their W climb to pp at step k
        and stay there."""
        return min(pp, micro_batches)

    def micro_batch_error(self, pp: int, micro_batches: int) -> str | None:
        m = micro_batches
        if m < pp:
            return f"{self.name} needs micro_batches({m}) >= pp({pp})"
        if m % (m // pp):
            return (f"{self.name} needs micro-batches a multiple of its rounds (torch's ZB1P): micro_batches {m}, "
                    f"rounds {m} // pp {pp} = {m // pp}")
        return None


class VShape(SplitBackward):
    """Two chunks per rank in a V: stage k runs chunk k (going down) and chunk 2 pp - 1 - k
    (coming back up); the model's last chunk, with the head, is on stage 0."""

    min_virtual_stages = 2
    max_virtual_stages = 2

    def stage_chunks(self, stage: int, pp: int, virtual_stages: int) -> list[int]:
        return [stage, 2 * pp - 1 - stage]

    def chunk_sends(self, stage: int, pp: int, virtual_stages: int) -> tuple[list[int], list[int]]:
        """As round-robin, less the turn of the V: chunk pp - 1 feeds chunk pp on its own stage."""
        forward, backward = super().chunk_sends(stage, pp, virtual_stages)
        return [j for j in forward if j != pp - 1], [j for j in backward if j != pp]

    def check(self, pp: int, micro_batches: int, virtual_stages: int) -> None:
        self.check_virtual_stages(virtual_stages)
        if pp == 1:
            raise SpecError("pp", f"{self.name} needs pp > 1 (pp is 1): its V turns on the last stage")
        super().check(pp, micro_batches, virtual_stages)


class ZeroBubbleV(VShape):
    name = Schedule.ZBV
    torch_class = "ScheduleZBVZeroBubble"

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 2) -> list[Op]:
        """The ZB-V order of the paper (section 6) as torch builds it: 2 (pp - k) - 1 forwards of
        chunk 0; k pairs F1 F0; pp - k of F1 B1 W1; steady F0 B0 W0 F1 B1 W1; cool-down k pairs
        B0 B1, then pp - k of B0 W0, then the W left. Built for max(m, 2 pp - 1) micro-batches,
        the ops of those past m dropped."""
        n = max(micro_batches, 2 * pp - 1)
        count = {key: 0 for key in ("F0", "F1", "B0", "B1", "W0", "W1")}
        out: list[Op] = []

        def add(kind: OpKind, chunk: int) -> None:
            key = f"{kind}{chunk}"
            out.append(Op(kind, count[key], chunk))
            count[key] += 1

        F, B, W = OpKind.FORWARD, OpKind.BACKWARD, OpKind.WEIGHT
        for _ in range(2 * (pp - stage) - 1):
            add(F, 0)
        for _ in range(stage):
            add(F, 1), add(F, 0)
        for _ in range(pp - stage):
            add(F, 1), add(B, 1), add(W, 1)
        while count["F1"] < count["F0"] or count["F0"] < n:
            if count["F0"] < n:
                add(F, 0)
            add(B, 0), add(W, 0), add(F, 1), add(B, 1), add(W, 1)
        for _ in range(stage):
            add(B, 0), add(B, 1)
        for _ in range(pp - stage):
            add(B, 0), add(W, 0)
        while count["W1"] < count["B1"]:
            add(W, 1)
        while count["W0"] < count["B0"]:
            add(W, 0)
        return [op for op in out if op.micro_batch < micro_batches]

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 2) -> float:
        """The peak comes before the first W: chunk 0's forwards (at most m) and chunk 1's first
        k + 1 (at most m), 2 pp at most (each steady round runs F B W on one chunk, then the
        other); in chunk-micro-batches of half the stage."""
        m = micro_batches
        return min(2 * pp, m + min(m, stage + 1)) / virtual_stages


class DualPipeV(VShape):
    name = Schedule.DUALPIPE_V
    torch_class = "ScheduleDualPipeV"

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 2) -> list[Op]:
        """DeepSeek's DualPipeV as torch builds it, r = pp - k - 1, a whole backward being B then
        W at once and "w" the oldest deferred W (if any): 2 r F0; k + 1 of F0 F1; r of B1 (W
        deferred) w F1; m - 2 pp + k + 1 of F0 B1, F1 B0 (a forward paired with the other chunk's
        backward); r of B1, F1 B0; k + 1 of B1 B0, W deferred from the middle one on; r of w B0;
        k + 1 of w."""
        count: dict[tuple[OpKind, int], int] = {}
        deferred: list[Op] = []
        out: list[Op] = []
        F, B, W = OpKind.FORWARD, OpKind.BACKWARD, OpKind.WEIGHT

        def add(kind: OpKind, chunk: int, split: bool = False) -> None:
            mb = count.get((kind, chunk), 0)
            count[(kind, chunk)] = mb + 1
            out.append(Op(kind, mb, chunk))
            if kind == B:
                (deferred if split else out).append(Op(W, mb, chunk))

        def pending_w() -> None:
            if deferred:
                out.append(deferred.pop(0))

        rest = pp - stage - 1
        for _ in range(2 * rest):
            add(F, 0)
        for _ in range(stage + 1):
            add(F, 0), add(F, 1)
        for _ in range(rest):
            add(B, 1, split=True), pending_w(), add(F, 1)
        for _ in range(micro_batches - 2 * pp + stage + 1):
            add(F, 0), add(B, 1), add(F, 1), add(B, 0)
        for _ in range(rest):
            add(B, 1), add(F, 1), add(B, 0)
        split = False
        for i in range(stage + 1):
            split = split or (i == (stage + 1) // 2 and stage % 2 == 1)
            add(B, 1, split)
            split = split or (i == (stage + 1) // 2 and stage % 2 == 0)
            add(B, 0, split)
        for _ in range(rest):
            pending_w(), add(B, 0, split)
        for _ in range(stage + 1):
            pending_w()
        return out

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 2) -> float:
        """2 pp forwards before the first W (2 r of chunk 0, then k + 1 pairs); each of the next
        r steps runs its deferred W at once; the first steady round's forward, where
        m >= 2 pp - k gives one, holds one more, and every backward after it runs whole (W at
        once) until the cool-down: 2 pp + 1. In chunk-micro-batches of half the stage."""
        return (2 * pp + (micro_batches >= 2 * pp - stage)) / virtual_stages

    def micro_batch_error(self, pp: int, micro_batches: int) -> str | None:
        if micro_batches < 2 * pp:
            return f"{self.name} needs micro_batches({micro_batches}) >= 2 * pp({pp}) = {2 * pp} (one per chunk of the V)"
        return None


class LoopedBFS(PipelineSchedule):
    name = Schedule.LOOPED_BFS
    torch_class = "ScheduleLoopedBFS"
    min_virtual_stages = 2
    max_virtual_stages = 1 << 20

    def ops(self, stage: int, pp: int, micro_batches: int, virtual_stages: int = 2) -> list[Op]:
        """Every micro-batch's forward through chunk 0, then chunk 1, ...; then the backwards,
        last chunk first, micro-batches in reverse (torch's order)."""
        m, v = micro_batches, virtual_stages
        return ([Op(OpKind.FORWARD, i, c) for c in range(v) for i in range(m)]
                + [Op(OpKind.BACKWARD, i, c) for c in reversed(range(v)) for i in reversed(range(m))])

    def in_flight(self, pp: int, stage: int, micro_batches: int, virtual_stages: int = 2) -> float:
        """Every chunk of every micro-batch: the whole stage m times, as GPipe."""
        return micro_batches

    def check(self, pp: int, micro_batches: int, virtual_stages: int) -> None:
        self.check_virtual_stages(virtual_stages)
        if pp == 1:
            raise SpecError("virtual_stages", f"virtual_stages {virtual_stages} needs pp > 1 (pp is 1)")


REGISTRY: dict[Schedule, PipelineSchedule] = {s.name: s for s in (
    GPipe(), OneFOneB(), Interleaved1F1B(), ZeroBubbleH1(), ZeroBubbleV(), DualPipeV(), LoopedBFS())}
"""Every schedule, by name."""


def chunk_holdings(name: str, pp: int, stage: int, micro_batches: int, virtual_stages: int):
    """After each op of the stage's program, how many micro-batches each of its chunks (by
    position) holds activations of: forwarded and not yet through their backward (their W under
    a split backward)."""
    entry = schedule_entry(name)
    releases = OpKind.WEIGHT if entry.splits_backward else OpKind.BACKWARD
    held = [0] * virtual_stages
    for op in entry.ops(stage, pp, micro_batches, virtual_stages):
        held[op.chunk] += 1 if op.kind == OpKind.FORWARD else -1 if op.kind == releases else 0
        yield tuple(held)


@lru_cache(maxsize=4096)
def weighted_in_flight(name: str, pp: int, stage: int, micro_batches: int, virtual_stages: int,
                       shares: tuple[float, ...]) -> float:
    """The stage's peak activations in units of the whole stage when its chunks hold unequal
    ``shares`` of them (by position, summing to 1): each chunk-micro-batch held counts its
    chunk's share. Equal shares give ``in_flight``."""
    return max(sum(n * share for n, share in zip(held, shares))
               for held in chunk_holdings(name, pp, stage, micro_batches, virtual_stages))


@lru_cache(maxsize=4096)
def _held_points(name: Schedule, pp: int, stage: int, micro_batches: int,
                 virtual_stages: int) -> tuple[tuple[int, int], ...]:
    """(chunk-micro-batches forwarded and not yet through W, those of them through B outside
    the pipeline's first chunk) after each op of a split-backward program (a B's own peak comes
    with what it keeps for W), less the points another point holds at least as many of both."""
    held = waiting = 0
    points: set[tuple[int, int]] = set()
    for op in REGISTRY[name].ops(stage, pp, micro_batches, virtual_stages):
        held += 1 if op.kind == OpKind.FORWARD else -1 if op.kind == OpKind.WEIGHT else 0
        if stage > 0 or op.chunk > 0:
            waiting += 1 if op.kind == OpKind.BACKWARD else -1 if op.kind == OpKind.WEIGHT else 0
        points.add((held, waiting))
    return tuple(sorted(p for p in points
                        if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in points)))


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
