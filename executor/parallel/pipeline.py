"""Pipeline parallelism with torch.distributed.pipelining: one stage per rank, uneven layer
partitions as the plan says, GPipe or 1F1B."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from specs import Schedule

SCHEDULE_CLASSES = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B}


def apply_pp(stage_module: nn.Module, stage: int, pp: int, group: dist.ProcessGroup,
             device: torch.device, micro_batches: int, schedule: str,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """The schedule that runs ``stage_module`` as stage ``stage`` of ``pp`` (lane ``group``).

    Gradients are not rescaled by the schedule: the loss already carries 1/global_batch.
    """
    pipe_stage = PipelineStage(stage_module, stage, pp, device, group=group)
    return SCHEDULE_CLASSES[schedule](pipe_stage, n_microbatches=micro_batches, loss_fn=loss_fn,
                                      scale_grads=False)


def run_schedule(schedule, stage: int, pp: int, inputs: torch.Tensor, targets: torch.Tensor
                 ) -> list[torch.Tensor]:
    """One iteration; returns the per-micro-batch losses on the last stage (else [])."""
    losses: list[torch.Tensor] = []
    if stage == 0:
        schedule.step(inputs)
    elif stage == pp - 1:
        schedule.step(target=targets, losses=losses)
    else:
        schedule.step()
    return losses
