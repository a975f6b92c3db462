"""Pipeline schedules: the order of forward ("F", mb) and backward ("B", mb) ops on each stage."""
from __future__ import annotations

from specs import Schedule

Op = tuple[str, int, int]
"""(F or B, micro-batch, chunk position on the stage: 0 .. v-1)."""


def gpipe(stage: int, pp: int, micro_batches: int) -> list[Op]:
    """All forwards, then all backwards (in the same micro-batch order)."""
    return [("F", i, 0) for i in range(micro_batches)] + [("B", i, 0) for i in range(micro_batches)]


def interleaved_1f1b(stage: int, pp: int, micro_batches: int, virtual_stages: int) -> list[Op]:
    """Megatron's interleaved 1F1B: the k-th forward runs chunk (k // pp) % v of micro-batch
    (k // (pp v)) pp + k % pp (groups of pp micro-batches go through chunk 0, then chunk 1...);
    backwards walk the chunks in reverse; warm-up 2 (pp - stage - 1) + (v - 1) pp forwards,
    then one forward and one backward in turn, then the remaining backwards (m % pp == 0)."""
    v, total = virtual_stages, micro_batches * virtual_stages

    def unit(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // pp) % v
        return (k // (pp * v)) * pp + k % pp, (v - 1 - chunk) if backward else chunk

    warmup = min(2 * (pp - stage - 1) + (v - 1) * pp, total)
    ops: list[Op] = [("F", *unit(k, False)) for k in range(warmup)]
    for i in range(total - warmup):
        ops += [("F", *unit(warmup + i, False)), ("B", *unit(i, True))]
    ops += [("B", *unit(k, True)) for k in range(total - warmup, total)]
    return ops


def one_f_one_b(stage: int, pp: int, micro_batches: int) -> list[Op]:
    """PipeDream-flush / Megatron 1F1B: pp-stage-1 warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards."""
    warmup = min(pp - stage - 1, micro_batches)
    ops: list[Op] = [("F", i, 0) for i in range(warmup)]
    fwd, bwd = warmup, 0
    while fwd < micro_batches:
        ops.append(("F", fwd, 0))
        fwd += 1
        ops.append(("B", bwd, 0))
        bwd += 1
    ops.extend(("B", i, 0) for i in range(bwd, micro_batches))
    return ops


SCHEDULES = {Schedule.GPIPE: gpipe, Schedule.ONE_F_ONE_B: one_f_one_b}


def schedule_ops(schedule: str, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if virtual_stages > 1:
        return interleaved_1f1b(stage, pp, micro_batches, virtual_stages)
    return SCHEDULES[schedule](stage, pp, micro_batches)
