"""Pipeline schedules: the order of forward ("F", mb) and backward ("B", mb) ops on each stage."""
from __future__ import annotations

from specs import Schedule

Op = tuple[str, int]


def gpipe(stage: int, pp: int, micro_batches: int) -> list[Op]:
    """All forwards, then all backwards (in the same micro-batch order)."""
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]


def one_f_one_b(stage: int, pp: int, micro_batches: int) -> list[Op]:
    """PipeDream-flush / Megatron 1F1B: pp-stage-1 warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards."""
    warmup = min(pp - stage - 1, micro_batches)
    ops: list[Op] = [("F", i) for i in range(warmup)]
    fwd, bwd = warmup, 0
    while fwd < micro_batches:
        ops.append(("F", fwd))
        fwd += 1
        ops.append(("B", bwd))
        bwd += 1
    ops.extend(("B", i) for i in range(bwd, micro_batches))
    return ops


SCHEDULES = {Schedule.GPIPE: gpipe, Schedule.ONE_F_ONE_B: one_f_one_b}


def schedule_ops(schedule: str, stage: int, pp: int, micro_batches: int) -> list[Op]:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return SCHEDULES[schedule](stage, pp, micro_batches)
