"""A schedule's iteration played op by op on abstract stages: each stage runs its program
(``PipelineSchedule.ops``) in order, an op starting when its stage is free and its input is ready
(a forward after the previous chunk's forward of the micro-batch, a backward after the next
chunk's backward, or after the last chunk's own forward, a W after its B). No communication, no
memory: the pipeline's own dependency structure, for the schedules whose bubble no closed form
gives at every micro-batch count (the split-backward ones)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from specs.errors import SpecError, positive_number
from specs.schedules import OpKind, PipelineSchedule, schedule_entry


@dataclass(frozen=True)
class StageWork:
    """One micro-batch's compute on one pipeline stage, all its chunks together (seconds)."""

    forward_s: float
    """Forward."""
    input_grad_s: float
    """Backward's input-gradient part (B); the whole backward of a schedule that does not split it
    is ``input_grad_s + weight_grad_s``."""
    weight_grad_s: float
    """Backward's weight-gradient part (W)."""

    def __post_init__(self) -> None:
        for name in ("forward_s", "input_grad_s", "weight_grad_s"):
            positive_number(getattr(self, name), name, allow_zero=True)

    @property
    def total_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @classmethod
    def split(cls, total_s: float, forward_share: float, weight_share: float) -> "StageWork":
        """``total_s`` split by shares of forward and weight gradient (the rest is B)."""
        if not (forward_share >= 0.0 and weight_share >= 0.0 and forward_share + weight_share <= 1.0 + 1e-12):
            raise SpecError("stage_work", f"shares forward {forward_share} + weight {weight_share} must lie in [0, 1]")
        input_share = max(0.0, 1.0 - forward_share - weight_share)
        return cls(total_s * forward_share, total_s * input_share, total_s * weight_share)


STEADY_ROUNDS = 2
"""Micro-batches per stage (times 2 pp) after which the programs repeat: each further micro-batch
adds the busiest stage's work to the played time, so longer iterations are extrapolated."""


def played_s(entry: PipelineSchedule, stages: Sequence[StageWork], micro_batches: int,
             virtual_stages: int) -> float:
    """The iteration's compute makespan under ``entry`` (tails excluded), each chunk of a stage
    taking 1 / v of its work. A split-backward schedule is played up to ``steady_micro_batches``
    (the same count modulo pp); each further micro-batch adds the busiest stage's work, the pace
    of its steady state. On uneven stages the other stages' slack still absorbs a little past that
    point, so this over-estimates by at most a few tenths of a percent (0.22% at worst over 270
    random cases tried once; tests/specs/test_schedule_play.py holds it under 0.3%). Others are
    played whole."""
    pp, m = len(stages), micro_batches
    steady = steady_micro_batches(pp)
    if not entry.splits_backward or m <= steady:
        return _play(entry, stages, m, virtual_stages)
    played = m - pp * ((m - steady) // pp)
    slowest = max(s.total_s for s in stages)
    return _play(entry, stages, played, virtual_stages) + (m - played) * slowest


def steady_micro_batches(pp: int) -> int:
    """Micro-batches past which every registered schedule's programs are in their steady state."""
    return STEADY_ROUNDS * 2 * pp + 2


def _play(entry: PipelineSchedule, stages: Sequence[StageWork], micro_batches: int, v: int) -> float:
    """Each op starts when its stage is free and its input is ready, in an order (``_order``) that
    meets both before it."""
    split = entry.splits_backward
    durations = [(s.forward_s / v, (s.input_grad_s if split else s.input_grad_s + s.weight_grad_s) / v,
                  s.weight_grad_s / v) for s in stages]
    order = _order(entry.name, len(stages), micro_batches, v)
    free, ends = [0.0] * len(stages), [0.0] * len(order)
    for i, (k, kind, dep) in enumerate(order):
        start = free[k]
        if dep >= 0 and ends[dep] > start:
            start = ends[dep]
        ends[i] = free[k] = start + durations[k][kind]
    return max(free)


KIND_INDEX = {OpKind.FORWARD: 0, OpKind.BACKWARD: 1, OpKind.WEIGHT: 2}


@lru_cache(maxsize=512)
def _order(name: str, pp: int, micro_batches: int, v: int) -> tuple[tuple[int, int, int], ...]:
    """Every stage's program merged into one order in which each op comes after the op before it
    on its stage and after the op whose output it needs: (stage, kind index, position of that op
    in the order or -1). SpecError where no such order exists (the programs deadlock)."""
    entry = schedule_entry(name)
    programs = [entry.ops(k, pp, micro_batches, v) for k in range(pp)]
    chunks = [entry.stage_chunks(k, pp, v) for k in range(pp)]
    last, placed, position, total = pp * v - 1, {}, [0] * pp, sum(map(len, programs))
    waiting: list[tuple | None] = [None] * pp  # each stage's next op as (key, its input), once per op
    order: list[tuple[int, int, int]] = []
    while len(order) < total:
        progressed = False
        for k, program in enumerate(programs):
            while position[k] < len(program):
                if waiting[k] is None:
                    op = program[position[k]]
                    key = (op.kind, chunks[k][op.chunk], op.micro_batch)
                    waiting[k] = (key, _input_of(key, last))
                key, dep = waiting[k]
                if dep is not None and dep not in placed:
                    break
                placed[key] = len(order)
                order.append((k, KIND_INDEX[key[0]], -1 if dep is None else placed[dep]))
                position[k] += 1
                waiting[k] = None
                progressed = True
        if not progressed:
            raise SpecError("schedule", f"{name} deadlocks on pp({pp}) with micro_batches({micro_batches})")
    return tuple(order)


def _input_of(key: tuple, last: int) -> tuple | None:
    """The op whose output op ``key`` = (kind, global chunk, micro-batch) needs (None: the batch)."""
    kind, chunk, mb = key
    if kind == OpKind.FORWARD:
        return (OpKind.FORWARD, chunk - 1, mb) if chunk > 0 else None
    if kind == OpKind.BACKWARD:
        return (OpKind.BACKWARD, chunk + 1, mb) if chunk < last else (OpKind.FORWARD, chunk, mb)
    return (OpKind.BACKWARD, chunk, mb)
